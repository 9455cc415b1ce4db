-- wrk script: GET the URL given to wrk (load.py gives /v2/health/live), the server's own ceiling.
--   wrk -t1 -c1 -d5s -s benchmarks/wrk/health.lua http://127.0.0.1:8000/v2/health/live
dofile((debug.getinfo(1, "S").source:match("^@(.*/)") or "./") .. "report.lua")
