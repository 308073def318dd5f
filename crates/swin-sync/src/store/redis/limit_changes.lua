-- The keys whose runtime limits changed after a cursor (a stream id).
-- KEYS: the change stream. ARGV: the cursor ("": only the latest id), most entries.
-- Answers {complete, cursor, key...}: complete is 0 when entries after the cursor were
-- trimmed, or the stream is behind the cursor (the store lost it); the cursor is then
-- the latest id and no key is listed: the caller forgets what it holds.
local function parse(id)
    local ms, seq = string.match(id, '^(%d+)-(%d+)$')
    return tonumber(ms), tonumber(seq)
end
local function before(a, b)
    local am, as = parse(a)
    local bm, bs = parse(b)
    return am < bm or (am == bm and as < bs)
end
local last, trimmed = '0-0', '0-0'
if redis.call('EXISTS', KEYS[1]) == 1 then
    local info = redis.call('XINFO', 'STREAM', KEYS[1])
    for i = 1, #info, 2 do
        if info[i] == 'last-generated-id' then
            last = info[i + 1]
        elseif info[i] == 'max-deleted-entry-id' then
            trimmed = info[i + 1]
        end
    end
end
if ARGV[1] == '' then
    return {1, last}
end
if not parse(ARGV[1]) then
    return redis.error_reply('not a stream id: ' .. ARGV[1])
end
if before(ARGV[1], trimmed) or before(last, ARGV[1]) then
    return {0, last}
end
local out = {1, ARGV[1]}
local entries = redis.call('XRANGE', KEYS[1], '(' .. ARGV[1], '+', 'COUNT', ARGV[2])
for _, e in ipairs(entries) do
    out[2] = e[1]
    out[#out + 1] = e[2][2]
end
return out
