"""The sort epilogue's planner pass: a lone library argsort and the segments around it that its
fused radix-sort variant can run in one launch (what, and why it is exact: compiler/codegen/
sort_epilogue.py, which renders the C; compiler/cuda/library_sorts.py launches it).

The pattern, for a region of a plan:

    keys   = views (row-major order kept) of one segment input, sorted by one `argsort`;
    order  = argsort(keys)                      (1-D row of n elements, any order/stability);
    P      = position tensors of shape (n,): `order`, creation ops (iota, full, full_like),
             pointwise ops of position tensors and number literals;
    out    = scatter-family op without reduction: scatter(self=creation of length m >= n,
             index=order, src=a position tensor or a literal),

    hist   = the keys' histogram (`Histogram`, with `histograms`): scatter(zeros of E <= 256 bins,
             index=keys, src=1, reduce=add), and optionally its cumsum and that padded by one
             leading 0 (expert offsets): the sort's phase 0 counts every key's low byte already,
             so after its first grid barrier block 0 writes them from the global digit-0 counts,

where every segment output is a position tensor, a scatter result or a histogram output. `match` recognizes it (pure,
CPU; anything else: None, and the existing path runs),
`fuse_plan` is the segmenter's post-pass that merges the region's consecutive segments into one
library segment whose `Segment.sort_epilogue` records the match (its routine: `LibraryRoutine.sort_epilogue`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from ..ops.registry import Combiner, LibrarySort, Lowering, OpKind, Scalar
from ..plan import LibraryRoutine, SortEpilogue, SortHistogram
from ..shapes import dims_equal
from . import place as P
from .capability import scatter_reduce_of

ROUTINE = LibraryRoutine.sort_epilogue.describe()  # (what `segfuse explain` and a run step name it)
_SPAN = 3  # segments on each side of the sort that a region may take in


def _is_anchor(op) -> bool:
    """The one sort op this fusion anchors on: its library sort's only output is the int64 index row."""
    return op.library_sort is LibrarySort.indices


# The keys' histogram the fused kernel writes (see the module doc): every key in [0, bins) (checked
# on the GPU from the sort's key range; a key outside fails the run with the scatter's index error,
# as the unfused scatter does).
Histogram = SortHistogram


@dataclass(frozen=True)
class Match(SortEpilogue):
    """A match at the types it was made at: the plan's record (`epilogue()`) and the row length."""

    n: object = None  # row length (int, or a size expression in a plan)

    def epilogue(self) -> SortEpilogue:
        """The plan's record of the match (sizes left to the run's types)."""
        return SortEpilogue(**{f.name: getattr(self, f.name) for f in fields(SortEpilogue)})


def _numel(shape):
    n = 1
    for d in shape:
        n = n * d
    return n


def _same(a, b) -> bool:
    return dims_equal(a, b) is True


def match(fusion, nodes, inputs, outputs, types, copies=(), le=None, histograms=True) -> Match | None:
    """The pattern in the region `nodes` (fusion positions) with segment `inputs`/`outputs`, or
    None. `le(a, b, why)`: how to decide a size test a <= b (the segmenter's recorded `Checks`);
    without it sizes must be concrete ints. `histograms`: whether the keys' histogram may join."""
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
    anchors = [p for p, nd in nd_of.items() if _is_anchor(nd.op)]
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
        # (the sort reads the source's elements in order: only views that keep it)
        if not nd.op.keeps_row_major_order or any(
                r != nxt and nd_of[r].op.kind is not OpKind.creation and not (histograms and _bins_of(nd_of[r], x))
                for r in readers.get(x, [])):
            return None  # (creation ops such as full_like read only the shape; a histogram the keys)
        if x in outputs:
            return None
        chain.append(p)
        x = nd.inputs[0]
    if x not in inputs:
        return None
    order = A.outputs[0]
    keys = {A.inputs[0]} | {nd_of[p].inputs[0] for p in chain}  # the keys, in element order
    position = {order}
    creations = set()
    scatters = []
    hist: dict = {}
    for p in region:
        if p == a or p in chain:
            continue
        nd = nd_of[p]
        if len(nd.outputs) != 1:
            return None
        out = nd.outputs[0]
        t = types[out]
        kind = nd.op.kind
        if histograms and _histogram_step(p, nd, keys, hist, nd_of, producer, readers, outputs, types, n):
            continue
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
    h = _histogram(hist, outputs)
    made_by_hist = set(h.outputs) if h else set()
    if hist and h is None:
        return None
    for o in outputs:
        if o in selves or (o not in position and o not in scattered and o not in made_by_hist):
            return None
    if any(readers.get(o) for o in scattered):
        return None  # read inside the region: complete only when the kernel ends
    stores = tuple(o for o in outputs if o in position)
    if not stores and not scatters and h is None:
        return None
    return Match(a, x, bool(A.attrs.descending), order, stores, tuple(scatters), producer, h, n=n)


