#!/usr/bin/env bash
# Issue 20's remaining GPU work in one device call (carry .whl): the GPU suite; ncu counters of the
# weighted norms that trail torch.compile and of torch.compile's own Triton kernels beside them
# (norm_variants.py NORM_ONCE=1 NORM_COMPILE=1; kernels sf_k_* and triton_*); code-generator
# variants (VARIANTS: each one or more NAME=VALUE of norm_variants.py joined by '+', after
# VAR_FIRST, by default NORM_COMPILE=1, "-" for the default alone) over VAR_LIST; LayerNorm bfloat16
# through `bench_gpu.py --only norm` with torch.compile. Each part has its limit in seconds
# (SUITE_S, NCU_S, VAR_S per variant, LN_S; 0 skips it); NCU_LIST: the workloads ncu profiles, NCU_EXTRA more ncu options. Outputs in $OUT, packed into one archive
# past 8 files (a call returns at most 8).
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source benchmarks/device_env.sh >/dev/null
export SEGFUSE_KERNEL_CACHE=${SEGFUSE_KERNEL_CACHE:-/tmp/sfk} PYTHONUNBUFFERED=1 SEGFUSE_COMPILE_CHECK=0
WEIGHTED="rmsnorm:float32:32768x4096 rmsnorm:float32:32768x8192 rmsnorm:bfloat16:32768x4096 rmsnorm:bfloat16:32768x8192 layernorm:float32:32768x4096 layernorm:float32:32768x8192 layernorm:bfloat16:32768x4096 layernorm:bfloat16:32768x8192 rmsnorm:bfloat16:8x4096 rmsnorm:float32:8x4096"
# the suite through device_session.sh (its other parts off)
SUITE_S=${SUITE_S:-240} PROLOGUE_S=0 NORM_S=0 BENCH_S=0 bash benchmarks/device_session.sh
if [ "${NCU_S:-90}" != 0 ]; then
  echo "== ncu $(date -u +%H:%M:%S)"
  NORM_ONCE=1 NORM_COMPILE=1 timeout -s INT "${NCU_S:-90}" ncu --clock-control none --target-processes all \
    -k "regex:sf_k_|triton_" --section SpeedOfLight --section LaunchStats --section Occupancy \
    --section WarpStateStats --section MemoryWorkloadAnalysis ${NCU_EXTRA:-} --csv --page details --log-file "$OUT/ncu.csv" \
    python3 benchmarks/norm_variants.py ${NCU_LIST:-rmsnorm:float32:32768x4096 layernorm:float32:32768x4096 \
    rmsnorm:bfloat16:32768x8192 softmax:bfloat16:32768x4096} > "$OUT/ncu_run.txt" 2>&1
  echo "rc=$? $(wc -l < "$OUT/ncu.csv") csv lines"; tail -3 "$OUT/ncu_run.txt"
fi
if [ "${VAR_S:-70}" != 0 ]; then
  echo "== variants $(date -u +%H:%M:%S)"
  # a variant is one or more NAME=VALUE joined by '+'; "-" is the default (no variable)
  for v in ${VAR_FIRST:-NORM_COMPILE=1} ${VARIANTS:-NORM_MIN_THREADS=1536 NORM_MIN_THREADS=2048}; do
    [ "$v" = - ] && v=
    env ${v//+/ } timeout -s INT "${VAR_S:-70}" python3 benchmarks/norm_variants.py ${VAR_LIST:-$WEIGHTED} 2>&1 | grep -v Warning \
      | tee -a "$OUT/variants.txt"
  done
fi
# LayerNorm bfloat16 against torch.compile: device_session.sh's norm part (norm.txt, norm.json)
[ "${LN_S:-60}" != 0 ] && SUITE_S=0 PROLOGUE_S=0 BENCH_S=0 NORM_S=${LN_S:-60} SEGFUSE_NORM_COMPILE=1 SEGFUSE_COMPILE_MODES=default \
  SEGFUSE_NORM_KINDS=layernorm SEGFUSE_NORM_DTYPES=bfloat16 \
  SEGFUSE_NORM_SHAPES=${LN_SHAPES:-32768x4096,32768x8192,8x4096,8x8192} bash benchmarks/device_session.sh
rm -rf "$OUT/plots"  # (a call returns at most 8 files: plot_modes.py remakes them from norm.json)
if [ "$(find "$OUT" -type f | wc -l)" -gt 8 ]; then  # one archive instead
  (cd "$OUT" && tar czf /tmp/close20.tar.gz . && find . -type f -delete && mv /tmp/close20.tar.gz .)
fi
echo "== done $(date -u +%H:%M:%S)"
