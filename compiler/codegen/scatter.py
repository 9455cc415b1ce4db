"""Building blocks of the grid-mode scatter kernels (used by `ScatterRenderer.grid_kernels`, scatter_kernels.py).

Two things make a streaming scatter fast on a GPU with ~4 TB/s of DRAM and ~50 MB of L2:

* Bytes in flight. A scatter reads its indices and sources once, in order; a thread that loads one
  8-byte index and one 4-byte value per loop iteration keeps too little in flight to saturate DRAM.
  The vector variant loads 16-byte vectors (`__ldcs`: evict-first, so the stream does not push the
  target out of L2), several groups per thread per iteration, and applies them afterwards. It needs
  the index and source to be contiguous segment inputs and every pointer aligned (the runtime
  launches a `vector_of` kernel only then and the scalar kernel otherwise).
* Where the atomics land. Random atomics into a target larger than L2 go to DRAM one sector at a
  time. Splitting the target into windows that fit in L2 and making one pass over the sources per
  window (each pass applying only the updates that fall in its window) keeps the atomics in L2;
  the extra passes re-read the sources sequentially, which is cheap in comparison.

All constants are tunables, read when a kernel is generated (benchmarks/bench_gpu.py and the
scatter benchmark in .devscratch set them to compare variants).
"""

from __future__ import annotations

from ..ops.registry import Combiner, Lowering, Scalar
from . import ctypes_ as ct
from .layout import contiguous_strides, numel
from .lazy import delinearize

USE_VECTOR = True  # emit the vector variants at all (off: scalar kernels only, for comparisons)
# Measured on the H200 (2026-11-29, 2^26 int64 indices + float32 values, kernel time without host
# overhead; .devscratch/scatter/bench.py): 256 bins 188-192 us for 4 sources per thread at 2048
# threads per SM (512x4, 1024x2, 256x8 blocks), 230-233 us at half occupancy, 188-262 us (mostly
# ~210) for 8 or 16 sources, 280 us for the scalar kernel; 2^24 bins with 4 windows 1248-1257 us
# for 4-16 sources and 4 blocks of 256 per SM, 1294-1333 us for 8 blocks per SM.
VEC_ELEMS = 4  # sources per thread per loop iteration in vector loops (all loads issued first)
HIST_THREADS = 512  # privatized (shared-memory histogram) kernels
HIST_BLOCKS_PER_SM = 4
ATOMIC_THREADS = 256  # global-atomic kernels
ATOMIC_VEC_BLOCKS_PER_SM = 4
# L2 windows: a reduce-scatter into a target larger than WINDOW_BYTES with at least
# WINDOW_MIN_SOURCES sources makes ceil(bytes / WINDOW_BYTES) passes (at most MAX_WINDOWS; more
# would re-read the sources too often, so larger targets get one pass). 64 MiB float32 target,
# 2^26 sources: 1 pass 2411 us, 2 passes 1396, 4 passes 1294, 8 passes 2090 (torch eager 2447).
WINDOW_BYTES = 16 << 20
WINDOW_MIN_SOURCES = 1 << 20
MAX_WINDOWS = 8
PRIV_SMEM = 48 * 1024  # privatized (shared-memory histogram) kernels: the target's replicas fit this
ATOMIC_BLOCKS_PER_SM = 1 << 20  # scalar global-atomic kernels: one thread per source (latency-bound)


