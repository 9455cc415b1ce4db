#!/usr/bin/env bash
# The GPU suite and the GPU benchmarks in one call of under 10 minutes: the suite, then the MoE
# prologue and the row normalizations in three modes, then the bench_gpu sections behind the
# README's targets. Run on the GPU machine from the repository root after carrying .whl and .tools
# (benchmarks/device_tools.sh makes them):   bash benchmarks/device_session.sh
# Outputs go to $OUT (suite.txt, prologue.txt, norm.txt, bench.txt, bench_gpu.json, plots/);
# each part has its own time limit (SUITE_S, PROLOGUE_S, NORM_S, BENCH_S seconds; 0 skips it) and is stopped
# with SIGINT so pytest and the benchmarks still print what they have.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
source benchmarks/device_env.sh >/dev/null
export SEGFUSE_KERNEL_CACHE=${SEGFUSE_KERNEL_CACHE:-/tmp/sfk} PYTHONUNBUFFERED=1 SEGFUSE_COMPILE_CHECK=0
export SEGFUSE_RANDOM_GRAPHS=${SEGFUSE_RANDOM_GRAPHS:-30}
# torch.compile's compiles take most of a short lease: off here unless asked for (=1), shapes cut
export SEGFUSE_PROLOGUE_COMPILE=${SEGFUSE_PROLOGUE_COMPILE:-0} SEGFUSE_NORM_COMPILE=${SEGFUSE_NORM_COMPILE:-0}
export SEGFUSE_NORM_SHAPES=${SEGFUSE_NORM_SHAPES:-32768x4096,8x4096}
SEED=${SEED:-$(date +%s)}
run() {  # name, seconds (0: skip), command...
  local name=$1 secs=$2; shift 2
  if [ "$secs" = 0 ]; then echo "== $name skipped"; return 1; fi  # (its outputs are not copied)
  echo "== $name ($(date -u +%H:%M:%S), limit ${secs}s): $*"
  timeout -s INT "$secs" "$@" > "$OUT/$name.txt" 2>&1
  echo "rc=$?"
}
run suite "${SUITE_S:-280}" python3 -m pytest -q -n "${WORKERS:-14}" --timeout 240 -p no:cacheprovider -rf \
  --hypothesis-seed="$SEED" tests/gpu tests/test_torch_ext.py tests/test_torch_cuda_path.py tests/test_reduced_precision.py &&
  grep -E "^FAILED|^ERROR|passed|failed|agree with PyTorch" "$OUT/suite.txt" | tail -30
run prologue "${PROLOGUE_S:-80}" python3 benchmarks/bench_gpu.py --only prologue &&
  { tail -30 "$OUT/prologue.txt"; cp benchmarks/out/bench_gpu.json "$OUT/prologue.json" 2>/dev/null; }
run norm "${NORM_S:-120}" python3 benchmarks/bench_gpu.py --only norm &&
  { tail -40 "$OUT/norm.txt"; cp benchmarks/out/bench_gpu.json "$OUT/norm.json" 2>/dev/null; }
run bench "${BENCH_S:-90}" python3 benchmarks/bench_gpu.py --only compile,moe,chain,scatter &&
  { tail -40 "$OUT/bench.txt"; cp benchmarks/out/bench_gpu.json "$OUT/bench_gpu.json" 2>/dev/null; }
cp -r benchmarks/out/plots "$OUT/" 2>/dev/null
echo "== done $(date -u +%H:%M:%S), seed $SEED"
