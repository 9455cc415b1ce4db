"""Row-normalization kernels under variants of the code generator's choices, timed in one process
(issue 20: which choice explains a miss). Run under `ncu` for hardware counters, or alone for GPU
time. Variants come from the environment, set before segfuse is imported:

- NORM_PER=N: elements per thread of a row when rows fill the SMs (limits.row_threads; default 16);
- NORM_PER_SMALL=N: the same when they do not (default 8; 4 before 2026-12-02 19:00 UTC), not for
  the parts of a row split over a cluster;
- NORM_FASTEXP=1: exp rendered as __expf (the hardware approximation);
- NORM_WEIGHTS=N: limits.ROW_REGISTER_WEIGHTS (weights held in registers; default 32);
- NORM_MIN_THREADS=N: limits.ROW_MIN_RESIDENT_THREADS and ROW_MIN_RESIDENT_THREADS_2BYTE (a
  register cap through __launch_bounds__; defaults 0, none, and 2048 for rows of 2-byte elements in
  registers). By ptxas (sm_90), RMSNorm float32 [32768, 4096] goes 48 -> 40 registers at 1536 (8
  bytes spilled) and 32 at 2048 (44 bytes); LayerNorm 64-72 -> 40 (80-100 bytes spilled);
- NORM_ROWS_PER_SM=N: row_reduction.BLOCK_ROWS_PER_SM, a persistent grid of N blocks an SM for
  the kernels of a block per row, looping over the rows (default none: a block per row; before
  2026-12-02 02:30 UTC the default was 32, the warp-per-row kernels' cap);
- NORM_ONE_BARRIER=1 / 0: limits.ROW_ONE_BARRIER True / False (sf_block_reduce1, one barrier a
  reduction instead of three, for all rows / for none; unset: limits' rule, few rows only);
- NORM_BFLY=1 / 0: limits.ROW_REDUCE_BUTTERFLY on / off (sf_block_reduce1w: the warp count compiled
  in, the partials combined in a butterfly that leaves the result in every lane, no broadcast; on
  since 2026-12-07 00:20 UTC);
- NORM_LATE_W=1 / 0: limits.ROW_WEIGHTS_AFTER_ROW on / off (weights held in registers load inside
  the row loop, after the row, where a block has one row and the rows fit the SMs: in the SASS of
  RMSNorm bfloat16 [8, 4096] the four loads then go out together, where before the loop the
  weights' conversion to float waited for their load before the row's load was issued; on since
  2026-12-07 02:10 UTC);
- NORM_LEAD=0: sf_block_reduce without its first barrier (before the warps write their partials:
  each call site has its own shared array, and the last barrier of the call before, which every
  thread passes after reading the result, already orders that call's reads before these writes);
- NORM_CACHE=ld|st|both: the rows' vector loads, the outputs' stores or both as streaming
  (evict-first) accesses, `__ldcs`/`__stcs`, the weights' loads as they are; NORM_CACHE=l2: L2
  eviction priorities the way torch.compile's Triton kernels set theirs (`createpolicy` and
  `.L2::cache_hint`): the rows evict-first, the weights evict-last (on the H100, an RMSNorm from
  Inductor ran 24% slower without its eviction policies: pytorch/helion issue 660). Measured on
  the H200 2026-12-02 03:28 UTC: `l2`, `ld` and `both` 3-5% slower at 32768 rows (RMSNorm float32
  [32768, 8192] 509 -> 533 us), `st` unchanged; none adopted;
- NORM_SPLIT=N: row_reduction.ROW_SPLIT_MAX, the most blocks (a thread-block cluster) that share a
  row when the rows do not fill the SMs (default 8; 1: a block per row);
- NORM_HINTS=0: limits.ROW_LOAD_HINTS off (rows in registers load without the evict-last hints of
  prelude VLOAD_LAST, as before f1abef4);
- NORM_WIDE=1: limits.ROW_WIDE_2BYTE_VECTORS (rows in registers of 2-byte elements move in 16-byte
  vectors of 8, the width of torch.compile's float32 row accesses, instead of 8-byte vectors of 4);
- NORM_COMPOSITE=1: softmax and log_softmax through the ops of those names (their expansion, with
  its -inf pad before amax) instead of written out; torch's side is the same.

Prints one line per workload: kernels-only GPU time (us) of segfuse, then torch eager's graph replay
(NORM_COMPILE=1: torch.compile's too, default mode, a fresh Dynamo per workload; under ncu its
Triton kernel is profiled beside ours).
`python benchmarks/norm_variants.py softmax:float32:32768x4096 rmsnorm:bfloat16:32768x4096 ...`
(NORM_ONCE=1: one call of each, for ncu)."""

