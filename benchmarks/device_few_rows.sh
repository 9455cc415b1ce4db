#!/usr/bin/env bash
# Issue 20's few-row norm cells in one device call (carry .whl), each part with its own limit in
# seconds (0 skips it):
#   AB_S:    norm_ab.py, the code generator's variants (AB_VARIANTS) against torch.compile in one
#            process over AB_LIST, with a fresh Inductor cache, so its autotuner picks a config;
#   AB2_S:   the same over AB2_LIST in a second fresh process (torch.compile's pick varies by process);
#   the configs Inductor's autotuner chose in both (its .best_config files: configs.txt);
#   NCU_S:   ncu of segfuse's kernel and torch.compile's Triton kernels over NCU_LIST
#            (norm_variants.py NORM_ONCE=1 NORM_COMPILE=1; ncu.csv);
#   SUITE_S: the GPU suite (device_session.sh's, its other parts off);
#   NORM_S:  bench_gpu.py --only norm (three modes, torch.compile on) over NORM_SHAPES.
# Outputs in $OUT. Run from the repository root.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source benchmarks/device_env.sh >/dev/null
export SEGFUSE_KERNEL_CACHE=${SEGFUSE_KERNEL_CACHE:-/tmp/sfk} PYTHONUNBUFFERED=1 SEGFUSE_COMPILE_CHECK=0
SMALL="softmax:float32:8x4096 softmax:bfloat16:8x4096 log_softmax:float32:8x4096 log_softmax:bfloat16:8x4096
  layernorm:float32:8x4096 layernorm:bfloat16:8x4096 rmsnorm:float32:8x4096 rmsnorm:bfloat16:8x4096
  rmsnorm:float32:8x8192 rmsnorm:bfloat16:8x8192"
AB="${AB_VARIANTS:-NORM_ONE_BARRIER=0 default NORM_ONE_BARRIER=0+NORM_LEAD=0}"
VARIANTS="$AB" TORCHINDUCTOR_CACHE_DIR=/tmp/ind1 \
  part ab "${AB_S:-140}" python3 benchmarks/norm_ab.py ${AB_LIST:-$SMALL} && grep -v Warning "$OUT/ab.txt" | grep -v "^ *$"
VARIANTS="$AB" TORCHINDUCTOR_CACHE_DIR=/tmp/ind2 \
  part ab2 "${AB2_S:-0}" python3 benchmarks/norm_ab.py ${AB2_LIST:-rmsnorm:bfloat16:8x4096 rmsnorm:bfloat16:8x8192} &&
  grep -v Warning "$OUT/ab2.txt" | grep -v "^ *$"
python3 - /tmp/ind1 /tmp/ind2 > "$OUT/configs.txt" 2>&1 <<'EOF'
import glob, os, sys
for d in sys.argv[1:]:
    for p in sorted(glob.glob(os.path.join(d, "**", "*.best_config"), recursive=True)):
        print(f"== {p}\n{open(p).read().strip()}")
EOF
grep -c best_config "$OUT/configs.txt"
[ "${SUITE_S:-0}" != 0 ] && SUITE_S=$SUITE_S PROLOGUE_S=0 NORM_S=0 BENCH_S=0 bash benchmarks/device_session.sh
if [ "${NCU_S:-0}" != 0 ]; then
  echo "== ncu $(date -u +%H:%M:%S)"
  NORM_ONCE=1 NORM_COMPILE=1 TORCHINDUCTOR_CACHE_DIR=/tmp/ind3 timeout -s INT "${NCU_S:-60}" ncu --clock-control none \
    --target-processes all -k "regex:sf_k_|triton_" --section SpeedOfLight --section LaunchStats --section Occupancy \
    --section WarpStateStats --section SchedulerStats --section InstructionStats --csv --page details \
    --log-file "$OUT/ncu.csv" python3 benchmarks/norm_variants.py ${NCU_LIST:-rmsnorm:bfloat16:8x4096} > "$OUT/ncu_run.txt" 2>&1
  echo "rc=$? $(wc -l < "$OUT/ncu.csv") csv lines"; tail -2 "$OUT/ncu_run.txt"
fi
rm -f benchmarks/out/bench_gpu.json  # (a run that dies before writing its JSON must not hand back an older one)
SEGFUSE_NORM_COMPILE=1 SEGFUSE_NORM_SHAPES=${NORM_SHAPES:-32768x4096,32768x8192} \
  part norm "${NORM_S:-0}" python3 benchmarks/bench_gpu.py --only norm &&
  { grep -v "^row:" "$OUT/norm.txt" | tail -20; cp benchmarks/out/bench_gpu.json "$OUT/norm.json" 2>/dev/null; }
echo "== done $(date -u +%H:%M:%S)"
