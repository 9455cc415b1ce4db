"""Argsort with its consumers fused into the sort's last pass: one launch for the MoE argsort.

A long sort row is a library segment (compiler/cuda/radix_sort.py: one persistent multi-block
launch). Its MoE consumers are cheap per element but, as separate segments, cost a kernel to
materialize the keys before the sort and kernels after it (`order // K`; the scatter's init and
the scatter): 4 launches where the sort's own final pass already holds, per sorted position
`pos`, the index `idx = order[pos]`. So the planner (compiler/segmenter/sort_epilogue.py, which
states the pattern) recognizes a region of keys' views, the argsort and its position and scatter
consumers, and this module renders it as C for the fused kernel (`codegen/radix_sort.Epilogue`):
every segment output is a position tensor (stored `o[pos] = f(pos, idx)`) or a scatter result
(stored `o[idx] = g(pos, idx)`).

Why no bounds check: argsort of a length-n row is a permutation of [0, n), so `o[idx]` is in
range once m >= n (equal symbolically, else a recorded size test), and when m == n every slot of
the target is written exactly once, so the target needs no init either (m > n: the phase-0 init
fills it, ordered before the final pass by the kernel's first grid barrier).

Pointwise expressions come from the op registry's CUDA renderers (compiler/codegen/lazy.py), the
same text the segment codegen emits; C identifiers come from counters only.

H200, kernel time of the MoE argsort fusion (tests/gpu/test_fused_sort_gpu.py checks results):
T=4096 (32768 keys) int64 15.2 us / int32 14.5 us in one launch, against 21.8 / 22.5 us in 4
launches before; T=65536 19.6 / 18.7 us against 37.5 / 36.4 us. The sort itself is most of it
(the plain radix argsort of the same keys: 14.5 / 13.6 us at T=4096).

Three parts: `match` and `fuse_plan` (compiler/segmenter/sort_epilogue.py: the planner pass that
merges the region's consecutive segments into one library segment carrying the match, `Segment.sort_epilogue`),
`render` here (pure text, CPU) and the runtime step (compiler/cuda/library_sorts.py).
"""

from __future__ import annotations

from ..ops.registry import OpKind, Scalar
from ..plan import SortEpilogue
from . import ctypes_ as ct
from .lazy import render_lazy
from .prelude import PRELUDE
from .radix_sort import Epilogue

__all__ = ["render"]


class _Ctx:
    """What the lazy renderers see: types, the index type and how to call another lambda."""

    I = "long long"

    def __init__(self, types, names):
        self.types, self.names = types, names

    def operand_type(self, x):
        return x if isinstance(x, Scalar) else self.types[x]

    def call(self, x, cs) -> str:
        if isinstance(x, Scalar):
            return ct.literal(x.value)
        return f"{self.names[x]}({', '.join(cs)})"


def _lambdas(fusion, m: SortEpilogue, types, wanted, leaf: str):
    """C lambda definitions (`sf_vK(c0)`) for the position tensors `wanted` need, in node order;
    `order` reads `leaf`."""
    need, stack = set(), list(wanted)
    while stack:
        t = stack.pop()
        if t in need or isinstance(t, Scalar):
            continue
        need.add(t)
        if t != m.order:
            stack.extend(x for x in fusion.nodes[m.producer[t]].inputs if isinstance(x, str)
                         and fusion.nodes[m.producer[t]].op.kind is not OpKind.creation)
    names: dict = {}
    ctx = _Ctx(types, names)
    lines = []
    for t in sorted(need, key=lambda t: -1 if t == m.order else m.producer[t]):
        v = ct.value(types[t].dtype)
        name = names[t] = f"sf_v{len(names)}"
        body = f"return {leaf};" if t == m.order else render_lazy(ctx, fusion.nodes[m.producer[t]], types[t])
        lines.append(f"auto {name} = [&](long long c0) -> {v} {{ (void)c0; {body} }};")
    return lines, names