from __future__ import annotations

import dataclasses
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))


def _patch():
    from segfuse.compiler import limits
    from segfuse.compiler.codegen import row_reduction
    from segfuse.compiler.segmenter import pipeline

    big, small = int(os.environ.get("NORM_PER", "16")), int(os.environ.get("NORM_PER_SMALL", "8"))
    orig = limits.row_threads

    def row_threads(length, rows, sm_count, split=1):
        if length <= limits.ROW_WARP_MAX or split > 1:  # (a split row's parts: as limits has them)
            return orig(length, rows, sm_count, split)
        per, t = (small if rows <= sm_count else big), 128
        while t < 1024 and t * per < length:
            t *= 2
        return t

    if "NORM_PER" in os.environ or "NORM_PER_SMALL" in os.environ:  # else limits.row_threads as it is
        row_reduction.row_threads = pipeline.row_threads = row_threads
    if "NORM_WEIGHTS" in os.environ:
        row_reduction.ROW_REGISTER_WEIGHTS = int(os.environ["NORM_WEIGHTS"])
    if "NORM_MIN_THREADS" in os.environ:  # both caps (4-byte rows and 2-byte rows)
        row_reduction.ROW_MIN_RESIDENT_THREADS = int(os.environ["NORM_MIN_THREADS"])
        row_reduction.ROW_MIN_RESIDENT_THREADS_2BYTE = int(os.environ["NORM_MIN_THREADS"])
    if "NORM_ROWS_PER_SM" in os.environ:  # a persistent grid for block-per-row kernels ("none": a block per row)
        v = os.environ["NORM_ROWS_PER_SM"]
        row_reduction.BLOCK_ROWS_PER_SM = None if v == "none" else int(v)
    if "NORM_HINTS" in os.environ:
        row_reduction.ROW_LOAD_HINTS = os.environ["NORM_HINTS"] == "1"
    if "NORM_SPLIT" in os.environ:
        row_reduction.ROW_SPLIT_MAX = int(os.environ["NORM_SPLIT"])
    if "NORM_WIDE" in os.environ:
        row_reduction.ROW_WIDE_2BYTE_VECTORS = os.environ["NORM_WIDE"] == "1"
    if "NORM_LATE_W" in os.environ:
        row_reduction.ROW_WEIGHTS_AFTER_ROW = os.environ["NORM_LATE_W"] == "1"
    if "NORM_BFLY" in os.environ:
        row_reduction.ROW_REDUCE_BUTTERFLY = os.environ["NORM_BFLY"] == "1"
    if "NORM_ONE_BARRIER" in os.environ:  # (unset: limits' rule, one barrier for few rows only)
        row_reduction.ROW_ONE_BARRIER = os.environ["NORM_ONE_BARRIER"] == "1"
    if os.environ.get("NORM_LEAD") == "0":
        from segfuse.compiler.codegen import segment

        lead = "  v = sf_warp_reduce(v, f);\n  __syncthreads();\n  if (lane == 0) sh[warp] = v;\n"
        assert segment.PRELUDE.count(lead) == 1, "sf_block_reduce changed: NORM_LEAD needs updating"
        segment.PRELUDE = segment.PRELUDE.replace(lead, lead.replace("  __syncthreads();\n", ""))
    if os.environ.get("NORM_CACHE") in ("ld", "st", "both", "l2"):
        _stream_hints(os.environ["NORM_CACHE"])
    if os.environ.get("NORM_FASTEXP") == "1":
        from segfuse.compiler.ops import REGISTRY

        op = REGISTRY["exp"]
        try:
            op.cuda = lambda x: f"__expf({x})"
        except dataclasses.FrozenInstanceError:
            object.__setattr__(op, "cuda", lambda x: f"__expf({x})")


