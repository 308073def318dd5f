-- Reservations of a cost (see store::reservations): one hash per reservation, fields
-- `keys` (a JSON array), `total`, `lapse` (Unix ms, store time) and `counted` (where the
-- total was counted: `<ms>:<amount>;` per take), and the namespace's index of open ones
-- (a sorted set: id → lapse), in one slot.
-- KEYS: the reservation's hash, the namespace's index.
-- ARGV[1]: the operation, ARGV[2]: the reservation's id, then:
--   open   keys, total, lapse, now, counted → 1 recorded, 0 a live one holds the id
--   extend more, now, deadline, piece, most → {keys, total, lapse, counted} after it
--          (`piece` appended to `counted` while it stays within `most` bytes), {} not open
--   take   now, deadline                    → {keys, total, lapse, counted} ended, {} not open
-- extend and take answer -1 (nothing changed) when this server's clock is past the
-- deadline (Unix ms): their caller stopped waiting.
local op, id = ARGV[1], ARGV[2]
local function past(deadline)
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > tonumber(deadline)
end
local function live(now)
    local v = redis.call('HMGET', KEYS[1], 'keys', 'total', 'lapse', 'counted')
    if not v[1] or not v[2] or not v[3] or tonumber(v[3]) <= tonumber(now) then
        return nil
    end
    -- a record written before `counted` was kept: counted at times unknown
    v[4] = v[4] or ''
    return v
end
if op == 'open' then
    local keys, total, lapse, now, counted = ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
    if live(now) then
        return 0
    end
    redis.call('DEL', KEYS[1])
    redis.call('HSET', KEYS[1], 'keys', keys, 'total', total, 'lapse', lapse, 'counted', counted)
    redis.call('PEXPIRE', KEYS[1], math.max(tonumber(lapse) - tonumber(now), 0) + 60000)
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
    redis.call('ZADD', KEYS[2], lapse, id)
    local ttl = redis.call('PTTL', KEYS[2])
    local want = tonumber(lapse) - tonumber(now) + 60000
    if ttl < want then
        redis.call('PEXPIRE', KEYS[2], want)
    end
    return 1
elseif op == 'extend' then
    local more, now, deadline, piece, most = ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
    if past(deadline) then
        return -1
    end
    local v = live(now)
    if not v then
        return {}
    end
    local total = redis.call('HINCRBYFLOAT', KEYS[1], 'total', more)
    local counted = v[4]
    if #counted + #piece <= tonumber(most) then
        counted = counted .. piece
        redis.call('HSET', KEYS[1], 'counted', counted)
    end
    return {v[1], total, v[3], counted}
elseif op == 'take' then
    local now, deadline = ARGV[3], ARGV[4]
    if past(deadline) then
        return -1
    end
    local v = live(now)
    redis.call('DEL', KEYS[1])
    redis.call('ZREM', KEYS[2], id)
    if not v then
        return {}
    end
    return v
end
return redis.error_reply('reservation.lua: unknown operation ' .. tostring(op))
