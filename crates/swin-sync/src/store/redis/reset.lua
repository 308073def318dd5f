-- KEYS: one key's bucket hash and its window hashes (one hash tag: one cluster slot).
-- Deletes every field but the per-node push records (n:<node>), so a retried push that
-- was applied before the reset is still recognised and not applied again.
for k = 1, #KEYS do
  for _, f in ipairs(redis.call('HKEYS', KEYS[k])) do
    if string.sub(f, 1, 2) ~= 'n:' then redis.call('HDEL', KEYS[k], f) end
  end
end
return 0
