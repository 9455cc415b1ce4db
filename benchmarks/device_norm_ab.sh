#!/usr/bin/env bash
# One device call for issue 20's closest norm cells: benchmarks/norm_ab.py (the code generator's
# variants against torch.compile in one process) over the few-row and the 32768-row workloads, then
# bench_gpu.py --only norm over NORM_REST_KINDS/DTYPES/SHAPES (skipped when NORM_REST_S=0).
# Outputs in $OUT: ab-small.txt, ab-large.txt, norm-rest.txt. Run from the repository root with .whl carried.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source benchmarks/device_env.sh >/dev/null
export SEGFUSE_KERNEL_CACHE=${SEGFUSE_KERNEL_CACHE:-/tmp/sfk} PYTHONUNBUFFERED=1 SEGFUSE_COMPILE_CHECK=0
VARIANTS="${SMALL_VARIANTS:-default NORM_PER_SMALL=8 NORM_PER_SMALL=16 NORM_SPLIT_MIN=2048}" \
  part ab-small "${SMALL_S:-120}" python3 benchmarks/norm_ab.py ${SMALL_LIST:-rmsnorm:bfloat16:8x4096 rmsnorm:float32:8x4096}
VARIANTS="${LARGE_VARIANTS:-default NORM_PER=8 NORM_WEIGHTS=0 NORM_ROWS_PER_SM=8}" \
  part ab-large "${LARGE_S:-170}" python3 benchmarks/norm_ab.py ${LARGE_LIST:-rmsnorm:float32:32768x4096 rmsnorm:bfloat16:32768x8192}
SEGFUSE_NORM_COMPILE=1 SEGFUSE_NORM_KINDS=${NORM_REST_KINDS:-log_softmax} SEGFUSE_NORM_DTYPES=${NORM_REST_DTYPES:-bfloat16} \
  SEGFUSE_NORM_SHAPES=${NORM_REST_SHAPES:-32768x4096} part norm-rest "${NORM_REST_S:-0}" python3 benchmarks/bench_gpu.py --only norm
echo "== done $(date -u +%H:%M:%S)"
