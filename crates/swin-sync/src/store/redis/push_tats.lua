-- KEYS: bucket hashes of one cluster slot; KEYS[1] also holds the node's last applied seq.
-- ARGV: node field, seq (-1: no dedupe), now (ns), then one advance (ns) per key.
-- Returns each bucket's TAT as a string, in order.
local seq = tonumber(ARGV[2])
local apply = true
if seq >= 0 then
  -- a record that is not a number (written by hand) counts as none
  local last = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '-1')
  apply = last == nil or last ~= last or seq > last
end
local now = ARGV[3]
local out = {}
for k = 1, #KEYS do
  if apply then
    local tat = redis.call('HGET', KEYS[k], 'tat')
    if (not tat) or tonumber(tat) < tonumber(now) then
      redis.call('HSET', KEYS[k], 'tat', now)
    end
    redis.call('HINCRBY', KEYS[k], 'tat', ARGV[3 + k])
    tat = redis.call('HGET', KEYS[k], 'tat')
    local ms = math.max(0, (tonumber(tat) - tonumber(now)) / 1e6)
    redis.call('PEXPIRE', KEYS[k], math.floor(ms) + 3600000)
    out[#out + 1] = tat
  else
    out[#out + 1] = redis.call('HGET', KEYS[k], 'tat') or now
  end
end
if apply and seq >= 0 then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
return out
