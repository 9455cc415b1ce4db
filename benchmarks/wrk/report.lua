-- Shared by infer.lua and health.lua (loaded with dofile): counts non-2xx responses per thread
-- and prints one JSON line, prefixed "SEGFUSE_WRK ", from wrk's done hook. Times in microseconds.
-- wrk itself counts only statuses above 399 (summary.errors.status); this counts every non-2xx.

local threads = {}

function setup(thread)
  thread:set("tid", #threads + 1)
  table.insert(threads, thread)
end

non_2xx = 0
first_bad = nil

function response(status, headers, body)
  if status < 200 or status > 299 then
    non_2xx = non_2xx + 1
    if first_bad == nil then
      first_bad = tostring(status) .. " " .. string.sub(body or "", 1, 160)
    end
  end
end

local function json_string(s)
  s = string.gsub(s, '[%c"\\]', function(c) return string.format("\\u%04x", string.byte(c)) end)
  return '"' .. s .. '"'
end

function done(summary, latency, requests)
  local bad, first = 0, nil
  for _, t in ipairs(threads) do
    bad = bad + (t:get("non_2xx") or 0)
    first = first or t:get("first_bad")
  end
  local e = summary.errors
  io.write(string.format(
    'SEGFUSE_WRK {"requests":%d,"duration_us":%d,"bytes":%d,"threads":%d,"non_2xx":%d,"first_bad":%s,'
      .. '"socket_errors":{"connect":%d,"read":%d,"write":%d,"timeout":%d},"status_over_399":%d,'
      .. '"latency_us":{"min":%d,"mean":%.1f,"stdev":%.1f,"p50":%d,"p90":%d,"p99":%d,"max":%d}}\n',
    summary.requests, summary.duration, summary.bytes, #threads, bad,
    first and json_string(first) or "null",
    e.connect, e.read, e.write, e.timeout, e.status,
    latency.min, latency.mean, latency.stdev,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
