#!/bin/bash
# py-spy of a cupy server during the raw 64 MiB PUT/GET and during the JSON stall test (GPU machine,
# after `source benchmarks/device_env.sh`; OUT: where the profiles go; SECTIONS: "bytes stall" by default).
# Used for benchmarks/README.md.
P=8610
python3 -c "import sys; from segfuse.cli import main; sys.exit(main())" serve --backend cupy --port $P --max-queued-runs 4096 --log-level warning --max-body-bytes 1G & SP=$!
for i in $(seq 100); do curl -sf localhost:$P/v2/health/ready >/dev/null && break; sleep 0.3; done
for sec in ${SECTIONS:-bytes stall}; do
  py-spy record --pid $SP --rate 1000 --format raw --threads --full-filenames -d 14 -o $OUT/prof-$sec.txt >/dev/null 2>&1 & PS=$!
  sleep 0.5
  timeout 60 python3 benchmarks/load.py --url http://127.0.0.1:$P --only $sec --duration 5 --bytes-repeat 8 --out /tmp/pb 2>&1 | grep -E "PUT|GET|JSON PUT|idle"
  wait $PS
  python3 benchmarks/profile_summary.py $OUT/prof-$sec.txt --rate 1000 --seconds 14 --top 25 > $OUT/prof-$sec.md 2>&1
done
kill $SP; wait $SP 2>/dev/null
