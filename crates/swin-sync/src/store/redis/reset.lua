for k = 1, #KEYS do
  for _, f in ipairs(redis.call('HKEYS', KEYS[k])) do
    if string.sub(f, 1, 2) ~= 'n:' then redis.call('HDEL', KEYS[k], f) end
  end
end
return 0
