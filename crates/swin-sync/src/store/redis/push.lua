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
-- Server work per hash: one HMGET (its windows and the stale one), one HSET of what
-- changed (a diff of 0 only reads), and, when a window opens, EXPIRE and the stale
-- window's removal if it is there: a synchronous hit on a fresh key costs three calls.
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
-- first pass: read and check; the plan says what each window does, and per hash whether
-- a window opens (then its stale window goes, if it is there)
local plan, opens, stale_there = {}, {}, {}
a = 4
for k = 1, #KEYS do
  local n = tonumber(ARGV[a + 2])
  local fields = {}
  for i = 1, n do fields[i] = ARGV[a + 1 + 2 * i] end
  fields[n + 1] = ARGV[a + 1]
  local got = redis.call('HMGET', KEYS[k], unpack(fields))
  stale_there[k] = got[n + 1] ~= false
  opens[k] = false
  a = a + 3
  for i = 1, n do
    local stored, diff = got[i], tonumber(ARGV[a + 1])
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
    elseif diff == 0 and cur >= 0 then
      step = {'read', stored or '0'}
    elseif cur + diff < 0 then
      step = {'set', '0'}
    else
      -- %.17g round-trips every double; HINCRBYFLOAT would keep 17 digits after the
      -- point only (2^-20 came back as 9.5367431641e-7)
      step = {'set', string.format('%.17g', cur + diff)}
    end
    if step[1] == 'set' and stored == false then opens[k] = true end
    plan[#plan + 1] = step
    a = a + 2
  end
end
local out = {}
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
  local writes = {}
  for i = 1, n do
    p = p + 1
    local step = plan[p]
    if step[1] == 'set' then
      writes[#writes + 1] = ARGV[a]
      writes[#writes + 1] = step[2]
    end
    out[#out + 1] = step[2]
    a = a + 2
  end
  if #writes > 0 then
    redis.call('HSET', KEYS[k], unpack(writes))
    if opens[k] then
      -- the window before the previous goes, with every holder's total in it (a
      -- holder's total is written with its window's count, so none outlives it)
      if stale_there[k] then
        redis.call('HDEL', KEYS[k], stale)
        local prefix = 'h:' .. stale .. ':'
        for _, f in ipairs(redis.call('HKEYS', KEYS[k])) do
          if string.sub(f, 1, #prefix) == prefix then redis.call('HDEL', KEYS[k], f) end
        end
      end
      -- the hash outlives its newest window by two: set when a window opens
      redis.call('EXPIRE', KEYS[k], ttl)
    end
  end
end
if seq >= 0 then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  -- the record may be the first field of its hash (its windows only read or refused)
  if redis.call('TTL', KEYS[1]) == -1 then redis.call('EXPIRE', KEYS[1], ARGV[4]) end
end
return out
