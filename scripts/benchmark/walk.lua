-- wrk script of the benchmark: walks a fixed list of requests, one per line: "path" or
-- "path<TAB>first-last" (a byte range). Arguments: the list's file, the number of wrk threads, and
-- optionally a token sent as X-Auth-Token with every request.
-- Every thread walks the same list from its own starting point; all requests are built up front.
local list, n, i = {}, 0, 0
local count = 0
function setup(thread)
  thread:set("id", count)
  count = count + 1
end
function init(args)
  local token = args[3]
  for line in io.lines(args[1]) do
    local path, range = line:match("^([^\t]*)\t?(.*)$")
    local headers = {}
    if range ~= "" then headers["Range"] = "bytes=" .. range end
    if token and token ~= "" then headers["X-Auth-Token"] = token end
    n = n + 1
    list[n] = wrk.format("GET", path, headers)
  end
  i = math.floor(id * n / tonumber(args[2]))
end
function request()
  i = i % n + 1
  return list[i]
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'BENCH_JSON {"requests": %d, "bytes": %d, "duration_us": %d, "connect": %d, "read": %d, ' ..
    '"write": %d, "status": %d, "timeout": %d, "p50_us": %d, "p90_us": %d, "p99_us": %d, "max_us": %d}\n',
    summary.requests, summary.bytes, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
