-- wrk script: infer.lua's requests (same arguments 1-3), in the namespace given as argument 4
-- (sent as the Segfuse-Namespace header; segfuse serve-ray routes by it). benchmarks/load_ray.py.
--   wrk -t1 -c4 -d5s -s benchmarks/wrk/infer_ns.lua URL/v2/models/<id>/infer -- inline bench_ids 8 team-a
dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "infer.lua")

local infer_init = init

function init(args)
  local namespace = args[4]
  if namespace and namespace ~= "" then  -- before infer.lua's init: its prebuilt requests carry it too
    wrk.headers["Segfuse-Namespace"] = namespace
  end
  infer_init(args)
end
