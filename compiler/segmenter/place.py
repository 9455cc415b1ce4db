"""Placing steps into multi-block segments (rules 1-3, 5, 6), then sinking cheap producers
into their consumers' kernels.

Placement walks the steps in a topological order and puts each into the earliest segment it may
join: not before any producer's segment, strictly after it when the rules demand that the
producer's result be complete (a boundary), and only into a segment that can hold it (one
reduction/scan/sort/scatter per multi-block kernel; a library call is alone). Segments stay in
a topological order because a step never goes before its producers.

Placing eagerly would materialise cheap tensors (a `full_like` of ones, an `iota`) that are better
recomputed inside their consumer's kernel, so a second pass sinks light steps whose consumers all
sit in one later segment into that segment (rule 6: pointwise ops fuse into their consumers).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..limits import charge
from .graph import COPY, NONE, OWN, Step, WorkGraph, access

SCATTERED, COMPLETE_OWN = "scattered", "own"  # why a tensor made in a segment is not yet readable


@dataclass(eq=False)
class Seg:
    steps: list = field(default_factory=list)
    reason: str = ""
    single_block: bool = False
    smem: object = 0  # shared memory bytes of a single-block segment
    made: dict = field(default_factory=dict)  # tensor -> Step making it here
    late: dict = field(default_factory=dict)  # tensor -> SCATTERED | COMPLETE_OWN (absent: recomputable)
    sort_epilogue: object = None  # the sort epilogue pass merged it: its plan.SortEpilogue
    row: object = None  # the row-persistent pass merged it: its row_fusion.RowRegion

    @property
    def fused_sort(self) -> bool:
        return self.sort_epilogue is not None

    @property
    def library(self) -> bool:
        return any(s.library for s in self.steps)

    @property
    def heavy(self) -> Step | None:
        return next((s for s in self.steps if s.heavy and not s.library), None)

    def add(self, step: Step, g: WorkGraph) -> None:
        self.steps.append(step)
        self._mark(step, g)

    def _mark(self, step: Step, g: WorkGraph) -> None:
        late = None
        if step.heavy:
            late = SCATTERED if step.is_scatter else COMPLETE_OWN
        elif any(self.late.get(t) and access(step, k, g.types) == OWN for k, t in step.tensor_operands()):
            late = COMPLETE_OWN  # an epilogue of a heavy op at its own position
        for o in step.outputs:
            self.made[o] = step
            if late:
                self.late[o] = late

    def rebuild(self, g: WorkGraph) -> None:
        self.steps.sort(key=lambda s: s.key)
        self.made, self.late = {}, {}
        for s in self.steps:
            self._mark(s, g)

    def self_made_here(self, t: str, g: WorkGraph) -> bool:
        """Whether a scatter's `self` t gets its data in this segment (views of earlier data are free)."""
        while t in self.made:
            if t not in g.view_base:
                return True
            t = g.view_base[t]
        return False


def boundary(seg: Seg, t: str, step: Step, k: int, g: WorkGraph) -> str | None:
    """Why `step` cannot read operand k (tensor t) inside `seg`; None when it can."""
    if step.is_scatter and k == 0 and seg.self_made_here(t, g):
        return (f"scatter '{step.outputs[0]}' writes in place into '{t}', whose data must be complete "
                "before a multi-block kernel writes into it")
    p = seg.made.get(t)
    if p is None:
        return None
    if p.library:
        return f"{step.label()} reads '{t}', made by the library call {p.label()}"
    late = seg.late.get(t)
    how = access(step, k, g.types)
    if late == SCATTERED and how != NONE:
        return f"{step.label()} reads '{t}', which {seg.heavy.label()} completes only when its kernel ends"
    if late == COMPLETE_OWN and how not in (NONE, OWN):
        return (f"{step.label()} reads '{t}' at other positions; {seg.heavy.label()} completes it only "
                "when its kernel ends")
    return None


def incompatible(seg: Seg, step: Step, fuse_copies: bool = True, seg_library: bool | None = None) -> str | None:
    """Why `step` cannot share `seg`'s kernel at all; None when it can. `seg_library`: whether
    seg holds a library step, when the caller keeps track (each look is a pass over its steps)."""
    if not fuse_copies and seg.steps and ((step.kind == COPY) != all(s.kind == COPY for s in seg.steps)):
        return f"{step.label()} is a copy and copies run as their own segment"
    if step.library:
        return f"{step.label()} runs as a library call: {step.library}"
    if seg.library if seg_library is None else seg_library:
        return f"{seg.steps[0].label()} is a library call and shares its segment with nothing"
    h = seg.heavy if step.heavy else None
    if h is not None:
        return (f"{step.label()} cannot share a multi-block kernel with {h.label()} "
                "(one reduction, scan, sort or scatter per kernel)")
    return None