def _bins_of(nd, keys) -> bool:
    """Whether `nd` is a scatter-add whose index is `keys` (a histogram candidate, checked in full
    by `_histogram_step`)."""
    return nd.op.lowering is Lowering.scatter and len(nd.inputs) == 3 and nd.inputs[1] == keys \
        and scatter_reduce_of(nd) == "add"


def _fill_of(nd_of, producer, t):
    """The constant a `full` / `full_like` made in the region fills `t` with, else None."""
    p = producer.get(t)
    if p is None or nd_of[p].op.lowering is not Lowering.fill:
        return None
    return getattr(nd_of[p].attrs, "value", None)


def _histogram_step(p, nd, keys, hist, nd_of, producer, readers, outputs, types, n) -> bool:
    """Record node `p` in `hist` when it is part of the keys' histogram: the scatter-add of 1 at
    every key into E <= 256 zeros (integers), its cumsum along dim 0, that cumsum padded by one
    leading 0. False: not such a node (the caller goes on with the other patterns)."""
    out = nd.outputs[0]
    if "counts" not in hist:
        if len(nd.inputs) != 3 or not (_bins_of(nd, nd.inputs[1]) and nd.inputs[1] in keys):
            return False
        self_t, _, src = nd.inputs
        st, it = types[self_t], types[nd.inputs[1]]
        if not (isinstance(self_t, str) and st.rank == 1 and it.rank == 1 and isinstance(st.shape[0], int)
                and 0 < st.shape[0] <= 256 and st.dtype.is_int and it.dtype.is_int and types[out].dtype == st.dtype
                and getattr(nd.attrs, "include_self", True) and getattr(nd.attrs, "dim", 0) % 1 == 0):
            return False
        if _fill_of(nd_of, producer, self_t) != 0 or readers.get(self_t) != [p] or self_t in outputs:
            return False
        one = src.value if isinstance(src, Scalar) else _fill_of(nd_of, producer, src)
        if one != 1 or (not isinstance(src, Scalar) and not _same(_numel(types[src].shape), n)):
            return False
        hist.update(scatter=p, counts=out, bins=st.shape[0], self=self_t, src=src)
        return True
    low = nd.op.lowering
    if low is Lowering.scan and "csum" not in hist and nd.inputs[0] == hist["counts"] \
            and nd.op.combiner is Combiner.add and nd.attrs.dim % 1 == 0:
        hist["csum"] = out
        return True
    if low is Lowering.pad and "offsets" not in hist and nd.inputs[0] == hist.get("csum") \
            and list(nd.attrs.pad) == [1, 0] and getattr(nd.attrs, "value", 0) == 0:
        hist["offsets"] = out
        return True
    return False


def _histogram(hist: dict, outputs) -> Histogram | None:
    """The recorded histogram once its tensors are read only as the pattern says; else None."""
    if not hist:
        return None
    made = [hist[k] for k in ("counts", "csum", "offsets") if k in hist]
    if hist["src"] in outputs or not any(t in outputs for t in made):
        return None
    return Histogram(hist["scatter"], hist["counts"], hist["bins"], hist.get("csum"), hist.get("offsets"),
                     tuple(t for t in made if t in outputs))


