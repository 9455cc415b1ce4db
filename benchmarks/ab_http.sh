#!/bin/bash
# A/B of HTTP servers on one machine (GPU, after `source benchmarks/device_env.sh`; granian from .whl):
# segfuse serve (uvicorn) against uvicorn with one write per response and granian, alternating
# (benchmarks/serve_alternatives.py; results in benchmarks/README.md, "The H200 host, second session")
P=8600
for mode in uvicorn coalesce granian uvicorn coalesce granian; do
  P=$((P+1))
  case $mode in
    uvicorn) L=(python3 -c "import sys; from segfuse.cli import main; sys.exit(main())" serve --backend cupy --port $P --max-queued-runs 4096 --log-level warning) ;;
    coalesce) L=(python3 benchmarks/serve_alternatives.py coalesce $P) ;;
    granian) L=(python3 benchmarks/serve_alternatives.py granian $P) ;;
  esac
  SEGFUSE_BACKEND=cupy SEGFUSE_MAX_QUEUED_RUNS=4096 "${L[@]}" & SP=$!
  for i in $(seq 200); do curl -sf localhost:$P/v2/health/ready >/dev/null && break; sleep 0.3; done
  echo "=== $mode"
  python3 benchmarks/load.py --url http://127.0.0.1:$P --only infer,health --client wrk --concurrency 1,32 --duration 4 --samples 8 --out /tmp/ab 2>&1 | grep -E "^\| wrk \| (1|32) \|"
  kill $SP; wait $SP 2>/dev/null
done