_STREAMING = r"""
template <int N> struct sf_vbits {};
template <> struct sf_vbits<16> { typedef int4 type; };
template <> struct sf_vbits<8> { typedef int2 type; };
template <typename T> __device__ __forceinline__ sf_v4<T> sf_vload_cs(const sf_v4<T>* p) {
  typedef typename sf_vbits<sizeof(sf_v4<T>)>::type W; W w = __ldcs((const W*)p); sf_v4<T> r; *(W*)&r = w; return r; }
template <typename T> __device__ __forceinline__ void sf_vstore_cs(sf_v4<T>* p, sf_v4<T> v) {
  typedef typename sf_vbits<sizeof(sf_v4<T>)>::type W; __stcs((W*)p, *(const W*)&v); }
// L2 eviction priorities as torch.compile's Triton kernels set them (createpolicy + L2::cache_hint):
// the rows, read once, evict-first (and no L1 allocation); the weights, read by every block, evict-last
#define SF_POLICY(NAME, PRIO) __device__ __forceinline__ unsigned long long NAME() { unsigned long long p; \
  asm("createpolicy.fractional.L2::" PRIO ".b64 %0, 1.0;" : "=l"(p)); return p; }
SF_POLICY(sf_pol_first, "evict_first") SF_POLICY(sf_pol_last, "evict_last")
#undef SF_POLICY
#define SF_LDH(NAME, L1) \
  __device__ __forceinline__ int4 NAME(const int4* p, unsigned long long pol) { int4 r; \
    asm("ld.global" L1 ".L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;" \
        : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p), "l"(pol)); return r; } \
  __device__ __forceinline__ int2 NAME(const int2* p, unsigned long long pol) { int2 r; \
    asm("ld.global" L1 ".L2::cache_hint.v2.u32 {%0, %1}, [%2], %3;" : "=r"(r.x), "=r"(r.y) : "l"(p), "l"(pol)); return r; }
SF_LDH(sf_ld_first, ".L1::no_allocate") SF_LDH(sf_ld_last, ".L1::evict_last")
#undef SF_LDH
template <typename T> __device__ __forceinline__ sf_v4<T> sf_vload_first(const sf_v4<T>* p) {
  typedef typename sf_vbits<sizeof(sf_v4<T>)>::type W; W w = sf_ld_first((const W*)p, sf_pol_first()); sf_v4<T> r; *(W*)&r = w; return r; }
template <typename T> __device__ __forceinline__ sf_v4<T> sf_vload_last(const sf_v4<T>* p) {
  typedef typename sf_vbits<sizeof(sf_v4<T>)>::type W; W w = sf_ld_last((const W*)p, sf_pol_last()); sf_v4<T> r; *(W*)&r = w; return r; }
"""


def _stream_hints(which: str) -> None:
    """The rows' vector loads (`ld`), the outputs' vector stores (`st`) or both as streaming
    accesses (`__ldcs`/`__stcs`: ld.global.cs / st.global.cs, evict-first), in the kernels with
    the row in registers, the weights' loads as they are; or (`l2`) the rows' loads with an L2
    evict-first policy and the weights' with evict-last."""
    from segfuse.compiler.codegen import row_reduction, segment

    segment.PRELUDE = segment.PRELUDE + _STREAMING
    cls = row_reduction.RowReductionKernels
    load, store = cls._register_load, cls._row_stores_registers
    if which in ("ld", "both"):
        def _register_load(self, x, arr, row_off, *a):
            text = load(self, x, arr, row_off, *a)
            return text.replace("sf_vload(", "sf_vload_cs(") if row_off else text
        cls._register_load = _register_load
    if which == "l2":
        def _register_load(self, x, arr, row_off, *a):
            return load(self, x, arr, row_off, *a).replace("sf_vload(", "sf_vload_first(" if row_off else "sf_vload_last(")
        cls._register_load = _register_load
    if which in ("st", "both"):
        cls._row_stores_registers = lambda self, *a: store(self, *a).replace("sf_vstore(", "sf_vstore_cs(")


