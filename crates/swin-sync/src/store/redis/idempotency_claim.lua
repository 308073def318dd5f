-- A claim of an idempotency record (see `store::idempotency`).
-- KEYS: the record (a string), the namespace's index (a sorted set: the records' keys
-- by lapse time; both under the namespace's hash tag).
-- ARGV: the record's key in the index, fingerprint (32 bytes), token, held_until,
-- expires_at, now, max_records.
-- A record is kind .. fingerprint .. expires_at .. '|' .. rest: kind 'H' while its
-- request runs (rest: held_until .. ':' .. token), 'A' once answered (rest: the
-- answer). It also expires by itself, a little after expires_at.
-- Answers {0} (the caller's now), {1, fingerprint} (in flight), {2, fingerprint,
-- answer} (answered) or {3} (the namespace is full: nothing written).
local now = tonumber(ARGV[6])
local v = redis.call('GET', KEYS[1])
local live = false
if v then
    local bar = string.find(v, '|', 34, true)
    local expires = tonumber(string.sub(v, 34, bar - 1))
    local kind, fingerprint, rest = string.sub(v, 1, 1), string.sub(v, 2, 33), string.sub(v, bar + 1)
    if expires > now then
        if kind == 'A' then
            return {2, fingerprint, rest}
        end
        local held = tonumber(string.match(rest, '^(%-?%d+):'))
        if held ~= nil and held > now then
            return {1, fingerprint}
        end
    end
    -- lapsed, or held no longer (its holder went away): taken over, counted already
    live = true
end
if not live then
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[6])
    if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[7]) then
        return {3}
    end
end
local life = tonumber(ARGV[5]) - now + 1000
redis.call('SET', KEYS[1], 'H' .. ARGV[2] .. ARGV[5] .. '|' .. ARGV[4] .. ':' .. ARGV[3], 'PX', life)
redis.call('ZADD', KEYS[2], ARGV[5], ARGV[1])
-- the index outlives its last record, then goes by itself
if redis.call('PTTL', KEYS[2]) < life then
    redis.call('PEXPIRE', KEYS[2], life)
end
return {0}
