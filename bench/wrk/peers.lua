-- The request mix of scripts/bench-peers' HTTP part, one script for every server (wrk -s).
--
-- Environment:
--   BENCH_TARGET  tollgate | throttlecrab | healthz (tollgate's GET /healthz, the framework
--                 ceiling)
--   BENCH_KEYS    distinct keys (entities) the requests cycle over (default 1000)
--   BENCH_MIX     admit  : every request acquires 1 under a limit that never refuses
--                 refuse : every second request goes to a key whose limit is spent (a
--                          1-per-hour limit the warm-up used up), so about half are refused
--
-- Each wrk thread cycles over every key from its own starting offset; all requests are
-- built once in init(), so the script costs wrk nothing per request beyond returning a
-- string. done() prints one machine-readable WRK line (latencies in microseconds).
--
-- The two servers' bodies ask for the same thing:
--   tollgate     POST /v1/acquire {"entity","resource","amounts":{"rps":1},"commit":true}
--                resource "bench" = 1e9 per second, "tight" = 1 per hour (scripts/bench-peers
--                stores both limits first); a refusal is 429.
--   throttlecrab POST /throttle {"key","max_burst","count_per_period","period","quantity":1}
--                the limit travels in each request; a refusal is 200 {"allowed":false}.
--                The spent keys have max_burst 2, 1 per hour: 0.4.40 admits every request
--                of a key with max_burst 1, so 2 is its smallest limit that refuses (the
--                warm-up cycles over every key twice, spending both tokens).

local threads = {}
local thread_count = 0

function setup(thread)
  thread:set("tid", thread_count)
  thread_count = thread_count + 1
  table.insert(threads, thread)
end

local function tollgate_body(key, resource)
  return string.format(
    '{"entity":"%s","resource":"%s","amounts":{"rps":1},"commit":true}', key, resource)
end

local function throttlecrab_body(key, burst, count, period)
  return string.format(
    '{"key":"%s","max_burst":%d,"count_per_period":%d,"period":%d,"quantity":1}',
    key, burst, count, period)
end

function init(args)
  local target = os.getenv("BENCH_TARGET") or "tollgate"
  local keys = tonumber(os.getenv("BENCH_KEYS") or "1000")
  local mix = os.getenv("BENCH_MIX") or "admit"
  local headers = { ["Content-Type"] = "application/json" }
  reqs = {}
  if target == "healthz" then
    reqs[1] = wrk.format("GET", "/healthz")
  elseif target == "tollgate" or target == "throttlecrab" then
    for i = 0, keys - 1 do
      local key = "user-" .. i
      local open, spent
      if target == "tollgate" then
        open = wrk.format("POST", "/v1/acquire", headers, tollgate_body(key, "bench"))
        spent = wrk.format("POST", "/v1/acquire", headers, tollgate_body(key, "tight"))
      else
        open = wrk.format("POST", "/throttle", headers,
          throttlecrab_body("open:" .. key, 1000000000, 1000000000, 1))
        spent = wrk.format("POST", "/throttle", headers,
          throttlecrab_body("tight:" .. key, 2, 1, 3600))
      end
      table.insert(reqs, open)
      if mix == "refuse" then
        table.insert(reqs, spent)
      elseif mix ~= "admit" then
        error("BENCH_MIX must be admit or refuse, not " .. mix)
      end
    end
  else
    error("BENCH_TARGET must be tollgate, throttlecrab or healthz, not " .. target)
  end
  -- Threads start spread over the cycle (an even offset keeps the refuse mix alternating).
  local n = #reqs
  idx = (math.floor(n * tid / 8) * 2) % n
end

function request()
  idx = idx + 1
  if idx > #reqs then
    idx = 1
  end
  return reqs[idx]
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    "WRK requests=%d duration_us=%d p50_us=%d p99_us=%d max_us=%d " ..
    "errors_connect=%d errors_read=%d errors_write=%d errors_status=%d errors_timeout=%d\n",
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(99),
    latency.max, e.connect, e.read, e.write, e.status, e.timeout))
end
