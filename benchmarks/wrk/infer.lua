-- wrk script: POST the KServe v2 infer body of moe_problem_sizes reading a resident buffer to the
-- URL given to wrk (/v2/models/<name or id>/infer). Arguments after "--":
--   1: output mode, "inline" (default: the counts come back in the JSON response) or "buffer"
--      (stored on the server under a name of this thread's own, overwritten each run)
--   2: the input buffer (default bench_ids)
--   3: buffer mode: names per thread, cycled (default 1; load.py gives 2 x connections per thread,
--      so runs in flight rarely wait for one another on a name)
-- SEGFUSE_TOKEN, when set, is sent as a bearer token.
--   wrk -t1 -c1 -d5s -s benchmarks/wrk/infer.lua http://127.0.0.1:8000/v2/models/moe_problem_sizes/infer
dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "report.lua")

function init(args)
  local mode = args[1] or "inline"
  local ids = args[2] or "bench_ids"
  wrk.method = "POST"
  wrk.headers["Content-Type"] = "application/json"
  local token = os.getenv("SEGFUSE_TOKEN")
  if token and token ~= "" then
    wrk.headers["Authorization"] = "Bearer " .. token
  end
  local input = '{"inputs":[{"name":"topk_ids","parameters":{"buffer":"' .. ids .. '"}}]'
  if mode == "inline" then
    wrk.body = input .. "}"
  elseif mode == "buffer" then
    local pool, reqs, next_req = tonumber(args[3]) or 1, {}, 0
    for k = 1, pool do
      local body = input .. ',"outputs":[{"name":"counts","parameters":{"buffer":"bench_out_t'
        .. tid .. "_" .. k .. '","overwrite":true}}]}'
      reqs[k] = wrk.format(nil, nil, nil, body)
    end
    -- a global request() makes wrk ask for every request (prebuilt strings, cycled)
    request = function()
      next_req = next_req % pool + 1
      return reqs[next_req]
    end
  else
    error("infer.lua: output mode must be inline or buffer, not " .. mode)
  end
end
