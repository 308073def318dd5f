-- Strict admission: a holder's held total in windows, raised or lowered atomically
-- (swin_core::settle_hold, written again here; the conformance suite runs both on the
-- same cases). KEYS: window hashes. ARGV: holder, the share of the room left a
-- hold may take beyond its need (swin_core::HOLD_SHARE), then per key: window_start,
-- previous window_start, the window before that (stale), ttl, limit, weight, need, want.
-- The holder's total is the field h:<window_start>:<holder>. A window that opens here
-- drops the stale window and every holder's total in it, as a push does, and sets the
-- hash's expiry (later writes to the window leave it). Returns per
-- key {current, previous, held} as strings (%.17g).
local function num(s) return tonumber(s or '0') or 0 end
local function drop_stale(hash, stale)
  redis.call('HDEL', hash, stale)
  local prefix = 'h:' .. stale .. ':'
  for _, f in ipairs(redis.call('HKEYS', hash)) do
    if string.sub(f, 1, #prefix) == prefix then redis.call('HDEL', hash, f) end
  end
end
local function fmt(x) return string.format('%.17g', x) end
local holder, share = ARGV[1], tonumber(ARGV[2])
if not share then return redis.error_reply('swin hold: malformed share') end
local out = {}
local a = 3
for k = 1, #KEYS do
  local start, prev, stale, ttl = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  local limit, weight = tonumber(ARGV[a + 4]), tonumber(ARGV[a + 5])
  local need, want = tonumber(ARGV[a + 6]), tonumber(ARGV[a + 7])
  a = a + 8
  if not (limit and weight and need and want) then
    return redis.error_reply('swin hold: malformed arguments')
  end
  local field = 'h:' .. start .. ':' .. holder
  local got = redis.call('HMGET', KEYS[k], start, prev, field, stale)
  local stored = got[1]
  local current = num(stored)
  local previous = num(got[2])
  local held = math.max(num(got[3]), 0)
  local new_current, new_held = current, held
  if want < held then
    local back = math.min(held - math.max(want, 0), math.max(current, 0))
    new_current, new_held = current - back, held - back
  elseif need > held then
    local room = limit - current - previous * weight
    local n = need - held
    if n <= room then
      local extra = math.max(want - held - n, 0)
      local grant = n + math.floor(math.min(extra, math.max((room - n) * share, 0)))
      new_current, new_held = current + grant, held + grant
    end
  end
  if new_current ~= current or new_held ~= held then
    redis.call('HSET', KEYS[k], start, fmt(new_current), field, fmt(new_held))
    if stored == false then
      if got[4] ~= false then drop_stale(KEYS[k], stale) end
      redis.call('EXPIRE', KEYS[k], ttl)
    end
  end
  out[#out + 1] = {fmt(new_current), fmt(previous), fmt(new_held)}
end
return out
