-- Sets one key's runtime limits and logs the change.
-- KEYS: the limits hash, the key index (sorted set, score 0: listed in key order), the
--       expiry index (sorted set by lapse time), the change stream; one hash tag.
-- ARGV: key, value (JSON), lapse time in Unix ms or "", now in Unix ms, log length kept,
--       the deadline in Unix ms: past it by this server's clock, nothing is written and
--       the answer is 'late' (the caller stopped waiting and said nothing changed).
-- A write also clears up to 100 limits that lapsed (Redis 7.0 cannot expire a field).
local t = redis.call('TIME')
if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > tonumber(ARGV[6]) then
    return 'late'
end
local lapsed = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', ARGV[4], 'LIMIT', 0, 100)
for _, k in ipairs(lapsed) do
    redis.call('HDEL', KEYS[1], k)
    redis.call('ZREM', KEYS[2], k)
    redis.call('ZREM', KEYS[3], k)
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], 0, ARGV[1])
if ARGV[3] == '' then
    redis.call('ZREM', KEYS[3], ARGV[1])
else
    redis.call('ZADD', KEYS[3], ARGV[3], ARGV[1])
end
return redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[5], '*', 'k', ARGV[1])
