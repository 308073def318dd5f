-- wrk script for scripts/bench modes: POSTs to WRK_PATH with WRK_BODY, where each "%s"
-- is one of WRK_KEYS keys (k0 … k{N-1}) picked uniformly at random per request. The
-- requests are formatted once, in init, so the load generator's own cost per request is
-- a table lookup, the same for every target.
local path = os.getenv("WRK_PATH") or "/v1/namespaces/api/keys/%s/hit"
local body = os.getenv("WRK_BODY")
local n = tonumber(os.getenv("WRK_KEYS") or "10000")
local reqs = {}

function init(args)
  local headers = {}
  if body then headers["Content-Type"] = "application/json" end
  for i = 1, n do
    local key = "k" .. (i - 1)
    local b = body and string.gsub(body, "%%s", key) or nil
    reqs[i] = wrk.format("POST", (string.gsub(path, "%%s", key)), headers, b)
  end
  math.randomseed(os.time())
end

function request()
  return reqs[math.random(n)]
end
