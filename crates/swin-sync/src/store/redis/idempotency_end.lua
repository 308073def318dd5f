-- Ends a claim of an idempotency record (see `store::idempotency`): keeps its answer, or
-- releases it (the record goes), only while the claim is the caller's.
-- KEYS: the record, the namespace's index.
-- ARGV: the record's key in the index, token, "keep" or "release", the answer (keep).
-- Answers 1 when done, 0 when the claim is not held by the token.
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 1) ~= 'H' then
    return 0
end
local token = string.match(string.sub(v, 34), ':(%-?%d+)$')
if token ~= ARGV[2] then
    return 0
end
if ARGV[3] == 'keep' then
    redis.call('SET', KEYS[1], 'A' .. string.sub(v, 2, 33) .. ARGV[4], 'KEEPTTL')
else
    redis.call('DEL', KEYS[1])
    redis.call('ZREM', KEYS[2], ARGV[1])
end
return 1
