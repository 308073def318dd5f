-- Ends a claim of an idempotency record (see `store::idempotency` and the claim's
-- script for the record's layout): keeps its answer, or releases it (the record goes,
-- from the namespace's index and from the index of the client it is counted for), only
-- while the claim is the caller's and the record has not lapsed.
-- KEYS: the record, the namespace's index.
-- ARGV: the record's key in the index, token, "keep" or "release", the answer (keep),
-- now (keep).
-- Answers 1 when done, 0 when the claim is not held by the token.
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 1) ~= 'H' then
    return 0
end
local bar = string.find(v, '|', 34, true)
local rest = string.sub(v, bar + 1)
local token, client = string.match(rest, '^%-?%d+:(%-?%d+):?(.*)$')
if token ~= ARGV[2] then
    return 0
end
if ARGV[3] == 'keep' then
    if tonumber(string.sub(v, 34, bar - 1)) <= tonumber(ARGV[5]) then
        return 0
    end
    redis.call('SET', KEYS[1], 'A' .. string.sub(v, 2, bar) .. ARGV[4], 'KEEPTTL')
else
    redis.call('DEL', KEYS[1])
    redis.call('ZREM', KEYS[2], ARGV[1])
    if client ~= '' then
        -- the client's index is named after the namespace's, under its hash tag (the
        -- same slot): the caller of a release does not know whose the record is
        redis.call('ZREM', KEYS[2] .. 'c:' .. client, ARGV[1])
    end
end
return 1