def windows(target_bytes: int, n_sources: int) -> int:
    if target_bytes <= WINDOW_BYTES or n_sources < WINDOW_MIN_SOURCES:
        return 1
    w = -(-target_bytes // WINDOW_BYTES)
    return w if w <= MAX_WINDOWS else 1


def window_bounds(n_out: int, nw: int) -> list:
    """[lo, hi) target offsets of each window (None for a single pass: no window test)."""
    if nw <= 1:
        return [None]
    per = -(-n_out // nw)
    per = -(-per // 32) * 32  # whole sectors per window
    return [(lo, min(n_out, lo + per)) for lo in range(0, n_out, per)]


def rounds_every_source(selft, reduce: str) -> bool:
    """A sum or product into a 16-bit float target: atomics in the target's own type would round
    at every source. segfuse accumulates such reductions in float32 and rounds once, as its NumPy
    backend does (docs/graph-format.md, "Reduced-precision arithmetic"), so their kernels
    accumulate in a float copy of the target (scratch or shared memory) and round at the end."""
    return reduce != "none" and selft.dtype.is_float and selft.dtype.itemsize == 2 and not Combiner(reduce).selects


def act(cg, selft, reduce: str, lin: str, val: str, target: str, mode: str, W=None, window=None) -> str:
    """The statement applying one source: mode 'store', 'identity' or atomic reduce (type W, also
    the type of `target` when given). With a window (lo, hi), offsets outside it are skipped
    (`continue`: the caller is a loop)."""
    I = cg.I
    S = ct.storage(selft.dtype)
    head = ""
    if window is not None:
        lo, hi = window
        head = f"{I} sf_lin = {lin}; if (sf_lin < ({I}){lo} || sf_lin >= ({I}){hi}) continue; "
        lin = "sf_lin"
    if mode == "store":
        return head + f"{target}[{lin}] = {ct.cvt(val, S)};"
    op = ct.combine_fn(reduce)
    Wt = W or ct.value(selft.dtype)
    St = W or S
    if mode == "identity":
        return head + f"{target}[{lin}] = {ct.cvt(f'{op}::id<{Wt}>()', St)};"
    return head + f"sf_atomic<{op}, {St}, {Wt}>(&{target}[{lin}], {ct.cvt(val, Wt)});"


def vector_plan(cg, nd):
    """(leaves, V) when the vector variant applies: `scatter` whose index (and source, unless a
    scalar) are contiguous segment inputs of the domain's shape; V sources per 16-byte group of
    the narrowest leaf. None otherwise."""
    if not USE_VECTOR or nd.op.lowering is not Lowering.scatter:
        return None
    dom = tuple(cg.types[nd.inputs[1]].shape)
    if not dom:
        return None
    leaves = []
    for x in nd.inputs[1:3]:
        if isinstance(x, Scalar) or x in leaves:
            continue
        t = cg.types[x]
        if x not in cg.seg.inputs or x in cg.copies or tuple(t.shape) != dom:
            return None
        if cg.loc[x].kind != "param" or tuple(cg.strides[x]) != contiguous_strides(t.shape):
            return None
        leaves.append(x)
    sizes = [cg.types[x].dtype.itemsize for x in leaves]
    if max(sizes) > 8 or any(16 % s for s in sizes):
        return None
    V = 16 // min(sizes)
    if numel(dom) < V:
        return None
    return leaves, V


def vector_groups_per_thread(V: int) -> int:
    return max(1, VEC_ELEMS // V)


def vector_loop(cg, nd, leaves, V: int, threads: int, per_elem: str, scalar_tail: str) -> str:
    """Grid-stride loop over groups of V sources: every thread loads U groups (16-byte `__ldcs`
    vectors of each leaf), then applies their sources one by one with `per_elem` (statements that
    see `l`, the domain coordinates and the leaf lambdas, which here read the loaded vectors; they
    may `continue`). The n % V sources left over go through `scalar_tail` (a loop over `l` from
    `sf_l0`, with the kernel's ordinary lambdas)."""
    I = cg.I
    _, names = cg._lambdas()
    dom = tuple(cg.types[nd.inputs[1]].shape)
    n = numel(dom)
    U = vector_groups_per_thread(V)
    ng = n // V
    T = threads
    decl, loads, shadow = [], [], []
    for k, x in enumerate(leaves):
        t = cg.types[x]
        S = ct.storage(t.dtype)
        nv = V * t.dtype.itemsize // 16
        decl.append(f"      union {{ uint4 u[{nv}]; {S} t[{V}]; }} sf_ld{k}[{U}];")
        loads.append(f"        #pragma unroll\n        for (int m = 0; m < {nv}; ++m) "
                     f"sf_ld{k}[u].u[m] = __ldcs((const uint4*){cg.loc[x].ref} + g * {nv} + m);")
        sig = ", ".join(f"{I} c{r}" for r in range(len(dom)))
        # shadows the kernel's lambda of this leaf: the same call, served from the registers
        shadow.append(f"          auto {names[x]} = [&]({sig}) -> {ct.value(t.dtype)} "
                      f"{{ return {ct.cvt(f'sf_ld{k}[u].t[j]', ct.value(t.dtype))}; }};")
    body = (f"  {{\n    const {I} sf_ng = ({I}){ng};\n"
            f"    for ({I} sf_g0 = ({I})blockIdx.x * {T * U}; sf_g0 < sf_ng; sf_g0 += ({I})gridDim.x * {T * U}) {{\n"
            + "\n".join(decl) + "\n"
            f"      #pragma unroll\n      for (int u = 0; u < {U}; ++u) {{\n"
            f"        const {I} g = sf_g0 + u * {T} + ({I})threadIdx.x;\n"
            f"        if (g < sf_ng) {{\n" + "\n".join(loads) + "\n        }\n      }\n"
            f"      #pragma unroll\n      for (int u = 0; u < {U}; ++u) {{\n"
            f"        const {I} g = sf_g0 + u * {T} + ({I})threadIdx.x;\n"
            f"        if (g >= sf_ng) continue;\n"
            f"        #pragma unroll\n        for (int j = 0; j < {V}; ++j) {{\n"
            f"          const {I} l = g * {V} + j;\n" + "\n".join(shadow) + "\n"
            f"          {delinearize('l', dom, I)}\n"
            + "\n".join("          " + s for s in per_elem.split("\n")) + "\n"
            "        }\n      }\n    }\n  }\n")
    if ng * V < n:
        body += (f"  {{ const {I} sf_l0 = ({I}){ng * V};\n{scalar_tail}\n  }}\n")
    return body


def vector_blocks(cg, n: int, V: int, threads: int, per_sm: int, min_per_thread: int = 1) -> int:
    """Blocks for a vector loop: per_sm per SM, fewer when there is less work (then a multiple of
    the SM count when there is at least one block per SM). min_per_thread: sources each thread
    gets at least (privatized kernels flush a whole histogram per block)."""
    need = -(-(n // V) // (threads * vector_groups_per_thread(V)))
    need = min(need, max(1, -(-n // (threads * min_per_thread))))
    full = cg.sm * per_sm
    if need >= full:
        return full
    return need // cg.sm * cg.sm if need >= cg.sm else max(1, need)
