"""Argsort with its consumers fused into the sort's last pass: one launch for the MoE argsort.

A long sort row is a library segment (compiler/cuda/radix_sort.py: one persistent multi-block
launch). Its MoE consumers are cheap per element but, as separate segments, cost a kernel to
materialize the keys before the sort and kernels after it (`order // K`; the scatter's init and
the scatter): 4 launches where the sort's own final pass already holds, per sorted position
`pos`, the index `idx = order[pos]`. So this module recognizes, for a region of a plan,

    keys   = views (row-major order kept) of one segment input, sorted by one `argsort`;
    order  = argsort(keys)                      (1-D row of n elements, any order/stability);
    P      = position tensors of shape (n,): `order`, creation ops (iota, full, full_like),
             pointwise ops of position tensors and number literals;
    out    = scatter-family op without reduction: scatter(self=creation of length m >= n,
             index=order, src=a position tensor or a literal),

where every segment output is a position tensor (stored `o[pos] = f(pos, idx)`) or a scatter
result (stored `o[idx] = g(pos, idx)`), and renders that as C for the fused kernel
(`radix_sort.Epilogue`). Anything else: None, and the existing path runs.

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

Three entry points: `match`/`render` (pure, CPU), `fuse_plan` (the segmenter's post-pass that
merges the region's consecutive segments into one library segment whose hints name `ROUTINE`)
and `runtime_step` (the CuPy runtime's step for such a segment).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ops.registry import OpKind, Scalar
from ..shapes import dims_equal
from . import ctypes_ as ct
from .lazy import render_lazy
from .prelude import PRELUDE

ROUTINE = "segfuse.radix_sort+epilogue"

# Views that keep the row-major element order (the sort reads the source's elements in order).
_ORDER_KEEPING_VIEWS = frozenset({"reshape", "squeeze", "unsqueeze"})
_SPAN = 3  # segments on each side of the sort that a region may take in
# The one sort op this fusion anchors on: one output, the int64 index row.
_ANCHOR = "argsort"


@dataclass(frozen=True)
class Match:
    argsort: int  # node position of the sort
    key: str  # the segment input holding the keys, in the row's element order
    n: object  # row length (int, or a size expression in a plan)
    descending: bool
    order: str  # the argsort's output
    stores: tuple  # position tensors stored at pos (segment outputs), in output order
    scatters: tuple  # (node position, target needs a phase-0 init) per scatter
    producer: dict  # tensor -> node position, for every tensor made in the region


def _numel(shape):
    n = 1
    for d in shape:
        n = n * d
    return n


def _same(a, b) -> bool:
    return dims_equal(a, b) is True


def match(fusion, nodes, inputs, outputs, types, copies=(), le=None) -> Match | None:
    """The pattern in the region `nodes` (fusion positions) with segment `inputs`/`outputs`, or
    None. `le(a, b, why)`: how to decide a size test a <= b (the segmenter's recorded `Checks`);
    without it sizes must be concrete ints."""
    if copies:
        return None
    region = sorted(nodes)
    nd_of = {p: fusion.nodes[p] for p in region}
    producer = {o: p for p, nd in nd_of.items() for o in nd.outputs}
    readers: dict = {}
    for p, nd in nd_of.items():
        for x in nd.inputs:
            if isinstance(x, str):
                readers.setdefault(x, []).append(p)
    anchors = [p for p, nd in nd_of.items() if nd.op.name == _ANCHOR]
    if len(anchors) != 1:
        return None
    a = anchors[0]
    A = nd_of[a]
    x = A.inputs[0]
    if not isinstance(x, str):
        return None
    xt = types[x]
    if xt.rank == 0:
        return None
    n = _numel(xt.shape)
    if not _same(xt.shape[A.attrs.dim % xt.rank], n):
        return None  # several rows
    chain = []
    while x in producer:  # back through order-keeping views to the segment input
        p = producer[x]
        nd = nd_of[p]
        nxt = chain[-1] if chain else a
        if nd.op.name not in _ORDER_KEEPING_VIEWS or any(
                r != nxt and nd_of[r].op.kind is not OpKind.creation for r in readers.get(x, [])):
            return None  # (creation ops such as full_like read only the shape)
        if x in outputs:
            return None
        chain.append(p)
        x = nd.inputs[0]
    if x not in inputs:
        return None
    order = A.outputs[0]
    position = {order}
    creations = set()
    scatters = []
    for p in region:
        if p == a or p in chain:
            continue
        nd = nd_of[p]
        if len(nd.outputs) != 1:
            return None
        out = nd.outputs[0]
        t = types[out]
        kind = nd.op.kind
        if kind is OpKind.creation:
            creations.add(out)
            if t.rank == 1 and _same(t.shape[0], n):
                position.add(out)
        elif kind is OpKind.pointwise:
            ins = [i for i in nd.inputs if not isinstance(i, Scalar)]
            if not ins or any(i not in position for i in ins) or t.rank != 1:
                return None
            position.add(out)
        elif kind is OpKind.scatter:
            need_init = _scatter_ok(p, nd, order, position, creations, readers, outputs, types, n, le)
            if need_init is None:
                return None
            scatters.append((p, need_init))
        else:
            return None
    scattered = {nd_of[p].outputs[0] for p, _ in scatters}
    selves = {nd_of[p].inputs[0] for p, _ in scatters}
    for o in outputs:
        if o in selves or (o not in position and o not in scattered):
            return None
    if any(readers.get(o) for o in scattered):
        return None  # read inside the region: complete only when the kernel ends
    stores = tuple(o for o in outputs if o in position)
    if not stores and not scatters:
        return None
    return Match(a, x, n, bool(A.attrs.descending), order, stores, tuple(scatters), producer)


def _scatter_ok(p, nd, order, position, creations, readers, outputs, types, n, le):
    """None when this scatter does not fit; else whether its target needs a phase-0 init."""
    from ..segmenter_capability import scatter_reduce_of

    if scatter_reduce_of(nd) != "none" or len(nd.inputs) != 3:
        return None
    self_t, index, src = nd.inputs
    if index != order or not isinstance(self_t, str) or self_t not in creations:
        return None
    st = types[self_t]
    if st.rank != 1 or getattr(nd.attrs, "dim", 0) % 1 != 0 or readers.get(self_t) != [p] \
            or self_t in outputs:
        return None
    if not isinstance(src, Scalar) and (src not in position or types[src].rank != 1):
        return None
    m = st.shape[0]
    if _same(m, n):
        return False  # argsort is a permutation of [0, n): every slot written once
    if le is None:
        return True if isinstance(m, int) and isinstance(n, int) and n <= m else None
    return True if le(n, m, f"scatter '{nd.outputs[0]}' has room for every sorted index") else None


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


def _lambdas(fusion, m: Match, types, wanted, leaf: str):
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


def render(fusion, m: Match, types):
    """(radix_sort.Epilogue, tensor names of its parameters e0.., in order) at concrete types."""
    from ..cuda.radix_sort import Epilogue

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
    # stores at pos run in sorted order, stores at idx in element order (each coalesces there)
    store = "{ " + " ".join(lines + stores) + " }" if stores else ""
    scatter = "{ " + " ".join(slines + scatters) + " }" if scatters else ""
    epi = Epilogue(params=tuple(ctypes_), init="\n        ".join(inits), store=store, scatter=scatter,
                   helpers=PRELUDE)
    return epi, params


# ---- the segmenter's post-pass ------------------------------------------------------------

def fuse_plan(fusion, g, segs: list, checks) -> list:
    """Merge each matching region (consecutive placed segments around a lone library argsort)
    into one library segment whose `routine` is ROUTINE. `g`: the segmenter's WorkGraph."""
    from .. import segmenter_place as P

    out = list(segs)
    i = 0
    while i < len(out):
        seg = out[i]
        steps = seg.steps
        if seg.single_block or len(steps) != 1 or not steps[0].library or steps[0].node is None \
                or steps[0].node.op.name != _ANCHOR:
            i += 1
            continue
        merged = None
        # a region spans a few neighbours: the keys' producers, the sort, its consumers
        runs = sorted(((lo, hi) for lo in range(max(0, i - _SPAN), i + 1)
                       for hi in range(i, min(len(out), i + _SPAN + 1))), key=lambda r: (r[0] - r[1], r[0]))
        for lo, hi in runs:
            run = out[lo:hi + 1]
            if any(r.single_block for r in run):
                continue
            all_steps = [s for r in run for s in r.steps]
            if any(s.pos is None for s in all_steps):
                continue
            inside = {id(s) for s in all_steps}
            made = [o for s in all_steps for o in s.outputs]
            made_set = set(made)
            ins = list(dict.fromkeys(t for s in all_steps for _, t in s.tensor_operands() if t not in made_set))
            outs = [t for t in made if t in g.graph_outputs or any(
                id(c) not in inside for c, _ in g.consumers.get(t, []))]
            m = match(fusion, [s.pos for s in all_steps], ins, outs, g.types, le=checks.le)
            if m is None:
                continue
            merged = P.Seg(reason=f"{seg.reason}; its consumers run in the sort's final pass and its keys "
                                  "are read in place: one launch", single_block=False)
            merged.steps = sorted(all_steps, key=lambda s: s.key)
            merged.rebuild(g)
            merged.routine = ROUTINE
            out[lo:hi + 1] = [merged]
            i = lo
            break
        i += 1
    return out


# ---- the CuPy runtime's step ----------------------------------------------------------------

def runtime_step(rt, fusion, seg, types):
    """(run(env, ctx), may_fail) for a ROUTINE segment at these concrete types: `run` launches
    the fused kernel; `may_fail` says whether it can write the error word (a checked divisor), so
    the run must synchronize to learn its outcome. None: the runtime's general path runs it."""
    import numpy as np

    from ..cuda import radix_sort
    from ..cuda.runtime import cp_dtype
    from ..dtypes import DType

    m = match(fusion, seg.nodes, seg.inputs, seg.outputs, types, copies=getattr(seg, "copies", ()))
    if m is None:
        return None
    kt = types[m.key]
    # bfloat16 travels as uint16 bits, which would sort as integers
    if kt.dtype is DType.bfloat16 or not radix_sort.takes((int(m.n),), cp_dtype(kt.dtype), 0):
        return None
    epi, params = render(fusion, m, types)
    key_dt = np.dtype(cp_dtype(kt.dtype))
    radix_sort.prepare(key_dt, epi)
    from ..cuda.runtime import is_small, output_buffer

    cp = rt.cp
    specs = tuple((p, tuple(types[p].shape), cp_dtype(types[p].dtype)) for p in params)
    specs = tuple((p, shape, dt, is_small(shape, dt)) for p, shape, dt in specs)
    key, desc = m.key, m.descending
    token = object()  # this step's reusable outputs in each thread's state
    empty = cp.empty

    def run(env, ctx):
        x = env[key]
        if x.ndim != 1:
            x = x.reshape(-1)  # a view of a contiguous input (CuPy copies a strided one)
        outs = [output_buffer(ctx, (token, i), shape, dt, small, empty)
                for i, (_, shape, dt, small) in enumerate(specs)]
        radix_sort.argsort(cp, x, 0, desc, ctx.state, epilogue=epi, outputs=outs)
        for (name, _, _, _), a in zip(specs, outs):
            env[name] = a

    return run, "sf_err" in epi.store + epi.scatter + epi.init
