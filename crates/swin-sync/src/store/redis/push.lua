-- KEYS: hashes of one cluster slot (on one server, of any slots: see slot_calls). Each
-- hash also holds, in the node's field, the seq of the node's last push that wrote to it:
-- a push is deduplicated per hash, so a retry finds its records however its hashes are
-- grouped into calls (on one server or a cluster, before or after a move).
-- ARGV: node field, seq (-1: no dedupe), the bound a count must stay below (2^53, where
-- a double stops counting every integer), then per key: ttl, stale window field, n, and
-- n pairs (window_start, diff). Returns per pushed window, in order, its new count, or
-- '!' and the reason when the window is refused (its stored count is not a number, the
-- sum would not be finite, or it would reach the bound: nodes that each stayed below it
-- may not pass it together): such a window is skipped, the others are applied.
-- Everything is read and checked before the first write, so a call that fails applies
-- nothing (Redis does not roll a script back).
-- Server work per hash: one HMGET (its windows, the stale one and the node's record),
-- one HSET of what changed and the record (a diff of 0 only reads), and, when a window
-- opens, EXPIRE and the stale window's removal if it is there: a synchronous hit on a
-- fresh key costs three calls.
local call, tonumber, format = redis.call, tonumber, string.format
-- finite: x - x is 0 for every number but NaN and the infinities
local function finite(x) return x ~= nil and x - x == 0 end
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
-- first pass: read and check. What each window does is kept in flat lists (a table per
-- window costs more than the Redis calls): its kind ('r' read, 's' set, '!' refused),
-- its answer (the count, or the reason) and where its field is in ARGV; per hash, whether
-- a window opens (then its stale window goes, if it is there).
local kinds, vals, fields, opens, stale_there = {}, {}, {}, {}, {}
local p = 0
a = 4
for k = 1, #KEYS do
  local n = tonumber(ARGV[a + 2])
  -- the hash's windows, its stale window, the node's record
  local got
  if n == 1 then
    got = call('HMGET', KEYS[k], ARGV[a + 3], ARGV[a + 1], ARGV[1])
  elseif n == 2 then
    got = call('HMGET', KEYS[k], ARGV[a + 3], ARGV[a + 5], ARGV[a + 1], ARGV[1])
  else
    local f = {}
    for i = 1, n do f[i] = ARGV[a + 1 + 2 * i] end
    f[n + 1] = ARGV[a + 1]
    f[n + 2] = ARGV[1]
    got = call('HMGET', KEYS[k], unpack(f))
  end
  stale_there[k] = got[n + 1] ~= false
  -- a record that is not a number (written by hand) counts as none: refusing it would
  -- hold back every push to this hash for good
  local last = tonumber(got[n + 2] or '-1')
  local apply = seq < 0 or not finite(last) or seq > last
  local opened = false
  a = a + 3
  for i = 1, n do
    local stored, diff = got[i], tonumber(ARGV[a + 1])
    local cur = tonumber(stored or '0')
    local kind, val = 's', nil
    if not finite(cur) then
      kind, val = '!', '!stored count is not a finite number'
    elseif not apply then
      kind, val = 'r', stored or '0'
    elseif not finite(diff) then
      kind, val = '!', '!diff is not a finite number'
    elseif not finite(cur + diff) then
      kind, val = '!', '!the sum would not be finite'
    elseif cur + diff >= bound then
      kind, val = '!', '!the count would reach 2^53'
    elseif diff == 0 and cur >= 0 then
      kind, val = 'r', stored or '0'
    elseif cur + diff < 0 then
      val = '0'
    else
      -- %.17g round-trips every double; HINCRBYFLOAT would keep 17 digits after the
      -- point only (2^-20 came back as 9.5367431641e-7)
      val = format('%.17g', cur + diff)
    end
    if kind == 's' and stored == false then opened = true end
    p = p + 1
    kinds[p], vals[p], fields[p] = kind, val, a
    a = a + 2
  end
  opens[k] = opened
end
-- second pass: write each hash's windows in one HSET, with the node's record when the
-- push has a seq (a hash it only read or refused needs none: a retry changes nothing)
a = 4
p = 0
for k = 1, #KEYS do
  local ttl, stale, n = ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2])
  a = a + 3 + 2 * n
  local writes = {}
  for i = 1, n do
    p = p + 1
    if kinds[p] == 's' then
      writes[#writes + 1] = ARGV[fields[p]]
      writes[#writes + 1] = vals[p]
    end
  end
  if #writes > 0 then
    if seq >= 0 then
      writes[#writes + 1] = ARGV[1]
      writes[#writes + 1] = ARGV[2]
    end
    call('HSET', KEYS[k], unpack(writes))
    if opens[k] then
      -- the window before the previous goes, with every holder's total in it (a
      -- holder's total is written with its window's count, so none outlives it)
      if stale_there[k] then
        call('HDEL', KEYS[k], stale)
        local prefix = 'h:' .. stale .. ':'
        for _, f in ipairs(call('HKEYS', KEYS[k])) do
          if string.sub(f, 1, #prefix) == prefix then call('HDEL', KEYS[k], f) end
        end
      end
      -- the hash outlives its newest window by two: set when a window opens
      call('EXPIRE', KEYS[k], ttl)
    end
  end
end
return vals
