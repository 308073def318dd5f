-- Removes one key's runtime limits and logs the change; 0 when it had none.
-- KEYS: as limit_put.lua. ARGV: key, log length kept, the deadline in Unix ms (past it
-- by this server's clock: nothing removed, -1).
local t = redis.call('TIME')
if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > tonumber(ARGV[3]) then
    return -1
end
if redis.call('HDEL', KEYS[1], ARGV[1]) == 0 then
    return 0
end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[2], '*', 'k', ARGV[1])
return 1
