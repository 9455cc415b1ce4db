#!/usr/bin/env bash
# Issue 20's profiles, in one device call: ncu counters of the row-normalization kernels that miss
# their targets (and torch's kernels beside them), the code generator's variants timed
# (benchmarks/norm_variants.py), py-spy's stacks of the prologue's host path at T = 1, then the
# prologue benchmark with torch.compile. Outputs in $OUT. Carry .whl.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source benchmarks/device_env.sh >/dev/null
export SEGFUSE_KERNEL_CACHE=${SEGFUSE_KERNEL_CACHE:-/tmp/sfk} PYTHONUNBUFFERED=1 SEGFUSE_COMPILE_CHECK=0
BIG="softmax:float32:32768x4096 softmax:bfloat16:32768x4096 log_softmax:bfloat16:32768x4096 rmsnorm:bfloat16:32768x4096 layernorm:bfloat16:32768x4096 layernorm:float32:32768x4096"
SMALL="softmax:float32:8x4096 log_softmax:float32:8x4096 softmax:float32:8x8192"
echo "== ncu $(date -u +%H:%M:%S)"
NORM_ONCE=1 timeout -s INT "${NCU_S:-150}" ncu --clock-control none --target-processes all \
  --section SpeedOfLight --section LaunchStats --section Occupancy --section WarpStateStats \
  --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis --csv --page details --log-file "$OUT/ncu.csv" \
  python3 benchmarks/norm_variants.py softmax:float32:32768x4096 softmax:bfloat16:32768x4096 \
  rmsnorm:bfloat16:32768x4096 layernorm:bfloat16:32768x4096 softmax:float32:8x4096 > "$OUT/ncu_run.txt" 2>&1
echo "rc=$? $(wc -l < "$OUT/ncu.csv") csv lines"; tail -3 "$OUT/ncu_run.txt"
echo "== variants $(date -u +%H:%M:%S)"
for v in "" "NORM_PER=16" "NORM_PER=32" "NORM_FASTEXP=1" "NORM_PER=16 NORM_FASTEXP=1" "NORM_PER_SMALL=8" "NORM_PER_SMALL=2"; do
  env $v timeout -s INT 60 python3 benchmarks/norm_variants.py $BIG $SMALL 2>&1 | grep -v Warning | tee -a "$OUT/variants.txt"
done
echo "== py-spy $(date -u +%H:%M:%S)"
SECONDS_=15 timeout -s INT 60 py-spy record -r 1000 --nonblocking -f raw -o "$OUT/prologue_t1_stacks.txt" -- \
  python3 benchmarks/profile_prologue_host.py 2>&1 | tail -5
echo "== prologue with torch.compile $(date -u +%H:%M:%S)"
SEGFUSE_PROLOGUE_COMPILE=1 timeout -s INT "${PROLOGUE_S:-200}" python3 benchmarks/bench_gpu.py --only prologue > "$OUT/prologue.txt" 2>&1
echo "rc=$?"; grep "^moe prologue\|interrupted" "$OUT/prologue.txt"
cp benchmarks/out/bench_gpu.json "$OUT/prologue.json" 2>/dev/null
cp -r benchmarks/out/plots "$OUT/" 2>/dev/null
echo "== done $(date -u +%H:%M:%S)"
