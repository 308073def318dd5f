-- A claim of an idempotency record (see `store::idempotency`).
-- KEYS: the record (a string), the namespace's index (a sorted set: the records' keys
-- by lapse time; both under the namespace's hash tag).
-- ARGV: the record's key in the index, fingerprint (32 bytes), token, held_until,
-- expires_at, now, max_records.
-- A record is 'H' .. fingerprint .. held_until .. ':' .. token while its request runs,
-- 'A' .. fingerprint .. answer once answered; it expires by itself at expires_at.
-- Answers {0} (the caller's now), {1, fingerprint} (in flight), {2, fingerprint,
-- answer} (answered) or {3} (the namespace is full: nothing written).
local now = tonumber(ARGV[6])
local v = redis.call('GET', KEYS[1])
if v then
    local kind, fingerprint = string.sub(v, 1, 1), string.sub(v, 2, 33)
    if kind == 'A' then
        return {2, fingerprint, string.sub(v, 34)}
    end
    local held = tonumber(string.match(string.sub(v, 34), '^(%-?%d+):'))
    if held ~= nil and held > now then
        return {1, fingerprint}
    end
    -- held no longer (its holder went away): taken over, counted already
else
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[6])
    if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[7]) then
        return {3}
    end
end
local life = tonumber(ARGV[5]) - now
redis.call('SET', KEYS[1], 'H' .. ARGV[2] .. ARGV[4] .. ':' .. ARGV[3], 'PX', life)
redis.call('ZADD', KEYS[2], ARGV[5], ARGV[1])
-- the index outlives its last record, then goes by itself
if redis.call('PTTL', KEYS[2]) < life then
    redis.call('PEXPIRE', KEYS[2], life)
end
return {0}
