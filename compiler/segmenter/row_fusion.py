"""Row-persistent reductions: several reductions over the same innermost axes, with the pointwise
work between and after them, as ONE kernel in which a block (or a warp, for short rows) owns a
row (nvFuser's inner-persistent normalization scheduler; PyTorch's softmax / layer_norm kernels).

softmax  `exp(x - amax(x, 1)) / sum(exp(x - amax(x, 1)), 1)`, RMSNorm `x * rsqrt(mean(x*x, 1) + eps) * w`
and LayerNorm place as 2-4 multi-block kernels (each reduction's result is complete only when its
kernel ends, rule 2). Inside one row-owning block a reduction's result is complete after a block
reduction, so every op of the row can read it: `analyze` says when a region's ops only ever read
a reduction result at their own row (then the region is one kernel), `fuse_plan` is the
segmenter's post-pass that merges such consecutive placed segments (capability.can_schedule_rows
decides, with the reason `segfuse explain` prints). compiler/codegen/row_reduction.py renders it.

The facts `analyze` checks, for the region's geometry (reduced dims `rd`, a trailing run of the
first reduction input's dims; the kept dims before them are the rows):
- every reduction has Lowering.reduce, the same reduced dims and the same kept dims;
- a *row value* (a reduction result, or anything computed from one) is a row-shaped tensor (rank r,
  kept dims complete) or a per-row tensor (kept dims only, or kept dims with 1s for `rd`); the ops
  reading one keep the row coordinates: pointwise ops of equal rank, reshapes between the two
  per-row forms, an expand of the keepdim form, pad / slice / cat along reduced dims, reductions;
- other tensors may be read anywhere (their lambdas read global memory at any coordinate);
- every segment output is row-shaped with the row's length, or per-row.
`row_kernel` records what the code generator needs (`plan.RowKernel`), so it never runs `analyze`
again: its facts hold for every size of the shape class (the size tests are recorded).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..ops.reductions import reduced_dims
from ..ops.registry import LAZY_KINDS, Lowering, OpKind
from ..plan import RowKernel
from ..shapes import dims_equal
from . import place as P
from .shapes import fmt, numel

# Lazy lowerings a region may hold (views and movement only where `_keeps_rows` says so for row values)
_LAZY_OK = frozenset({Lowering.pointwise, Lowering.fill, Lowering.iota, Lowering.relinearize, Lowering.expand,
                      Lowering.pad, Lowering.slice, Lowering.cat})
_ALONG_ROW = frozenset({Lowering.pad, Lowering.slice, Lowering.cat})  # move data along one dim only


@dataclass(frozen=True)
class RowRegion:
    reductions: tuple  # node positions of the reductions, in order
    rank: int
    dims: tuple  # the reduced dims (a trailing run)
    kept: tuple  # the kept dims' sizes (the rows)
    row: tuple  # the reduced dims' sizes of the row-shaped outputs and cached inputs
    full_outputs: tuple  # segment outputs stored per element of a row
    row_outputs: tuple  # segment outputs stored once per row (keepdim or not)
    cacheable: tuple  # segment inputs of the row's shape that are read only at their own row


def _same(a, b) -> bool:
    return a == b if isinstance(a, int) and isinstance(b, int) else dims_equal(a, b) is True


def _same_shape(a, b) -> bool:
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))


def analyze(fusion, nodes, inputs, outputs, types) -> tuple[RowRegion | None, str]:
    """(the region, "") when the ops at `nodes` (fusion positions) with segment `inputs` and
    `outputs` run as one row-persistent kernel; else (None, why not)."""
    region = sorted(nodes)
    nds = [fusion.nodes[p] for p in region]
    reds = [p for p, nd in zip(region, nds) if nd.op.kind is OpKind.reduction]
    if not reds:
        return None, "no reduction"
    for p in reds:
        if fusion.nodes[p].op.lowering is not Lowering.reduce:
            return None, f"{fusion.nodes[p].label()} is not a plain reduction"
    x0 = types[fusion.nodes[reds[0]].inputs[0]]
    r = x0.rank
    rd = reduced_dims(x0, fusion.nodes[reds[0]].attrs.dims) if r else ()
    k = len(rd)
    if not rd or rd != tuple(range(r - k, r)):
        return None, "the reduced dims are not the innermost ones"
    kept = tuple(x0.shape[:r - k])
    per_row = {"keep": kept, "keepk": kept + (1,) * k}

    def row_shaped(t) -> bool:  # rank r, every kept dim complete
        return t.rank == r and _same_shape(t.shape[:r - k], kept)

    def per_row_form(t) -> bool:
        return _same_shape(t.shape, per_row["keep"]) or _same_shape(t.shape, per_row["keepk"])

    rowv = set()
    for nd in nds:
        ins = [x for x in nd.inputs if isinstance(x, str)]
        out = types[nd.outputs[0]]
        tainted = [x for x in ins if x in rowv]
        if nd.op.kind is OpKind.reduction:
            xt = types[nd.inputs[0]]
            if not row_shaped(xt) or reduced_dims(xt, nd.attrs.dims) != rd:
                return None, f"{nd.label()} reduces other dims than {fusion.nodes[reds[0]].label()}"
            rowv.update(nd.outputs)
            continue
        if nd.op.kind not in LAZY_KINDS or nd.op.lowering not in _LAZY_OK or len(nd.outputs) != 1:
            return None, f"{nd.label()} has no row-persistent lowering"
        if not tainted:
            continue  # recomputed from the segment inputs at any coordinate
        why = _keeps_rows(nd, out, [types[x] for x in tainted], r, k, row_shaped, per_row_form)
        if why:
            return None, f"{nd.label()} {why}"
        rowv.update(nd.outputs)
    full, per, row = [], [], None
    for o in outputs:
        t = types[o]
        if row_shaped(t) and not per_row_form(t):
            if row is None:
                row = tuple(t.shape[r - k:])
            elif not _same_shape(row, t.shape[r - k:]):
                return None, f"outputs '{full[0]}' and '{o}' have rows of different lengths"
            full.append(o)
        elif per_row_form(t):
            per.append(o)
        else:
            return None, f"output '{o}' is neither row-shaped nor one value per row"
    row = row if row is not None else tuple(x0.shape[r - k:])
    cache = tuple(x for x in inputs if x not in rowv and _caches(fusion, region, x, types, r, k, kept, row))
    return RowRegion(tuple(reds), r, rd, kept, row, tuple(full), tuple(per), cache), ""


def _keeps_rows(nd, out, tainted, r, k, row_shaped, per_row_form) -> str:
    """'' when `nd` reads its row-value operands only at its own row; else why not."""
    low = nd.op.lowering
    if low in (Lowering.pointwise, Lowering.expand):
        if low is Lowering.expand and not all(per_row_form(t) and t.rank == r for t in tainted):
            return "expands a row value that is not in keepdim form"
        if row_shaped(out) and all(t.rank == r for t in tainted):
            return ""
        if per_row_form(out) and out.rank == r - k and all(_same_shape(t.shape, out.shape) for t in tainted):
            return ""
        return "broadcasts a row value across rows"
    if low is Lowering.relinearize:
        return "" if per_row_form(out) and all(per_row_form(t) for t in tainted) else "reshapes a row value"
    if low in _ALONG_ROW:
        dims = _moved_dims(nd, r)
        if row_shaped(out) and all(row_shaped(t) for t in tainted) and all(d >= r - k for d in dims):
            return ""
        return "moves a row value across rows"
    return "reads a row value at other rows"


def _moved_dims(nd, r) -> list:
    """The dims a pad / slice / cat moves data along."""
    a = nd.attrs
    if nd.op.lowering is Lowering.pad:
        return [r - 1 - j for j in range(len(a.pad) // 2) if a.pad[2 * j] or a.pad[2 * j + 1]]
    return [a.dim % r]


def _caches(fusion, region, x, types, r, k, kept, row) -> bool:
    """Whether input x can be cached per row: the row's shape, and each reader keeps the row."""
    t = types[x]
    if t.rank != r or not _same_shape(t.shape, kept + row):
        return False
    for p in region:
        nd = fusion.nodes[p]
        if x not in nd.inputs:
            continue
        low = nd.op.lowering
        out = types[nd.outputs[0]]
        if low is Lowering.reduce:
            continue
        if low in (Lowering.pointwise, Lowering.expand) and out.rank == r:
            continue
        if low in _ALONG_ROW and all(d >= r - k for d in _moved_dims(nd, r)):
            continue
        return False
    return True