def render(fusion, m: SortEpilogue, types):
    """(radix_sort.Epilogue, tensor names of its parameters e0.., in order) at concrete types."""
    params, ctypes_, stores, scatters, inits = [], [], [], [], []
    scatter_nodes = [(fusion.nodes[p], init) for p, init in m.scatters]
    lines, names = _lambdas(fusion, m, types, m.stores, "idx")
    srcs = [nd.inputs[2] for nd, _ in scatter_nodes if not isinstance(nd.inputs[2], Scalar)]
    slines, snames = _lambdas(fusion, m, types, srcs, "idx")
    for t in m.stores:
        e = f"e{len(params)}"
        params.append(t)
        ctypes_.append(ct.storage(types[t].dtype))
        stores.append(f"{e}[pos] = {ct.cvt(f'{names[t]}(pos)', ct.storage(types[t].dtype))};")
    for nd, init in scatter_nodes:
        out = nd.outputs[0]
        dt = types[out].dtype
        e = f"e{len(params)}"
        params.append(out)
        ctypes_.append(ct.storage(dt))
        src = nd.inputs[2]
        val = ct.literal(src.value) if isinstance(src, Scalar) else f"{snames[src]}(pos)"
        scatters.append(f"{e}[idx] = {ct.cvt(val, ct.storage(dt))};")
        if init:
            self_t = nd.inputs[0]
            ilines, inames = _lambdas(fusion, m, types, [self_t], "0")
            size = int(types[self_t].shape[0])
            inits.append(f"for (long long sf_i = sf_gtid; sf_i < {size}LL; sf_i += sf_gstride) {{ "
                         + " ".join(ilines)
                         + f" {e}[sf_i] = {ct.cvt(f'{inames[self_t]}(sf_i)', ct.storage(dt))}; }}")
    hist = ""
    if m.hist is not None:
        outs = {}
        for t in m.hist.outputs:
            outs[t] = f"e{len(params)}"
            params.append(t)
            ctypes_.append(ct.storage(types[t].dtype))
        hist = _histogram(m, types, outs, fusion.nodes[m.hist.scatter].index)
    # stores at pos run in sorted order, stores at idx in element order (each coalesces there)
    store = "{ " + " ".join(lines + stores) + " }" if stores else ""
    scatter = "{ " + " ".join(slines + scatters) + " }" if scatters else ""
    epi = Epilogue(params=tuple(ctypes_), init="\n        ".join(inits), store=store, scatter=scatter,
                   hist=hist, helpers=PRELUDE)
    return epi, params


def _histogram(m: SortEpilogue, types, outs: dict, op: int) -> str:
    """Block 0's statements for the keys' histogram (`Histogram`): the counts of bin e are the
    global digit-0 count of key(e) (the sort's key of the value e, its low byte: every key lies
    in [key(0), key(E-1)] when every value is a bin, which the key range shows); an exclusive
    scan of them gives the cumsum and the offsets. A value outside the bins fails the run with
    the histogram scatter's index error (block 0 finds one to name, on that path only)."""
    h = m.hist
    E = h.bins
    val = ct.storage(types[m.key].dtype)  # the keys' C type: their value from the raw bits
    lines = [f"if (b == 0) {{ const KEY sf_k0 = (KEY)(to_key((RAW)0) ^ flip), sf_k1 = (KEY)(to_key((RAW)({E} - 1)) ^ flip);",
             "const bool sf_in = gmin >= (sf_k0 < sf_k1 ? sf_k0 : sf_k1) && gmax <= (sf_k0 < sf_k1 ? sf_k1 : sf_k0);",
             f"const unsigned sf_c = (tid < {E} && sf_in) ? __ldcg(&ghist[(unsigned)(to_key((RAW)tid) ^ flip) & 255u]) : 0u;",
             "const unsigned sf_x = scan256(sf_c, tmp);"]
    stores = []
    for t, cvalue in ((h.counts, "sf_c"), (h.csum, "sf_x + sf_c")):
        if t in outs:
            stores.append(f"{outs[t]}[tid] = {ct.cvt(f'(long long)({cvalue})', ct.storage(types[t].dtype))};")
    if h.offsets in outs:
        e, st = outs[h.offsets], ct.storage(types[h.offsets].dtype)
        stores.append(f"{e}[tid + 1] = {ct.cvt('(long long)(sf_x + sf_c)', st)}; if (tid == 0) {e}[0] = {ct.cvt('0LL', st)};")
    lines.append(f"if (tid < {E}) {{ {' '.join(stores)} }}")
    lines.append(f"if (!sf_in) for (int sf_i = tid; sf_i < n; sf_i += NT) {{ const long long sf_v = (long long)({val})x[sf_i]; "
                 f"if (sf_v < 0 || sf_v >= {E}) {{ sf_fail(sf_err, 1, {op}, sf_v, 0, {E}); break; }} }} }}")
    return "\n    ".join(lines)
