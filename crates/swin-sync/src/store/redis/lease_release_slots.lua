-- Ends up to ARGV[3] slots of a key's live leases whose ids begin with ARGV[1], the
-- earliest to lapse first (ties by id); a lease of more slots than are left to end gives
-- up that many and keeps the rest. Lapsed leases go.
-- KEYS: the key's lease hash. ARGV: prefix, now, count, the deadline in Unix ms.
-- Answers the slots ended, or -1 (nothing changed) when this server's clock is past the
-- deadline: its caller stopped waiting.
local t = redis.call('TIME')
if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > tonumber(ARGV[4]) then
    return -1
end
local prefix, now, left = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local fields = redis.call('HGETALL', KEYS[1])
local live = {}
for i = 1, #fields, 2 do
    local count, lapse = string.match(fields[i + 1], '^(%d+):(%-?%d+)$')
    count, lapse = tonumber(count), tonumber(lapse)
    if lapse == nil or lapse <= now then
        redis.call('HDEL', KEYS[1], fields[i])
    elseif string.sub(fields[i], 1, #prefix) == prefix then
        live[#live + 1] = {fields[i], count, lapse}
    end
end
table.sort(live, function(a, b)
    if a[3] ~= b[3] then
        return a[3] < b[3]
    end
    return a[1] < b[1]
end)
local freed = 0
for _, l in ipairs(live) do
    if left == 0 then
        break
    end
    if l[2] <= left then
        redis.call('HDEL', KEYS[1], l[1])
        left = left - l[2]
        freed = freed + l[2]
    else
        redis.call('HSET', KEYS[1], l[1], (l[2] - left) .. ':' .. l[3])
        freed = freed + left
        left = 0
    end
end
return freed