def main(argv):
    _patch()
    import cupy as cp
    import numpy as np
    import segfuse.torch as sft
    import torch
    from modes import graph_of, held_events_us
    from norm_graphs import norm_graph, norm_inputs, torch_norm
    from segfuse.compiler.cuda.runtime import get_runtime
    from segfuse.compiler.engine import Engine

    once = os.environ.get("NORM_ONCE") == "1"
    tag = " ".join(f"{k}={os.environ[k]}" for k in ("NORM_PER", "NORM_PER_SMALL", "NORM_FASTEXP", "NORM_WEIGHTS", "NORM_MIN_THREADS",
                                                      "NORM_ROWS_PER_SM", "NORM_ONE_BARRIER", "NORM_CACHE", "NORM_SPLIT", "NORM_COMPOSITE",
                                                      "NORM_HINTS", "NORM_LEAD", "NORM_WIDE")
                   if k in os.environ)
    eng, rt = Engine("cupy"), get_runtime()
    for spec in argv:
        kind, dtype, shape = spec.split(":")
        R, D = (int(v) for v in shape.split("x"))
        f = norm_graph(kind, dtype, os.environ.get("NORM_COMPOSITE") == "1" and "softmax" in kind)
        host = norm_inputs(kind, R, D, dtype, seed=1)
        tdt = torch.float32 if dtype == "float32" else torch.bfloat16
        t_ins = {k: torch.from_numpy(np.asarray(v).astype(np.float32)).to(tdt).cuda() for k, v in host.items()}
        ins = {k: cp.asarray(v.view(np.uint16) if dtype == "bfloat16" else v) for k, v in host.items()}
        torch.cuda.nvtx.range_push(f"segfuse {spec}")
        eng.run(f, ins)
        cp.cuda.runtime.deviceSynchronize()
        torch.cuda.nvtx.range_pop()
        torch.cuda.nvtx.range_push(f"torch {spec}")
        torch_norm(kind, t_ins)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        compiled = None
        if os.environ.get("NORM_COMPILE") == "1":
            torch._dynamo.reset()  # (past Dynamo's recompile limit it would silently run eagerly)
            compiled = torch.compile(lambda ti, kind=kind: torch_norm(kind, ti), dynamic=False)
            compiled(t_ins)  # compiles (ncu skips nothing: keep NORM_ONCE runs short)
            torch.cuda.nvtx.range_push(f"torch.compile {spec}")
            compiled(t_ins)
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
        if once:
            continue
        prep = rt.prepared_for(f, ins)
        seg_us = rt.kernel_time_us(f, ins, reps=50)
        # the same kernels replayed in a CUDA graph (segfuse.torch), as torch's rows are timed: a
        # few-microsecond kernel's time between launches differs between the two ways
        op = sft.fusion(f)
        graph_us = held_events_us(graph_of(lambda op=op, t_ins=t_ins: op(**t_ins)).replay)
        torch_us = held_events_us(graph_of(lambda kind=kind, t_ins=t_ins: torch_norm(kind, t_ins)).replay)
        line = (f"{spec} [{tag or 'default'}] segfuse {seg_us:.1f} us ({prep.kernels} kernels), in a CUDA graph "
                f"{graph_us:.1f} us, torch eager {torch_us:.1f} us, ratio {torch_us / seg_us:.2f}x")
        if compiled is not None:
            comp_us = held_events_us(graph_of(lambda c=compiled, t_ins=t_ins: c(t_ins)).replay)
            line += (f", torch.compile {comp_us:.1f} us, ratio {comp_us / seg_us:.2f}x"
                     f" (in a graph: {comp_us / graph_us:.2f}x)")
        print(line, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
