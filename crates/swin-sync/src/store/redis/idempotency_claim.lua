-- A claim of an idempotency record (see `store::idempotency`).
-- KEYS: the record (a string), the namespace's index (a sorted set: the records' keys
-- by lapse time), and, for a claim with a client, the client's index (the same, of the
-- records it made); all under the namespace's hash tag.
-- ARGV: the record's key in the index, fingerprint (32 bytes), token, held_until,
-- expires_at, now, max_records, the client ('' for none), its max_records.
-- A record is kind .. fingerprint .. expires_at .. '|' .. rest: kind 'H' while its
-- request runs (rest: held_until .. ':' .. token .. ':' .. the client it is counted
-- for), 'A' once answered (rest: the answer). It also expires by itself, a little after
-- expires_at.
-- Answers {0} (the caller's now), {1, fingerprint} (in flight), {2, fingerprint,
-- answer} (answered), {3} (the namespace is full) or {4} (the client holds its share):
-- nothing written for 1 to 4.
local now = tonumber(ARGV[6])
local v = redis.call('GET', KEYS[1])
-- the client a record taken over stays counted for (nil: a new record)
local owner = nil
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
        -- held no longer (its holder went away): taken over, counted already
        owner = string.match(rest, '^%-?%d+:%-?%d+:(.*)$') or ''
    end
    -- lapsed: its index entries lapsed with it, so it is claimed as a new record
end
if owner == nil then
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', ARGV[6])
    if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[7]) then
        return {3}
    end
    owner = ARGV[8]
    if KEYS[3] then
        redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', ARGV[6])
        if redis.call('ZCARD', KEYS[3]) >= tonumber(ARGV[9]) then
            return {4}
        end
    end
end
local life = tonumber(ARGV[5]) - now + 1000
redis.call('SET', KEYS[1], 'H' .. ARGV[2] .. ARGV[5] .. '|' .. ARGV[4] .. ':' .. ARGV[3] .. ':' .. owner, 'PX', life)
redis.call('ZADD', KEYS[2], ARGV[5], ARGV[1])
-- the indexes outlive their last record, then go by themselves
local function outlive(index)
    if redis.call('PTTL', index) < life then
        redis.call('PEXPIRE', index, life)
    end
end
outlive(KEYS[2])
if KEYS[3] and owner == ARGV[8] then
    redis.call('ZADD', KEYS[3], ARGV[5], ARGV[1])
    outlive(KEYS[3])
end
return {0}
