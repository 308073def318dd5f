-- One acquire of a key's concurrency leases.
-- KEYS: the key's lease hash (lease -> "count:lapse", lapse in Unix ms), the lease's
-- end mark (see lease_change.lua: granted, the lease is live again and the mark goes).
-- ARGV: lease, count, limit, lapse, now, the deadline in Unix ms (past it by this
-- server's clock nothing changes and the answer is {-1}: its caller stopped waiting).
-- Lapsed leases go; the key's live slots (the lease's own not counted, as a repeated
-- acquire replaces it) and the new count are checked against the limit. Answers
-- {granted, in flight after, earliest lapse or -1}.
local t = redis.call('TIME')
if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > tonumber(ARGV[6]) then
    return {-1}
end
local now = tonumber(ARGV[5])
local fields = redis.call('HGETALL', KEYS[1])
local in_flight, earliest = 0, -1
for i = 1, #fields, 2 do
    local count, lapse = string.match(fields[i + 1], '^(%d+):(%-?%d+)$')
    count, lapse = tonumber(count), tonumber(lapse)
    if lapse == nil or lapse <= now then
        redis.call('HDEL', KEYS[1], fields[i])
    elseif fields[i] ~= ARGV[1] then
        in_flight = in_flight + count
        if earliest < 0 or lapse < earliest then
            earliest = lapse
        end
    end
end
local count, limit, lapse = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
if in_flight + count > limit then
    return {0, in_flight, earliest}
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2] .. ':' .. ARGV[4])
redis.call('DEL', KEYS[2])
if earliest < 0 or lapse < earliest then
    earliest = lapse
end
-- the hash outlives its last lease by a minute, then goes by itself
local ttl = redis.call('PTTL', KEYS[1])
if ttl < lapse - now + 60000 then
    redis.call('PEXPIRE', KEYS[1], lapse - now + 60000)
end
return {1, in_flight + count, earliest}
