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
-- one HSET of what changed and the record (a diff of 0 only reads: a sync sends the
-- windows it needs read of a pushed key so), and, when a window opens, EXPIRE and the
-- stale window's removal if it is there: a synchronous hit on a fresh key costs three
-- calls. Two passes, the reads then the writes, with no list per window: the script's
-- own work was about as much as its calls (BENCHMARKS.md, "The store's work per synced
-- key").
-- A count that is a whole number below 1e14 goes to HSET and back as a Lua number:
-- Redis writes it as the integer and answers it as one, with no format here.
local call, tonumber, format, floor = redis.call, tonumber, string.format, math.floor
-- finite: x - x is 0 for every number but NaN and the infinities
local function finite(x) return x ~= nil and x - x == 0 end
local seq = tonumber(ARGV[2])
if not finite(seq) then return redis.error_reply('swin push: seq is not a number') end
local bound = tonumber(ARGV[3])
if not finite(bound) then return redis.error_reply('swin push: bound is not a number') end
local nkeys = #KEYS
local a = 4
for k = 1, nkeys do
  local n = tonumber(ARGV[a + 2])
  if not (finite(tonumber(ARGV[a])) and finite(n)) then
    return redis.error_reply('swin push: malformed arguments')
  end
  a = a + 3 + 2 * n
end
if a - 1 ~= #ARGV then return redis.error_reply('swin push: argument count') end
-- first pass: each hash's windows, its stale window and the node's record
local node, gots = ARGV[1], {}
a = 4
for k = 1, nkeys do
  local n = tonumber(ARGV[a + 2])
  if n == 1 then
    gots[k] = call('HMGET', KEYS[k], ARGV[a + 3], ARGV[a + 1], node)
  elseif n == 2 then
    gots[k] = call('HMGET', KEYS[k], ARGV[a + 3], ARGV[a + 5], ARGV[a + 1], node)
  else
    local f = {}
    for i = 1, n do f[i] = ARGV[a + 1 + 2 * i] end
    f[n + 1] = ARGV[a + 1]
    f[n + 2] = node
    gots[k] = call('HMGET', KEYS[k], unpack(f))
  end
  a = a + 3 + 2 * n
end
-- second pass: each window's answer ('!' and the reason for a refused one) and the
-- hash's one write, with the node's record when the push has a seq (a hash it only
-- read or refused needs none: a retry changes nothing)
local vals, p = {}, 0
a = 4
for k = 1, nkeys do
  local key, ttl, stale, n = KEYS[k], ARGV[a], ARGV[a + 1], tonumber(ARGV[a + 2])
  local got = gots[k]
  -- a record that is not a number (written by hand) counts as none: refusing it would
  -- hold back every push to this hash for good
  local last = tonumber(got[n + 2] or '-1')
  local apply = seq < 0 or not finite(last) or seq > last
  local opened, writes, w = false, nil, 0
  a = a + 3
  for i = 1, n do
    local stored = got[i]
    local cur, val = tonumber(stored or '0'), nil
    if not finite(cur) then
      val = '!stored count is not a finite number'
    elseif not apply then
      val = stored or '0'
    else
      local diff = tonumber(ARGV[a + 1])
      if diff == 0 and cur >= 0 then
        val = stored or '0'
      elseif not finite(diff) then
        val = '!diff is not a finite number'
      else
        local sum = cur + diff
        if not finite(sum) then
          val = '!the sum would not be finite'
        elseif sum >= bound then
          val = '!the count would reach 2^53'
        else
          if sum < 0 then
            val = '0'
          elseif sum == floor(sum) and sum < 1e14 then
            val = sum
          else
            -- %.17g round-trips every double; HINCRBYFLOAT would keep 17 digits after
            -- the point only (2^-20 came back as 9.5367431641e-7)
            val = format('%.17g', sum)
          end
          if not writes then writes = {} end
          writes[w + 1] = ARGV[a]
          writes[w + 2] = val
          w = w + 2
          if stored == false then opened = true end
        end
      end
    end
    p = p + 1
    vals[p] = val
    a = a + 2
  end
  if writes then
    if seq >= 0 then
      writes[w + 1] = node
      writes[w + 2] = ARGV[2]
    end
    call('HSET', key, unpack(writes))
    if opened then
      -- the window before the previous goes, with every holder's total in it (a
      -- holder's total is written with its window's count, so none outlives it)
      if got[n + 1] ~= false then
        call('HDEL', key, stale)
        local prefix = 'h:' .. stale .. ':'
        for _, f in ipairs(call('HKEYS', key)) do
          if string.sub(f, 1, #prefix) == prefix then call('HDEL', key, f) end
        end
      end
      -- the hash outlives its newest window by two: set when a window opens
      call('EXPIRE', key, ttl)
    end
  end
end
return vals