def read_in_place(fusion, region, x, types, rank: int | None = None) -> bool:
    """Whether every op of the region that reads input x, or a tensor computed from it below the
    rows' rank, reads it at the element it computes (pointwise, expand, reduce, an identity pad:
    no other pad / slice / cat along the row, no reshape), so a kernel may hold x in registers,
    each thread its own elements (codegen/row_reduction.py). `rank`: the rank of the region's
    rows, for an x broadcast over them (a weight of the row's shape, cast first in bfloat16);
    default x's own."""
    r = types[x].rank if rank is None else rank
    derived = {x}
    for p in sorted(region):
        nd = fusion.nodes[p]
        if not derived.intersection(nd.inputs):
            continue
        low = nd.op.lowering
        if low is Lowering.reduce:
            continue
        if low in (Lowering.pointwise, Lowering.expand):
            if types[nd.outputs[0]].rank < r:
                derived.update(nd.outputs)  # (still broadcast over the rows: its readers count)
            continue
        if low is Lowering.pad and identity_pad_source(fusion, region, nd.outputs[0], types) is not None:
            continue
        return False
    return True


def identity_pad_source(fusion, region, t, types):
    """The tensor that tensor t pads when a pad in the region makes t by appending elements (no
    padding before any dim, none removed) that leave every reader's combine unchanged: all its
    readers in the region are reductions of the pad's fill as identity (amax of -inf: the
    composite softmax's guard for rows that may be empty, compiler/ops/composites.py). Such a
    reduction equals its combine over the source's elements alone (a mean still divides by the
    padded count), so a kernel may read the source in place. Else None."""
    made = [fusion.nodes[p] for p in region if t in fusion.nodes[p].outputs]
    if len(made) != 1 or made[0].op.lowering is not Lowering.pad:
        return None
    nd = made[0]
    pads = nd.attrs.pad
    if any(pads[2 * j] != 0 or pads[2 * j + 1] < 0 for j in range(len(pads) // 2)) or not isinstance(nd.inputs[0], str):
        return None
    readers = [fusion.nodes[p] for p in region if t in fusion.nodes[p].inputs]
    is_float = types[t].dtype.is_float
    if not readers or any(rd.op.lowering is not Lowering.reduce or rd.inputs[0] != t or
                          not rd.op.combiner.is_identity(nd.attrs.value, is_float) for rd in readers):
        return None
    return nd.inputs[0]


def row_kernel(fusion, region: RowRegion, nodes, inputs, outputs, types) -> RowKernel:
    """The plan's record of a row region (`Segment.row`) for the segment of `nodes`, `inputs` and
    `outputs` (each tuple in the segment's order): what the code generator needs besides the run's
    sizes, decided here once."""
    rows, length = numel(tuple(region.kept)), numel(tuple(region.row))
    combined = []
    for p in region.reductions:
        x = fusion.nodes[p].inputs[0]
        combined.append(identity_pad_source(fusion, nodes, x, types) or x)
    in_place = tuple(x for x in inputs if read_in_place(fusion, nodes, x, types, rank=region.rank))
    return RowKernel(reductions=tuple(region.reductions), rank=region.rank, dims=tuple(region.dims),
                     rows=fmt(rows), row_length=fmt(length),
                     full_outputs=tuple(o for o in outputs if o in region.full_outputs),
                     row_outputs=tuple(o for o in outputs if o in region.row_outputs),
                     cached_inputs=tuple(x for x in inputs if x in region.cacheable), in_place=in_place,
                     combined=tuple(combined))


def _candidate(seg) -> bool:
    return not (seg.single_block or seg.library or seg.fused_sort or seg.row is not None) and all(
        s.pos is not None and (s.kind in LAZY_KINDS or s.kind is OpKind.reduction) for s in seg.steps)


def _launches(seg, g) -> int:
    """Launches a placed grid segment takes (a reduction with other outputs: two)."""
    h = seg.heavy
    if h is None:
        return 1
    made = {o for s in seg.steps for o in s.outputs}
    outs = {t for t in made if t in g.graph_outputs or any(c not in seg.steps for c, _ in g.consumers.get(t, []))}
    return 2 if any(s.kind in LAZY_KINDS and set(s.outputs) & outs for s in seg.steps) else 1


def region_of(g, run: list):
    """(node positions, segment inputs, segment outputs) of consecutive placed segments merged."""
    steps = [s for seg in run for s in seg.steps]
    inside = {id(s) for s in steps}
    made = [o for s in steps for o in s.outputs]
    made_set = set(made)
    ins = list(dict.fromkeys(t for s in steps for _, t in s.tensor_operands() if t not in made_set))
    outs = [t for t in made if t in g.graph_outputs or any(id(c) not in inside for c, _ in g.consumers.get(t, []))]
    return [s.pos for s in steps], ins, outs


def fuse_plan(fusion, g, segs: list, can_schedule) -> list:
    """Merge each longest run of consecutive placed segments, starting at one with a reduction, that
    `analyze` accepts and that took more than one launch, into one segment with `row` set (its
    `RowRegion`). `can_schedule(region, nodes)`: the capability table's (ok, reason)."""
    out = list(segs)
    i = 0
    while i < len(out):
        if not _candidate(out[i]) or out[i].heavy is None:
            i += 1
            continue
        best, j = None, i
        while j < len(out) and _candidate(out[j]):
            nodes, ins, outs = region_of(g, out[i:j + 1])
            region, _ = analyze(fusion, nodes, ins, outs, g.types)
            if region is None:
                break
            best = (j, region)
            j += 1
        if best is None or sum(_launches(s, g) for s in out[i:best[0] + 1]) < 2:
            i += 1
            continue
        j, region = best
        ok, reason = can_schedule(region, fusion)
        if not ok:
            i += 1
            continue
        merged = P.Seg(reason=f"{out[i].reason}; {reason}", single_block=False)
        merged.steps = sorted([s for seg in out[i:j + 1] for s in seg.steps], key=lambda s: s.key)
        merged.row = region
        merged.rebuild(g)
        out[i:j + 1] = [merged]
        i += 1
    return out


__all__ = ["RowRegion", "analyze", "fuse_plan", "read_in_place", "region_of", "row_kernel"]