def topo_order(g: WorkGraph, must_follow: dict) -> list[Step] | None:
    """Steps in graph order, moved only as far as `must_follow` (step -> steps before it) needs;
    None when those constraints form a cycle."""
    import heapq

    members = set(g.steps)
    preds: dict = {s: set() for s in g.steps}
    for s in g.steps:
        for _, t in s.tensor_operands():
            if t in g.producer and g.producer[t] in members:
                preds[s].add(g.producer[t])
    for s, before in must_follow.items():
        preds[s] |= set(before) & members
    succs: dict = {s: [] for s in g.steps}
    for s, ps in preds.items():
        for p in ps:
            succs[p].append(s)
    waiting = {s: len(ps) for s, ps in preds.items()}
    ready = [(s.key, id(s), s) for s in g.steps if not waiting[s]]
    heapq.heapify(ready)
    order = []
    while ready:
        _, _, s = heapq.heappop(ready)
        order.append(s)
        for c in succs[s]:
            waiting[c] -= 1
            if not waiting[c]:
                heapq.heappush(ready, (c.key, id(c), c))
    return order if len(order) == len(g.steps) else None


def place(g: WorkGraph, order: list[Step], must_follow: dict, fuse_copies: bool = True) -> tuple[list[Seg], dict]:
    segs: list[Seg] = []
    has_library: list[bool] = []  # per segment: whether it holds a library step (Seg.library)
    where: dict[Step, int] = {}
    charge(len(order))
    for step in order:
        earliest, why = 0, None
        for k, t in step.tensor_operands():
            p = g.producer.get(t)
            if p is None:
                continue
            i = where[p]
            b = boundary(segs[i], t, step, k, g)
            cand = i + 1 if b else i
            if cand > earliest:
                earliest, why = cand, b
            elif cand == earliest and b and why and b not in why:
                why = f"{why}; {b}"  # several reasons cut at the same place: say them all
        for r in must_follow.get(step, ()):
            b = (f"scatter '{step.outputs[0]}' writes in place into '{step.operands[0]}', "
                 f"which {r.label()} also reads")
            if where[r] + 1 > earliest:
                earliest, why = where[r] + 1, b
            elif where[r] + 1 == earliest and why and b not in why:
                why = f"{why}; {b}"
        target, last_bad = None, None
        for j in range(earliest, len(segs)):
            bad = incompatible(segs[j], step, fuse_copies, has_library[j])
            if bad is None:
                target = j
                break
            last_bad = bad
        if target is None:
            if step.library:
                reason = f"{step.label()} runs as a library call: {step.library}"
            elif earliest >= len(segs):
                reason = why or "first segment"
            else:
                reason = last_bad
            segs.append(Seg(reason=reason))
            has_library.append(False)
            target = len(segs) - 1
        segs[target].add(step, g)
        has_library[target] = has_library[target] or bool(step.library)
        where[step] = target
    return segs, where


def sink(g: WorkGraph, segs: list[Seg], where: dict, order: list[Step], must_precede: dict) -> None:
    """Move light steps into the one later segment that consumes them (recompute, not materialise)."""
    for step in reversed(order):
        if step.heavy or step.library or step.kind == COPY:
            continue
        if any(o in g.graph_outputs for o in step.outputs):
            continue
        cons = [c for o in step.outputs for c, _ in g.consumers.get(o, [])]
        targets = {where[c] for c in cons}
        if len(targets) != 1:
            continue
        i, j = where[step], targets.pop()
        if j <= i or segs[j].library or all(s.kind == COPY for s in segs[j].steps):
            continue
        if any(where[sc] <= j for sc in must_precede.get(step, ())):
            continue  # a scatter writes its operand in place after it: it must stay earlier
        src, dst = segs[i], segs[j]
        src.steps.remove(step)
        dst.steps.append(step)
        dst.rebuild(g)
        if any(s.is_scatter and dst.self_made_here(s.operands[0], g) for s in dst.steps):
            dst.steps.remove(step)  # it would make a scatter's self inside the scatter's kernel
            src.steps.append(step)
            dst.rebuild(g)
            src.rebuild(g)
            continue
        src.rebuild(g)
        where[step] = j


def compact(segs: list[Seg], where: dict) -> list[Seg]:
    keep = [s for s in segs if s.steps]
    index = {id(s): n for n, s in enumerate(keep)}
    for step, i in list(where.items()):
        where[step] = index[id(segs[i])]
    return keep


def traffic(g: WorkGraph, segs: list[Seg], nbytes) -> object:
    """Bytes read and written across segment boundaries: the cost rule 1 minimises."""
    total = 0
    for seg in segs:
        made = {o for s in seg.steps for o in s.outputs}
        read = {t for s in seg.steps for _, t in s.tensor_operands() if t not in made}
        written = {t for t in made if t in g.graph_outputs or any(
            c not in seg.steps for c, _ in g.consumers.get(t, []))}
        for t in sorted(read | written):
            if t in g.view_base and t not in g.broadcast and t in written:
                continue  # a view of data already written costs nothing
            total = total + nbytes(g.types[t])
    return total