def _scatter_ok(p, nd, order, position, creations, readers, outputs, types, n, le):
    """None when this scatter does not fit; else whether its target needs a phase-0 init."""
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


def _scatter_targets_made_elsewhere(g, segs: list, run: list, steps: list) -> list:
    """(segment, step) for each creation op outside `run` that makes the `self` of a scatter in
    `steps`, reads no tensor (full, iota: its values depend on nothing) and is read by nothing
    else: the region may make it itself. (The planner put `full` next to unrelated work; the
    epilogue then could not see that the scatter's target is a creation, and the consumers of
    the sort took a launch of their own.)"""
    inside = {id(s) for s in steps}
    in_run = {id(r) for r in run}
    out = []
    for s in steps:
        if not s.is_scatter or not s.operands or s.operands[0] is None:
            continue
        t = s.operands[0]
        if t in g.graph_outputs or any(id(c) != id(s) for c, _ in g.consumers.get(t, [])):
            continue
        for r in segs:
            made = next((x for x in r.steps if t in x.outputs), None)  # (single-block segs keep no `made`)
            if made is None or id(r) in in_run or id(made) in inside:
                continue
            if made.kind is OpKind.creation and made.pos is not None and not made.tensor_operands() \
                    and len(made.outputs) == 1:
                out.append((r, made))
    return out


def fuse_plan(fusion, g, segs: list, checks, histograms: bool = False) -> list:
    """Merge each matching region (consecutive placed segments around a lone library argsort)
    into one library segment carrying the match (`Seg.sort_epilogue`). `g`: the segmenter's WorkGraph."""
    out = list(segs)
    i = 0
    while i < len(out):
        seg = out[i]
        steps = seg.steps
        if seg.single_block or len(steps) != 1 or not steps[0].library or steps[0].node is None \
                or not _is_anchor(steps[0].node.op):
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
            taken = _scatter_targets_made_elsewhere(g, out, run, all_steps)
            all_steps = all_steps + [s for _, s in taken]
            inside = {id(s) for s in all_steps}
            made = [o for s in all_steps for o in s.outputs]
            made_set = set(made)
            ins = list(dict.fromkeys(t for s in all_steps for _, t in s.tensor_operands() if t not in made_set))
            outs = [t for t in made if t in g.graph_outputs or any(
                id(c) not in inside for c, _ in g.consumers.get(t, []))]
            m = match(fusion, [s.pos for s in all_steps], ins, outs, g.types, le=checks.le, histograms=histograms)
            if m is None:
                continue
            hist = "" if m.hist is None else (
                f"; the keys' histogram '{m.hist.counts}' ({m.hist.bins} bins)"
                + "".join(f" and '{t}'" for t in (m.hist.csum, m.hist.offsets) if t)
                + " from the sort's own digit counts, by block 0 after its first grid barrier")
            moved = hist + "".join(f"; {st.label()} moved here from the segment that made it (it reads no tensor "
                            "and only this scatter reads it)" for _, st in taken)
            merged = P.Seg(reason=f"{seg.reason}; its consumers run in the sort's final pass and its keys "
                                  f"are read in place: one launch{moved}", single_block=False,
                           sort_epilogue=m.epilogue())
            merged.steps = sorted(all_steps, key=lambda s: s.key)
            merged.rebuild(g)
            out[lo:hi + 1] = [merged]
            for src, st in taken:  # (src is outside the run: its position is unchanged before lo)
                src.steps.remove(st)
                src.rebuild(g)
            emptied = [k for k, r in enumerate(out) if not r.steps]
            out = [r for r in out if r.steps]
            lo -= sum(1 for k in emptied if k < lo)
            i = lo
            break
        i += 1
    return out
