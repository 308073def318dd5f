-- KEYS: hashes of one cluster slot (on one server, a push without a seq may mix slots:
-- see slot_calls); KEYS[1] also holds the node's last applied seq.
-- ARGV: node field, seq (-1: no dedupe), the bound a count must stay below (2^53, where
-- a double stops counting every integer), then per key: ttl, stale window field, n, and
-- n pairs (window_start, diff). Returns per pushed window, in order, its new count, or
-- '!' and the reason when the window is refused (its stored count is not a number, the
-- sum would not be finite, or it would reach the bound: nodes that each stayed below it
-- may not pass it together): such a window is skipped, the others are applied.
-- Everything is read and checked before the first write, so a call that fails applies
-- nothing (Redis does not roll a script back).
local function finite(x) return x ~= nil and x == x and x ~= math.huge and x ~= -math.huge end
local seq = tonumber(ARGV[2])
if not finite(seq) then return redis.error_reply('swin push: seq is not a number') end
local bound = tonumber(ARGV[3])
if not finite(bound) then return redis.error_reply('swin push: bound is not a number') end
local a = 4
for k = 1, #KEYS do
  local n = tonumber(ARGV[a + 2])
  if not (finite(tonumber(ARGV[a])) and finite(n)) then
    return redis.error_reply('swin push: malformed arguments')
  end
  a = a + 3 + 2 * n
end
if a - 1 ~= #ARGV then return redis.error_reply('swin push: argument count') end
local apply = true
if seq >= 0 then
  local last = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '-1')
  apply = seq > last
end
local out = {}
-- first pass: read and check; the plan says what each window does
local plan = {}
a = 4
for k = 1, #KEYS do
  local n = tonumber(ARGV[a + 2])
  a = a + 3
  for i = 1, n do
    local field, diff = ARGV[a], tonumber(ARGV[a + 1])
    local stored = redis.call('HGET', KEYS[k], field)
    local cur = tonumber(stored or '0')
    local step
    if not finite(cur) then
      step = {'refuse', '!stored count is not a finite number'}
    elseif not apply then
      step = {'read', stored or '0'}
    elseif not finite(diff) then
      step = {'refuse', '!diff is not a finite number'}
    elseif not finite(cur + diff) then
      step = {'refuse', '!the sum would not be finite'}
    elseif cur + diff >= bound then
      step = {'refuse', '!the count would reach 2^53'}
    elseif cur + diff < 0 then
      step = {'set', stored == false, '0'}
    else
      -- %.17g round-trips every double; HINCRBYFLOAT would keep 17 digits after the
      -- point only (2^-20 came back as 9.5367431641e-7)
      step = {'set', stored == false, string.format('%.17g', cur + diff)}
    end
    plan[#plan + 1] = step
    a = a + 2
  end
end
if not apply then
  for _, step in ipairs(plan) do out[#out + 1] = step[2] end
  return out
end
-- second pass: write
a = 4
local p = 0
for k = 1, #KEYS do
  local ttl, stale, n = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2])
  a = a + 3
  local opened, wrote = false, false
  for i = 1, n do
    p = p + 1
    local step = plan[p]
    if step[1] == 'refuse' then
      out[#out + 1] = step[2]
    else
      -- a window that just appeared: the one before the previous may still be there
      if step[2] then opened = true end
      wrote = true
      redis.call('HSET', KEYS[k], ARGV[a], step[3])
      out[#out + 1] = step[3]
    end
    a = a + 2
  end
  if wrote then
    if opened then
      -- the window before the previous goes, with every holder's total in it
      redis.call('HDEL', KEYS[k], stale)
      local prefix = 'h:' .. stale .. ':'
      for _, f in ipairs(redis.call('HKEYS', KEYS[k])) do
        if string.sub(f, 1, #prefix) == prefix then redis.call('HDEL', KEYS[k], f) end
      end
    end
    redis.call('EXPIRE', KEYS[k], ttl)
  end
end
if seq >= 0 then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
return out
