-- Reservations of a cost (see store::reservations): one hash per reservation, fields
-- `keys` (a JSON array), `total`, `lapse` (Unix ms, store time), `client` (who it is
-- counted for, '' none), `counted` (where the
-- total was counted: `<ms>:<amount>;` per take), `ops` (the latest extends' operation
-- ids, `<op>;` each: an id's first 16 digits are the extend's identity, the rest who
-- applied it) and `ended` (`<op>:<cost>` of the commit that ended it), and the
-- namespace's index of open ones (a sorted set: id → lapse), in one slot. Every
-- operation can be applied again without changing anything more.
-- KEYS: the reservation's hash, the namespace's index, and for an opening with a client,
-- the client's index (the namespace's index's name .. 'c:' .. client: the same slot; a
-- commit, which does not know the client, names it from the record's `client`).
-- ARGV[1]: the operation, ARGV[2]: the reservation's id, then:
--   open   keys, total, lapse, now, counted, client, max_open, max_client (a cap
--          of -1: not checked)
--          → {code, open, client_open}: code 1 open with these keys (now, or already),
--          0 another live record holds the id, 2 the namespace holds max_open open, 3
--          the client holds max_client; the counts before it (-1: not counted)
--   extend op, more, now, deadline, piece, most, ops_most
--          → {keys, total, lapse, counted, ended, ops} after it, also when `ops`
--          holds `op`'s identity already (nothing changes again); {} not open and
--          the identity not in it
--   take   op, cost, now, deadline, kept    → {keys, total, lapse, counted, ended, ops}:
--          ended now by `op`, or earlier by whichever `ended` names; {} no record
-- extend and take answer -1 (nothing changed) when this server's clock is past the
-- deadline (Unix ms): their caller stopped waiting.
local op, id = ARGV[1], ARGV[2]
local function past(deadline)
    local t = redis.call('TIME')
    return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) > tonumber(deadline)
end
-- the record unless lapsed: keys, total, lapse, counted, ended, ops
local function live(now)
    local v = redis.call('HMGET', KEYS[1], 'keys', 'total', 'lapse', 'counted', 'ended', 'ops')
    if not v[1] or not v[2] or not v[3] or tonumber(v[3]) <= tonumber(now) then
        return nil
    end
    -- a record written before `counted` was kept: counted at times unknown
    v[4] = v[4] or ''
    v[5] = v[5] or ''
    v[6] = v[6] or ''
    return v
end
local function answer(v)
    return {v[1], v[2], v[3], v[4], v[5], v[6]}
end
-- keeps an index at least as long as `lapse` needs it
local function outlive(index, lapse, now)
    local want = tonumber(lapse) - tonumber(now) + 60000
    if redis.call('PTTL', index) < want then
        redis.call('PEXPIRE', index, want)
    end
end
-- the record out of its client's index (a record without a client is in none)
local function unindex_client()
    local client = redis.call('HGET', KEYS[1], 'client')
    if client and client ~= '' then
        redis.call('ZREM', KEYS[2] .. 'c:' .. client, id)
    end
end
if op == 'open' then
    local keys, total, lapse, now, counted = ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
    local v = live(now)
    if v then
        -- an opening retried after its reply was lost finds its own record
        if v[5] == '' and v[1] == keys then
            return {1, -1, -1}
        end
        return {0, -1, -1}
    end
    local client, max_open, max_client = ARGV[8], tonumber(ARGV[9]), tonumber(ARGV[10])
    redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
    local open, mine = -1, -1
    if max_open >= 0 then
        open = redis.call('ZCARD', KEYS[2])
        if open >= max_open then
            return {2, open, mine}
        end
    end
    if KEYS[3] then
        redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
        if max_client >= 0 then
            mine = redis.call('ZCARD', KEYS[3])
            if mine >= max_client then
                return {3, open, mine}
            end
        end
    end
    unindex_client()
    redis.call('DEL', KEYS[1])
    redis.call('HSET', KEYS[1], 'keys', keys, 'total', total, 'lapse', lapse, 'counted', counted,
        'client', client)
    redis.call('PEXPIRE', KEYS[1], math.max(tonumber(lapse) - tonumber(now), 0) + 60000)
    redis.call('ZADD', KEYS[2], lapse, id)
    outlive(KEYS[2], lapse, now)
    if KEYS[3] then
        redis.call('ZADD', KEYS[3], lapse, id)
        outlive(KEYS[3], lapse, now)
    end
    return {1, open, mine}
elseif op == 'extend' then
    local xop, more, now, deadline = ARGV[3], ARGV[4], ARGV[5], ARGV[6]
    local piece, most, ops_most = ARGV[7], ARGV[8], tonumber(ARGV[9])
    local v = live(now)
    local mark = xop .. ';'
    -- the extend's identity: the id's first 16 digits
    if v and string.find(v[6], string.sub(xop, 1, 16), 1, true) then
        return answer(v)
    end
    if past(deadline) then
        return -1
    end
    if not v or v[5] ~= '' then
        return {}
    end
    local total = redis.call('HINCRBYFLOAT', KEYS[1], 'total', more)
    local counted = v[4]
    if #counted + #piece <= tonumber(most) then
        counted = counted .. piece
    end
    local ops = v[6]
    if #ops >= ops_most then
        ops = string.sub(ops, #mark + 1)
    end
    redis.call('HSET', KEYS[1], 'counted', counted, 'ops', ops .. mark)
    v[2], v[4], v[6] = total, counted, ops .. mark
    return answer(v)
elseif op == 'take' then
    local cop, cost, now, deadline, kept = ARGV[3], ARGV[4], ARGV[5], ARGV[6], ARGV[7]
    local v = live(now)
    if v and v[5] ~= '' then
        return answer(v)
    end
    if past(deadline) then
        return -1
    end
    if not v then
        unindex_client()
        redis.call('DEL', KEYS[1])
        redis.call('ZREM', KEYS[2], id)
        return {}
    end
    -- ended, and kept a while: a commit retried learns what this one did
    v[5] = cop .. ':' .. cost
    local lapse = math.max(tonumber(v[3]), tonumber(kept))
    v[3] = string.format('%.0f', lapse)
    redis.call('HSET', KEYS[1], 'ended', v[5], 'lapse', v[3])
    redis.call('PEXPIRE', KEYS[1], lapse - tonumber(now) + 60000)
    redis.call('ZREM', KEYS[2], id)
    unindex_client()
    return answer(v)
end
return redis.error_reply('reservation.lua: unknown operation ' .. tostring(op))
