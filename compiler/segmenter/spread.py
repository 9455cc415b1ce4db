"""Single-block segments whose first phase is a histogram over more sources than one block walks
well: codegen's multi-block histogram (compiler/codegen/scatter_block.py, `_histogram_blocks`)
spreads that phase over up to one block per SM, each keeping its partial in shared memory, and
the last block to finish combines them and runs the rest of the segment alone. So the tensors only
that phase reads may be longer than `Capability.single_block_max_elems`: the MoE prologue's
counts and expert offsets (a histogram of T*K ids, then a scan of E counts) stay one launch at
T = 16384 and 65536 instead of three (zeros, the scatter, the scan).

`spread_tensors` answers for the planner's size test (pipeline.fits_block): the long tensors are
segment inputs, their views, or lazy ops of those (full_like, pointwise) that only the leading
scatter reads (never a shared-memory tensor, never stored by the block), and the scatter is one
codegen privatizes: it accumulates (include_self) into a small target that leaves the segment.
"""

from __future__ import annotations

from ..limits import HIST_BLOCK_SOURCES, NOMINAL_SM_COUNT
from ..ops.registry import LAZY_KINDS, OpKind
from .capability import scatter_reduce_of
from .shapes import numel

# The histogram target's elements at most: codegen keeps >= 2 warp-group replicas of it in shared
# memory in 32 KiB (8-byte counters), its privatization condition (scatter_block._privatized)
MAX_TARGET = 2048
# Sources at most: one batch per SM (limits.HIST_BLOCK_SOURCES), the regime the shared phase was
# made for (MoE ids up to T = 65536: 4 to 64 blocks). Longer domains keep the grid scatter kernel,
# which the saved fill launch would not pay for.
MAX_SOURCES = NOMINAL_SM_COUNT * HIST_BLOCK_SOURCES


def spread_tensors(g, steps: list, checks, limit) -> tuple[list | None, str]:
    """(the tensors over `limit` elements, "") when every one is read only by the leading
    histogram of `steps` (see the module doc), else (None, why not). The structural tests come
    first; then it records in `checks` (the plan's shape class) that the other tensors and the
    histogram's target are small."""
    heavy = sorted((s for s in steps if s.heavy), key=lambda s: s.key)
    if not heavy or not heavy[0].is_scatter or heavy[0].node is None:
        return None, "its first phase is not a scatter"
    h = heavy[0]
    nd = h.node
    if scatter_reduce_of(nd) == "none" or not getattr(nd.attrs, "include_self", False):
        return None, f"{h.label()} does not accumulate into its target"
    target, self_t = h.outputs[0], h.operands[0]
    made = {o: s for s in steps for o in s.outputs}
    if len(heavy) < 2 and (self_t not in made or made[self_t].kind is not OpKind.creation):
        return None, "one launch either way"  # (a grid scatter into a target made elsewhere)
    inside = {id(s) for s in steps}
    if target not in g.graph_outputs and all(id(c) in inside for c, _ in g.consumers.get(target, [])):
        return None, f"{h.label()} does not leave the segment (its privatized form needs that)"
    tensors = sorted({t for s in steps for t in s.outputs + [x for _, x in s.tensor_operands()]})
    spread = [t for t in tensors if t not in (target, self_t) and _histogram_only(g, t, h, made, inside)]
    rest = [numel(tuple(g.types[t].shape)) for t in tensors if t not in spread]
    if not checks.all_le(rest, limit, "the tensors the histogram does not read alone fit one thread block"):
        return None, "a tensor other than the histogram's sources is too large for one thread block"
    if not checks.le(numel(tuple(g.types[target].shape)), MAX_TARGET, f"the target of {h.label()} is small"):
        return None, f"the target of {h.label()} is too large to privatize"
    if not checks.le(numel(tuple(g.types[h.operands[1]].shape)), MAX_SOURCES,
                     f"the sources of {h.label()} are one batch per SM"):
        return None, f"{h.label()} has more sources than one batch per SM"
    long = [t for t in spread if not checks.le(numel(tuple(g.types[t].shape)), limit, f"'{t}' fits one thread block")]
    return long, ""


def _histogram_only(g, t, h, made: dict, inside: set) -> bool:
    """Whether tensor t may be longer than one block walks well: an input, a view or a lazy op
    (computed per source, never stored by the block) that only the histogram `h` reads (as its
    index or source), directly or through other such tensors."""
    p = made.get(t)
    if p is not None and (p.kind not in LAZY_KINDS or p.kind is OpKind.gather):
        return False
    if t in g.graph_outputs and p is not None:
        return False
    for c, k in g.consumers.get(t, []):
        if id(c) not in inside:
            if p is not None and t not in g.view_base:
                return False  # it would be stored by one block
            continue
        if c is h and k != 0:
            continue
        if c.kind in LAZY_KINDS and c.kind is not OpKind.gather and all(
                _histogram_only(g, o, h, made, inside) for o in c.outputs):
            continue
        return False
    return True


def size_phrase(g, steps: list, checks, limit) -> str:
    """What a single-block segment's reason says of its tensors' sizes."""
    sizes = [numel(tuple(g.types[t].shape)) for s in steps for t in s.outputs + [x for _, x in s.tensor_operands()]]
    long = None if checks.all_le(sizes, limit, "") else spread_tensors(g, steps, checks, limit)[0]
    if not long:
        return f"every tensor has at most {limit} elements"
    return (f"every tensor but {', '.join(repr(t) for t in long)} (read only by the first phase, a histogram "
            f"that the grid's blocks share) has at most {limit} elements")


def joins_previous(out: list, seg, ordered_pairs: set, fits) -> bool:
    """Whether `seg`, starting a run of segments that merge into one block (pipeline.merge_small),
    takes the segment before it along: one that does not fit a block alone but does with `seg`
    (lazy views of long inputs before the histogram that reads them). `fits(steps)`: the
    planner's fits_block."""
    prev = out[-1] if out and not out[-1].single_block and not out[-1].library else None
    if prev is None:
        return False
    both = prev.steps + seg.steps
    return not any((id(a), id(b)) in ordered_pairs for a in both for b in both) and \
        not fits(prev.steps) and fits(both)


__all__ = ["MAX_TARGET", "joins_previous", "size_phrase", "spread_tensors"]
