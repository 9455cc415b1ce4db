#!/usr/bin/env bash
# One device call (carry .raylite, .tools, .abbase): the row normalizations' code-generator
# variants (benchmarks/norm_variants.py), the prologue's host path at T = 1 with and without CUDA
# graphs (profile_prologue_host.py), issue 14's A/B of `bench_gpu.py --only compile,moe`
# on the tree before the moves (.abbase/base.tar.gz, `git archive 74e9051`) against this tree,
# AB_ROUNDS rounds of base then head, each tree with its own kernel cache (ab_summary.py), then Ray Serve with CuPy shards (issues
# 18 and 19: two shards on one GPU). Outputs in $OUT.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .raylite/*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 SEGFUSE_COMPILE_CHECK=0
ROOT=$(pwd)
source benchmarks/device_env.sh >/dev/null
echo "== variants $(date -u +%H:%M:%S)"
BIG="rmsnorm:float32:32768x4096 rmsnorm:float32:32768x8192 rmsnorm:bfloat16:32768x8192 layernorm:float32:32768x8192 layernorm:bfloat16:32768x8192 softmax:float32:32768x4096 softmax:bfloat16:32768x4096 log_softmax:bfloat16:32768x4096 rmsnorm:bfloat16:32768x4096 layernorm:bfloat16:32768x4096 layernorm:float32:32768x4096 softmax:float32:32768x8192 softmax:bfloat16:32768x8192"
SMALL="rmsnorm:float32:8x4096 rmsnorm:bfloat16:8x4096 layernorm:float32:8x4096 layernorm:float32:8x8192 softmax:float32:8x4096"
for v in "" "NORM_WEIGHTS=32" ${VARIANTS_EXTRA:-}; do
  env $v SEGFUSE_KERNEL_CACHE=/tmp/sfk-var timeout -s INT "${VAR_S:-90}" python3 benchmarks/norm_variants.py ${VAR_LIST:-$BIG $SMALL} 2>&1 | grep -v Warning | tee -a "$OUT/variants.txt"
done
echo "== the prologue's host path at T = 1, with and without CUDA graphs $(date -u +%H:%M:%S)"
for g in 1 0; do
  echo "SEGFUSE_CUDA_GRAPHS=$g:"; SEGFUSE_CUDA_GRAPHS=$g SECONDS_=1 SEGFUSE_KERNEL_CACHE=/tmp/sfk-var timeout -s INT 60 \
    python3 benchmarks/profile_prologue_host.py 2>&1 | grep -v Warning | tee -a "$OUT/host_t1.txt"
done
mkdir -p /tmp/abbase && tar -xzf .abbase/base.tar.gz -C /tmp/abbase
for round in $(seq 1 "${AB_ROUNDS:-1}"); do  # base, head, base, head...: drift lands on both trees
  echo "== A/B base, round $round $(date -u +%H:%M:%S)"
  (cd /tmp/abbase && source benchmarks/device_env.sh >/dev/null && SEGFUSE_KERNEL_CACHE=/tmp/sfk-base \
    timeout -s INT "${AB_S:-120}" python3 benchmarks/bench_gpu.py --only "${AB_ONLY:-compile,moe}" > "$OUT/ab_base_$round.txt" 2>&1; echo "rc=$?";
    cp benchmarks/out/bench_gpu.json "$OUT/ab_base_$round.json")
  echo "== A/B head, round $round $(date -u +%H:%M:%S)"
  source benchmarks/device_env.sh >/dev/null
  SEGFUSE_KERNEL_CACHE=/tmp/sfk-head timeout -s INT "${AB_S:-120}" python3 benchmarks/bench_gpu.py --only "${AB_ONLY:-compile,moe}" \
    > "$OUT/ab_head_$round.txt" 2>&1
  echo "rc=$?"; cp benchmarks/out/bench_gpu.json "$OUT/ab_head_$round.json"
done
python3 benchmarks/ab_summary.py "$OUT"/ab_base_*.json -- "$OUT"/ab_head_*.json | tee "$OUT/ab_summary.md"
echo "== ray $(date -u +%H:%M:%S)"
SEGFUSE_KERNEL_CACHE=/tmp/sfk-ray timeout -s INT "${RAY_S:-170}" python3 benchmarks/load_ray.py --backend cupy --shard-gpus 0.5 \
  --shards 1,2 --proxies ray > "$OUT/ray.txt" 2>&1
echo "rc=$?"; tail -30 "$OUT/ray.txt"; cp benchmarks/out/load_ray*.json "$OUT/" 2>/dev/null
echo "== done $(date -u +%H:%M:%S)"
