#!/bin/bash
# A/B on one machine (GPU, after `source benchmarks/device_env.sh`): warm runs staged into one batch
# per loop turn (the code) against run at once (benchmarks/serve_unstaged.py), alternating servers
P=8500
for mode in staged immediate staged immediate; do
  P=$((P+1))
  if [ $mode = staged ]; then L=(-c "import sys; from segfuse.cli import main; sys.exit(main())"); else L=(benchmarks/serve_unstaged.py); fi
  python3 "${L[@]}" serve --backend cupy --port $P --max-queued-runs 4096 --log-level warning & SP=$!
  for i in $(seq 100); do curl -sf localhost:$P/v2/health/ready >/dev/null && break; sleep 0.3; done
  echo "=== $mode"
  python3 benchmarks/load.py --url http://127.0.0.1:$P --only infer --client wrk --concurrency 1,32,64 --duration 4 --out /tmp/ab 2>&1 | grep -E "^\| wrk \| (1|32|64) \|"
  kill $SP; wait $SP 2>/dev/null
done
