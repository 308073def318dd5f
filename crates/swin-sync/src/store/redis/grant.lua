-- Strict admission of GCRA buckets (swin_core::settle_grant, written again here; the
-- conformance suite runs both on the same cases). KEYS: bucket hashes. ARGV: holder, the
-- share of the room left a grant may take beyond its need (swin_core::HOLD_SHARE),
-- then per key: seq, now (ns), now + horizon (ns), emission interval (ns), burst, need, want.
-- The holder's last grant is the field r:<holder> = "<seq>:<granted>"; a bucket
-- that is full when granted from drops every holder's record (their horizons have
-- passed). TATs are integer strings (HINCRBY keeps them exact; Lua's numbers are
-- doubles): differences are taken on the seconds and nanoseconds apart. Returns per key
-- {granted, tat or ''}.
local function split(s)
  if #s <= 9 then return 0, tonumber(s) end
  return tonumber(string.sub(s, 1, -10)), tonumber(string.sub(s, -9))
end
-- a - b, exact while the two are within about a hundred days of each other
local function diff(a, b)
  local ah, al = split(a)
  local bh, bl = split(b)
  return (ah - bh) * 1e9 + (al - bl)
end
local holder, share = ARGV[1], tonumber(ARGV[2])
if not share then return redis.error_reply('swin grant: malformed share') end
local field = 'r:' .. holder
local out = {}
local a = 3
for k = 1, #KEYS do
  local seq, now, latest = ARGV[a], ARGV[a + 1], ARGV[a + 2]
  local ei, burst = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])
  local need, want = tonumber(ARGV[a + 5]), tonumber(ARGV[a + 6])
  a = a + 7
  if not (ei and burst and need and want and tonumber(seq) and tonumber(now)) then
    return redis.error_reply('swin grant: malformed arguments')
  end
  ei = math.max(ei, 1)
  local tat = redis.call('HGET', KEYS[k], 'tat')
  local last = redis.call('HGET', KEYS[k], field)
  local granted = nil
  if last then
    local s, g = string.match(last, '^(-?%d+):(-?%d+)$')
    if s == seq then granted = tonumber(g) end
  end
  if granted == nil then
    local ahead = 0
    if tat then ahead = math.max(diff(tat, now), 0) end
    if ahead == 0 then
      -- a full bucket: every record's horizon has passed
      for _, f in ipairs(redis.call('HKEYS', KEYS[k])) do
        if string.sub(f, 1, 2) == 'r:' then redis.call('HDEL', KEYS[k], f) end
      end
    end
    local room = math.floor((ei * burst - ahead) / ei)
    granted = 0
    if need > 0 and need <= room then
      local extra = math.max(want - need, 0)
      granted = need + math.min(extra, math.max(math.floor((room - need) * share), 0))
      if (not tat) or diff(tat, latest) < 0 then
        redis.call('HSET', KEYS[k], 'tat', latest)
      end
      redis.call('HINCRBY', KEYS[k], 'tat', string.format('%.0f', granted * ei))
      tat = redis.call('HGET', KEYS[k], 'tat')
    end
    redis.call('HSET', KEYS[k], field, seq .. ':' .. string.format('%d', granted))
    local ms = 0
    if tat then ms = math.max(diff(tat, now), 0) / 1e6 end
    redis.call('PEXPIRE', KEYS[k], math.floor(ms) + 3600000)
  end
  out[#out + 1] = {string.format('%d', granted), tat or ''}
end
return out
