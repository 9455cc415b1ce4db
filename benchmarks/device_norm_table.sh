#!/usr/bin/env bash
# Issue 20's 32 norm workloads in three modes (bench_gpu.py --only norm, torch.compile on) in two
# device calls of under 10 minutes each, for a card on which the table was never run (carry .whl):
#   HALF=1: the 16 workloads of 8 rows, then softmax and log_softmax at 32768 rows;
#   HALF=2: RMSNorm and LayerNorm at 32768 rows, then the GPU suite (SUITE_S seconds, 0 skips it);
#   HALF=8: the 16 workloads of 8 rows only, then the GPU suite (after a change to few-row kernels).
# Each bench part is stopped by SIGINT after NORM_S seconds; its rows stay in $OUT/<part>.txt
# ("row:" lines) even when it is stopped before writing $OUT/<part>.json.
# Run from the repository root:   HALF=1 bash benchmarks/device_norm_table.sh
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source benchmarks/device_env.sh >/dev/null
export SEGFUSE_KERNEL_CACHE=${SEGFUSE_KERNEL_CACHE:-/tmp/sfk} PYTHONUNBUFFERED=1 SEGFUSE_COMPILE_CHECK=0
export SEGFUSE_NORM_COMPILE=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv,noheader | tee "$OUT/gpu.txt"
table() {  # part name, seconds, shapes, kinds
  rm -f benchmarks/out/bench_gpu.json  # (a stopped run must not hand back an older JSON)
  SEGFUSE_NORM_SHAPES=$3 SEGFUSE_NORM_KINDS=$4 part "$1" "$2" python3 benchmarks/bench_gpu.py --only norm
  cp benchmarks/out/bench_gpu.json "$OUT/$1.json" 2>/dev/null
  grep -v "^row:" "$OUT/$1.txt" | grep -v Warning | tail -12
}
if [ "${HALF:-1}" != 2 ]; then
  table norm-8-rows "${NORM_S:-270}" 8x4096,8x8192 softmax,log_softmax,rmsnorm,layernorm
fi
if [ "${HALF:-1}" = 1 ]; then
  table norm-32768-rows-softmax "${NORM_S:-270}" 32768x4096,32768x8192 softmax,log_softmax
elif [ "${HALF:-1}" = 2 ]; then
  table norm-32768-rows-rmsnorm-layernorm "${NORM_S:-270}" 32768x4096,32768x8192 rmsnorm,layernorm
  [ "${SUITE_S:-0}" != 0 ] && SUITE_S=$SUITE_S WORKERS=16 PROLOGUE_S=0 NORM_S=0 BENCH_S=0 bash benchmarks/device_session.sh
fi
[ "${HALF:-1}" = 8 ] && [ "${SUITE_S:-0}" != 0 ] &&
  SUITE_S=$SUITE_S WORKERS=16 PROLOGUE_S=0 NORM_S=0 BENCH_S=0 bash benchmarks/device_session.sh
echo "== done $(date -u +%H:%M:%S)"
