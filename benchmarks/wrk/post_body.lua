-- wrk script: POST the bytes of a file (a prepared request body) to the URL given to wrk.
-- Arguments after "--": 1: the body's file; 2: its Content-Type (default application/json);
--   3: Inference-Header-Content-Length, the JSON header's length of a binary-tensor body (none if empty).
-- benchmarks/triton_side_by_side.py sends the same files to segfuse and to Triton.
--   wrk -t1 -c1 -d5s -s benchmarks/wrk/post_body.lua URL/v2/models/moe_problem_sizes/infer -- body.bin application/octet-stream 187
dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "report.lua")

function init(args)
  local f = assert(io.open(args[1], "rb"))
  wrk.body = f:read("*a")
  f:close()
  wrk.method = "POST"
  wrk.headers["Content-Type"] = args[2] or "application/json"
  if args[3] and args[3] ~= "" then
    wrk.headers["Inference-Header-Content-Length"] = args[3]
  end
end
