-- Releases (ARGV[3] == "") or renews (ARGV[3]: the new lapse) a live lease.
-- KEYS: the key's lease hash, the lease's end mark (a string: the operation id of the
-- release that ended it, expiring by itself).
-- ARGV: lease, now, new lapse or "", the deadline in Unix ms, a release's operation id,
-- how long an end's mark is kept in ms.
-- Answers 1 when the lease was live (a release: ended now, or by an earlier attempt of
-- the same operation, as its mark says), 2 when another release ended it (a release
-- only), 0 when unknown, released or lapsed, -1 (nothing changed) when this server's
-- clock is past the deadline: its caller stopped waiting.
local t = redis.call('TIME')
if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > tonumber(ARGV[4]) then
    return -1
end
local release = ARGV[3] == ''
local v = redis.call('HGET', KEYS[1], ARGV[1])
if not v then
    if release then
        local by = redis.call('GET', KEYS[2])
        if by then
            return by == ARGV[5] and 1 or 2
        end
    end
    return 0
end
local count, lapse = string.match(v, '^(%d+):(%-?%d+)$')
if lapse == nil or tonumber(lapse) <= tonumber(ARGV[2]) then
    redis.call('HDEL', KEYS[1], ARGV[1])
    return 0
end
if release then
    redis.call('HDEL', KEYS[1], ARGV[1])
    redis.call('SET', KEYS[2], ARGV[5], 'PX', ARGV[6])
    return 1
end
redis.call('HSET', KEYS[1], ARGV[1], count .. ':' .. ARGV[3])
local ttl = redis.call('PTTL', KEYS[1])
local want = tonumber(ARGV[3]) - tonumber(ARGV[2]) + 60000
if ttl < want then
    redis.call('PEXPIRE', KEYS[1], want)
end
return 1
