"""The segmenter (issue 3): a validated fusion + the sizes of one run -> a `Plan`.

Each segment is one kernel, one library call, or nothing (pure views), chosen so that every
scatter writes in place into a buffer nothing else reads, with as few launches as the rules allow:

1. In-place scatter. A scatter-family op writes into its `self` operand's buffer. If anything
   else reads that buffer (or `self` is a graph input, or a graph output, or a broadcast view),
   either those readers run in earlier segments ("ordered") or the scatter gets a private copy
   ("copy"), whichever moves fewer bytes across segment boundaries. A graph input is written only
   when an output declares `alias_of` it ("input"). A scatter whose result is a graph output
   shares the output's buffer, so `self` is initialised straight into it.
2. Completion. Results of scatters, reductions, scans and sorts are complete when their kernel
   ends; reading one at other positions than one's own starts a new segment.
3. Gathers (and other reads at computed positions) of data made in the same segment recompute it
   when it is pointwise in the segment's inputs; otherwise they need a boundary (rule 2).
4. Single block. A region whose tensors all fit one thread block (`Capability` limits) becomes one
   segment run by one block with barriers between phases: whole connected regions first, then
   runs of consecutive small segments.
5. Library. What codegen cannot emit (`capability.can_generate`) is a library call.
6. Pointwise ops fuse into producers and consumers; pure views cost no kernel.

Sizes stay symbolic (see shapes.py): every size-dependent decision goes through `Checks`,
whose answers define the plan's shape class, so one plan serves every size of its class.
"""

from __future__ import annotations

import sympy

from ..errors import GraphError
from ..ir import Bound, Fusion
from ..limits import NOMINAL_SM_COUNT, charge, row_threads
from ..ops.registry import LAZY_KINDS, OpKind
from ..plan import Alias, AliasMode, Copy, LibraryRoutine, Plan, Segment, SegmentKind, commits_for
from ..shapes import SizeTooComplex
from . import place as P
from .buffers import assign
from .capability import (
    DEFAULT_CAPABILITY,
    GRID,
    SINGLE_BLOCK,
    Capability,
    can_generate,
    can_schedule_rows,
    scatter_reduce_of,
)
from .graph import COPY, OTHER, WorkGraph, access, build
from .row_fusion import fuse_plan as fuse_rows
from .row_fusion import row_kernel
from .shapes import Checks, base_key, class_types, evaluate, fmt, nbytes, numel
from .sort_epilogue import fuse_plan
from .spread import joins_previous, size_phrase, spread_tensors

INPLACE, ORDERED, COPIED, INPUT = AliasMode.inplace, AliasMode.ordered, AliasMode.copy, AliasMode.input


def segment(fusion: Fusion, bound: Bound, cap: Capability = DEFAULT_CAPABILITY) -> Plan:
    """Plan `fusion` for the shape class of `bound` (from `Fusion.bind`). GraphError when a size
    the plan derives is too complex (shapes.SizeTooComplex); the passes charge their work to the
    caller's budget (limits.budget), BudgetExceeded past it."""
    try:
        return _Segmenter(fusion, bound, cap).run()
    except SizeTooComplex as e:
        raise GraphError(f"cannot plan this graph: {e.msg}") from None


def plan_checks(plan: Plan) -> Checks:
    """The size tests behind a plan, ready to `replay` at other sizes (kept off the JSON)."""
    return plan.checks


class _Segmenter:
    def __init__(self, fusion: Fusion, bound: Bound, cap: Capability):
        self.fusion, self.cap = fusion, cap
        self.checks = Checks(dict(bound.env))
        types = class_types(fusion, bound.env)
        if types is not None and not _agrees(types, bound):
            types = None
        self.exact = types is None  # inference needed the exact sizes: the class is those sizes
        if types is not None:
            self.checks.pin_dims(types)
        self.types = bound.types if types is None else types
        self.base = base_key(bound.env) if not self.exact else ",".join(
            f"{k}={v}" for k, v in sorted(bound.env.items()))
        self.library = {}
        for pos, node in enumerate(fusion.nodes):
            ok, why = can_generate(node, self.types, GRID, cap, self.checks)
            if not ok:
                self.library[pos] = f"{why} ({cap.library_routine(node.op)})"

    # ---- rule 1 ------------------------------------------------------------------------
    def conflict(self, g: WorkGraph, s: P.Step):
        """(mode, why, readers): how s may write into its self, before weighing ordered vs copy."""
        self_t = s.operands[0]
        root = g.root(self_t)
        charge(len(g.types))
        fam = g.family(root)
        readers = [(r, k) for r, k in g.readers(fam) if not (r is s and k == 0)]
        outs = [t for t in fam if t in g.graph_outputs]
        if self_t in g.broadcast:
            return COPIED, f"'{self_t}' is a broadcast view with no buffer of its own", []
        if outs:
            return COPIED, f"'{outs[0]}' is a graph output and must keep its value", []
        if root in g.graph_inputs:
            alias = [o.name for o in self.fusion.outputs if o.alias_of == root]
            if alias and not readers and self_t == root:
                return INPUT, f"writes input '{root}' in place: output '{alias[0]}' declares alias_of it", []
            if alias:
                return COPIED, (f"input '{root}' is also read by {readers[0][0].label()}" if readers else
                                f"'{self_t}' is a view of input '{root}'"), []
            return COPIED, f"'{root}' is a graph input and no output declares alias_of it", []
        if not readers:
            return INPLACE, f"in place: '{self_t}' has no other use", []
        if any(r is s for r, _ in readers):
            return COPIED, f"the scatter also reads '{self_t}' through another operand", []
        after = g.descendants(s)
        late = [r for r, _ in readers if r in after]
        if late:
            return COPIED, f"{late[0].label()} reads '{self_t}' after the scatter", []
        return ORDERED, "", [r for r, _ in readers]

    def graph(self, decisions: dict, default_copy: set = frozenset()) -> WorkGraph:
        copies = {p for p, (m, _) in decisions.items() if m == COPIED} | set(default_copy)
        return build(self.fusion, self.types, copies, self.library)

    def must_follow(self, g: WorkGraph, decisions: dict, only: set) -> dict:
        out = {}
        for step in g.steps:
            if step.pos in decisions and decisions[step.pos][0] == ORDERED and step.pos in only:
                out[step] = self.conflict(g, step)[2]
        return out

    # ---- rule 4: whole regions in one block ----------------------------------------------
    def components(self) -> list[list[int]]:
        parent = list(range(len(self.fusion.nodes)))

        def find(x):
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        first_user: dict[str, int] = {}
        for pos, node in enumerate(self.fusion.nodes):
            for t in node.tensor_inputs():
                other = self.fusion.producer.get(t, first_user.setdefault(t, pos))
                parent[find(pos)] = find(other)
        comps: dict[int, list[int]] = {}
        for pos in range(len(self.fusion.nodes)):
            comps.setdefault(find(pos), []).append(pos)
        return sorted(comps.values())

    def fits_block(self, g: WorkGraph, steps: list, leaving: set | None = None):
        """(fits, smem bytes, why not) for running `steps` in one thread block."""
        charge(len(steps))
        for s in steps:
            if s.node is not None:
                ok, why = can_generate(s.node, g.types, SINGLE_BLOCK, self.cap, self.checks)
                if not ok:
                    return False, 0, why
        tensors = sorted({t for s in steps for t in s.outputs + [x for _, x in s.tensor_operands()]})
        names = ", ".join(f"'{t}'" for t in tensors[:3]) + (", ..." if len(tensors) > 3 else "")
        sizes = [numel(tuple(g.types[t].shape)) for t in tensors]
        if not self.checks.all_le(sizes, self.cap.single_block_max_elems, f"{names} fit one thread block") and \
                spread_tensors(g, steps, self.checks, self.cap.single_block_max_elems)[0] is None:
            return False, 0, "too large for one thread block"
        smem = 0
        inside = {id(s) for s in steps}
        in_global = set(g.graph_outputs)  # outputs, and scatter selves initialised into them
        for s in sorted(steps, key=lambda s: -s.key):
            if s.is_scatter and s.outputs[0] in in_global:
                in_global.add(g.root(s.operands[0]))
        for s in steps:
            for t in s.outputs:
                if t in in_global or t in g.view_base or s.is_scatter:
                    continue  # global memory already; views and scatter results share a buffer
                if leaving is not None and any(id(c) not in inside for c, _ in g.consumers.get(t, [])):
                    continue  # leaves the block: written to global memory
                if not self.needs_smem(g, s, t):
                    continue  # each thread reads only its own element: registers suffice
                smem = smem + nbytes(g.types[t])
        if not self.checks.le(smem, self.cap.smem_budget_bytes, f"shared memory of {names}"):
            return False, smem, "intermediates exceed shared memory"
        return True, smem, ""

    def needs_smem(self, g: WorkGraph, producer, t: str) -> bool:
        """A tensor lives in shared memory when it is read across threads: made complete by a
        heavy op, read at other positions, or written in place by a scatter."""
        if producer.heavy or producer.kind == COPY:
            return True
        for c, k in g.consumers.get(t, []):
            if (c.is_scatter and k == 0) or (not c.is_scatter and access(c, k, g.types) == OTHER):
                return True
        return False

    # ---- the whole pipeline ----------------------------------------------------------------
    def run(self) -> Plan:
        nodes = self.fusion.nodes
        scatters = [p for p, n in enumerate(nodes) if n.kind is OpKind.scatter]
        decisions: dict[int, tuple[str, str]] = {}

        # Rule 4 for whole regions: decided first, since a region that fits is one segment.
        block_regions, grid_nodes = [], []
        scatter_set = set(scatters)
        for comp in self.components():
            # One block runs the region's phases in order, so a self with other readers gets an
            # in-block copy (its readers cannot go to an earlier segment inside one segment).
            tentative = dict(decisions)
            comp_scatters = [q for q in comp if q in scatter_set]
            for k, p in enumerate(comp_scatters):
                g = self.graph(tentative, default_copy=set(comp_scatters[k + 1:]))
                mode, why, readers = self.conflict(g, _step_at(g, p))
                if mode == ORDERED:
                    mode, why = COPIED, f"other readers in the same block ({readers[0].label()})"
                tentative[p] = (mode, why)
            g = self.graph(tentative)
            comp_set = set(comp)
            if self.fits_block(g, [s for s in g.steps if _pos_of(g, s) in comp_set])[0] and \
                    self.grid_launches(g, tentative, set(comp)) > 1:
                decisions = tentative
                block_regions.append(comp)
            else:
                grid_nodes.extend(comp)
        grid_set = set(grid_nodes)

        # Rule 1 for the rest: ordered or copy, whichever moves fewer bytes.
        for p in scatters:
            if p not in grid_set:
                continue
            later = {q for q in scatters if q > p and q in grid_set}
            g = self.graph(decisions, default_copy=later)
            mode, why, readers = self.conflict(g, _step_at(g, p))
            if mode != ORDERED:
                decisions[p] = (mode, why)
                continue
            trial = dict(decisions)
            trial[p] = (ORDERED, "")
            cost_ordered = self.trial_cost(trial, later, grid_set)
            trial[p] = (COPIED, "")
            cost_copy = self.trial_cost(trial, later, grid_set)
            names = ", ".join(r.label() for r in readers)
            out, self_t = nodes[p].outputs[0], nodes[p].inputs[0]
            if cost_ordered is not None and self.checks.le(
                    cost_ordered, cost_copy, f"running {names} before scatter '{out}' moves no more bytes "
                                             f"than copying '{self_t}'"):
                decisions[p] = (ORDERED, f"in place after its other readers ({names}) ran in earlier segments")
            else:
                decisions[p] = (COPIED, f"a private copy of '{self_t}' moves fewer bytes than running "
                                        f"{names} first" if cost_ordered is not None else
                                f"'{self_t}' has readers that cannot run before the scatter")

        g = self.graph(decisions)
        placed = self.place(g, decisions, grid_set)
        if placed is None:  # cannot happen when every decision was checked; stay safe: copy instead
            decisions = {p: ((COPIED, "copy (reordering formed a cycle)") if m == ORDERED else (m, w))
                         for p, (m, w) in decisions.items()}
            g = self.graph(decisions)
            placed = self.place(g, decisions, grid_set)
        segs, _, must_follow = placed
        for comp in reversed(block_regions):
            comp_set = set(comp)
            steps = [s for s in g.steps if _pos_of(g, s) in comp_set]
            ok, smem, _ = self.fits_block(g, steps)
            for s in steps:
                s.library = ""  # generated inside the block
            seg = P.Seg(reason=self.block_reason(g, steps, smem, whole=True), single_block=True)
            seg.steps = sorted(steps, key=lambda s: s.key)
            seg.smem = smem
            segs.insert(0, seg)
        segs = self.rows(g, segs)
        if self.cap.fuse_sort_epilogues:  # a library argsort with its producers/consumers: one launch
            segs = fuse_plan(self.fusion, g, segs, self.checks, self.cap.fuse_sort_histograms)
        segs = self.merge_small(g, segs, must_follow)
        return self.build_plan(g, segs, decisions)

    def grid_launches(self, g: WorkGraph, decisions: dict, nodes: set) -> int:
        """Launches the region would take as multi-block kernels (one block only pays off when
        it saves launches; a single grid kernel uses the whole GPU instead)."""
        placed = self.place(g, {p: d for p, d in decisions.items() if d[0] != ORDERED}, nodes)
        if placed is None:
            return 2
        segs = self.rows(g, placed[0])
        return sum(1 for s in segs if not all(x.kind is OpKind.view and x.outputs[0] in g.view_base
                                               for x in s.steps)) + sum(1 for s in segs if s.library)

    def rows(self, g: WorkGraph, segs: list) -> list:
        """Row-persistent reductions: runs of segments whose reductions share their innermost dims
        become one kernel where the capability table says so (row_fusion.py)."""
        if not self.cap.row_reductions:
            return segs
        return fuse_rows(self.fusion, g, segs, lambda region, fusion: can_schedule_rows(region, fusion, self.cap, self.checks))

    def trial_cost(self, decisions, later, grid_set):
        g = self.graph(decisions, default_copy={q for q in later if q not in decisions})
        placed = self.place(g, decisions, grid_set)
        if placed is None:
            return None
        return P.traffic(g, placed[0], nbytes)

    def place(self, g: WorkGraph, decisions: dict, grid_set: set):
        steps = [s for s in g.steps if _pos_of(g, s) in grid_set]
        must_follow = self.must_follow(g, decisions, grid_set)
        sub = WorkGraph(**{**g.__dict__, "steps": steps})
        order = P.topo_order(sub, must_follow)
        if order is None:
            return None
        segs, where = P.place(g, order, must_follow, self.cap.fuse_copies)
        must_precede: dict = {}
        for sc, readers in must_follow.items():
            for r in readers:
                must_precede.setdefault(r, []).append(sc)
        P.sink(g, segs, where, order, must_precede)
        segs = P.compact(segs, where)
        return segs, where, must_follow

    def block_reason(self, g: WorkGraph, steps: list, smem, whole: bool) -> str:
        what = "the whole region" if whole else "these consecutive segments"
        every = size_phrase(g, steps, self.checks, self.cap.single_block_max_elems)
        return (f"{what} ({len(steps)} ops) fits one thread block: {every} and the intermediates need {fmt(smem)} "
                f"bytes of shared memory (<= {self.cap.smem_budget_bytes}); barriers between phases replace launches")

    def merge_small(self, g: WorkGraph, segs: list, must_follow: dict) -> list:
        """Rule 4 for the rest: runs of consecutive segments that all fit one block become one."""
        ordered_pairs = {(id(r), id(sc)) for sc, rs in must_follow.items() for r in rs}
        out, run = [], []

        def close():
            if not run:
                return
            if len(run) == 1 and not (run[0].library and not run[0].single_block):
                out.extend(run)
            else:
                steps = sorted([s for seg in run for s in seg.steps], key=lambda s: s.key)
                ok, smem, _ = self.fits_block(g, steps, leaving=set())
                merged = P.Seg(reason=self.block_reason(g, steps, smem, whole=False)
                               + (f" (the first starts because {run[0].reason})" if out else ""),
                               single_block=True)
                for s in steps:
                    s.library = ""  # generated inside the block
                merged.steps = steps
                merged.smem = smem
                out.append(merged)
            run.clear()

        for seg in segs:
            candidate = [s for r in run for s in r.steps] + seg.steps
            charge(len(candidate))
            if any(s.library and not can_generate(s.node, g.types, SINGLE_BLOCK, self.cap, self.checks)[0] for s in seg.steps):
                close()
                out.append(seg)
                continue
            ids = {id(s) for s in candidate} if ordered_pairs else ()
            conflict = any(a in ids and b in ids for a, b in ordered_pairs)
            if not conflict and self.fits_block(g, candidate, leaving=set())[0]:
                run.append(seg)
                continue
            close()
            if joins_previous(out, seg, ordered_pairs, lambda steps: self.fits_block(g, steps, set())[0]):
                run.extend([out.pop(), seg])
            elif self.fits_block(g, seg.steps, leaving=set())[0]:
                run.append(seg)
            else:
                out.append(seg)
        close()
        return out

    # ---- the plan as data ---------------------------------------------------------------
    def build_plan(self, g: WorkGraph, segs: list, decisions: dict) -> Plan:
        where = {s: i for i, seg in enumerate(segs) for s in seg.steps}
        order_of = {t: k for k, t in enumerate(list(self.fusion.input_names) + [
            o for s in sorted(g.steps, key=lambda s: s.key) for o in s.outputs])}
        all_numels = [numel(tuple(t.shape)) for t in g.types.values()]
        index_bits = 32 if self.checks.all_le(all_numels, self.cap.index32_limit,
                                              "every tensor indexable with 32-bit integers") else 64
        segments = []
        for sid, seg in enumerate(segs):
            steps = sorted(seg.steps, key=lambda s: s.key)
            nodes, copies = [], []
            for s in steps:
                if s.pos is None:
                    copies.append(Copy(src=s.operands[0], dst=s.outputs[0], at=len(nodes)))
                else:
                    nodes.append(s.pos)
            made = [o for s in steps for o in s.outputs]
            made_set = set(made)
            inputs = list(dict.fromkeys(t for s in steps for _, t in s.tensor_operands() if t not in made_set))
            outputs = [t for t in made if t in g.graph_outputs or any(
                where[c] != sid for c, _ in g.consumers.get(t, []))]
            inter = [t for t in made if t not in outputs]
            aliases = []
            for s in steps:
                if s.is_scatter:
                    mode, why = decisions[s.pos]
                    if s.outputs[0] in g.graph_outputs:
                        why += f"; '{s.outputs[0]}' is a graph output, so '{s.operands[0]}' is initialised " \
                               "straight into its buffer"
                    aliases.append(Alias(tensor=s.outputs[0], buffer=s.operands[0], why=why, mode=mode))
            kind = self.kind_of(g, seg, steps)
            hints = self.hints(g, seg, steps, kind, index_bits)
            if seg.heavy is not None and seg.row is None and hints.get("single_block") is False and any(
                    s.kind in LAZY_KINDS or s.kind == COPY for s in steps if set(s.outputs) & set(outputs)):
                # the codegen's rule: a grid anchor's kernel writes the anchor's results; the
                # segment's other outputs (pointwise, views, copies) are one more launch after it
                hints["launches"] = 2
            segments.append(Segment(id=sid, kind=kind, nodes=nodes, inputs=inputs, outputs=outputs,
                                    reason=seg.reason, aliases=aliases, intermediates=inter,
                                    hints=hints, copies=copies, routine=self.routine_of(seg, kind),
                                    sort_epilogue=seg.sort_epilogue,
                                    row=None if seg.row is None else row_kernel(self.fusion, seg.row, nodes, inputs, outputs,
                                                                                g.types)))
        buffers, tensor_buffer, views, frees = assign(g, segments, where, lambda t: order_of.get(t, 1 << 30))
        checks = [c.to_dict() for c in self.checks.items]
        plan = Plan(
            fusion_id=self.fusion.id,
            shape_class=f"{self.base}{';' + self.checks.pinned_small() if self.checks.pinned_small() else ''};"
                        f"idx{index_bits};checks={self.checks.signature() or '-'}",
            segments=segments, buffers=buffers, frees=frees,
            heuristics={"index_bits": index_bits, "single_block_max_elems": self.cap.single_block_max_elems,
                        "smem_budget_bytes": self.cap.smem_budget_bytes, "grid_threads": self.cap.grid_threads,
                        "single_block_threads": self.cap.single_block_threads, "checks": checks,
                        "exact_sizes": self.exact},
            tensor_buffer=tensor_buffer, views=views,
            tensors={t: {"dtype": str(ty.dtype), "shape": [fmt(d) for d in ty.shape]}
                     for t, ty in sorted(g.types.items(), key=lambda kv: order_of.get(kv[0], 1 << 30))},
            outputs=[o.name for o in self.fusion.outputs],
            commits=commits_for(self.fusion.outputs, self.fusion.input_names, views, g.broadcast & set(views)),
            checks=self.checks)
        return plan

    def kind_of(self, g: WorkGraph, seg, steps) -> SegmentKind:
        if seg.single_block:
            return SegmentKind.single_block
        if any(s.library for s in steps):
            return SegmentKind.library
        if all(s.kind is OpKind.view and s.outputs[0] in g.view_base for s in steps):
            return SegmentKind.view
        if all(s.kind == COPY for s in steps):
            return SegmentKind.copy
        if seg.row is not None:
            return SegmentKind.row_reduction
        h = seg.heavy
        return SegmentKind(h.kind.value) if h is not None else SegmentKind.pointwise

    def hints(self, g: WorkGraph, seg, steps, kind: SegmentKind, index_bits: int) -> dict:
        sizes = [numel(tuple(g.types[t].shape)) for s in steps for t in s.outputs + [x for _, x in s.tensor_operands()]]
        static = [n for n in sizes if isinstance(n, int)]
        symbolic = sorted({n for n in sizes if not isinstance(n, int)}, key=str)
        if symbolic:
            elems = symbolic[0] if len(symbolic) == 1 and not static else sympy.Max(*(symbolic + [max(static, default=0)]))
        else:
            elems = max(static, default=0)
        if kind is SegmentKind.view:
            return {"launch": False}
        if kind is SegmentKind.library:
            return {"launch": True, "index_bits": index_bits}
        if kind is SegmentKind.single_block:
            threads = self.cap.single_block_threads
            if isinstance(elems, int):
                threads = max(32, min(threads, -(-elems // 32) * 32))
            return {"launch": True, "single_block": True, "blocks": 1, "threads": threads,
                    "intermediate_smem_bytes": fmt(seg.smem), "elements": fmt(elems), "index_bits": index_bits}
        t = self.cap.grid_threads
        blocks = -(-elems // t) if isinstance(elems, int) else sympy.ceiling(elems / t)
        out = {"launch": True, "single_block": False, "threads": t, "blocks": fmt(blocks),
               "elements": fmt(elems), "index_bits": index_bits}
        if seg.row is not None:
            rg = seg.row
            rows, length = numel(tuple(rg.kept)), numel(tuple(rg.row))
            lanes = row_threads(length, rows if isinstance(rows, int) else 1 << 30, NOMINAL_SM_COUNT) \
                if isinstance(length, int) else 1024  # (the code generator's choice at these sizes)
            out.update(blocks=fmt(rows), threads=lanes, anchor=self.anchor_hint(g, seg.heavy))
        elif seg.heavy is not None:
            out["anchor"] = self.anchor_hint(g, seg.heavy)
            if seg.heavy.kind in (OpKind.scan, OpKind.sort):
                out["blocks"] = out["anchor"]["rows"]  # codegen runs one block per row
        return out

    def routine_of(self, seg, kind: SegmentKind) -> LibraryRoutine | None:
        """What a library segment runs: the fused sort's routine, the op's library sort, else none."""
        if kind is not SegmentKind.library:
            return None
        if seg.sort_epilogue is not None:
            return LibraryRoutine.sort_epilogue
        op = next(s for s in seg.steps if s.library).node.op
        return LibraryRoutine.library_sort if op.library_sort is not None else LibraryRoutine.kernel_or_host

    def anchor_hint(self, g: WorkGraph, h) -> dict:
        """What the kernel's one reduction/scan/sort/scatter iterates over."""
        node = h.node
        hint = {"op": node.op.name, "node": h.pos}
        if h.is_scatter:
            hint.update(reduce=scatter_reduce_of(node), index_elements=fmt(numel(tuple(g.types[h.operands[1]].shape))))
            return hint
        x = g.types[h.operands[0]]
        dims = getattr(node.attrs, "dims", getattr(node.attrs, "dim", None))
        if x.rank == 0:
            dims = []
        elif dims is None:
            dims = list(range(x.rank))
        else:
            dims = sorted(d % x.rank for d in ([dims] if isinstance(dims, int) else dims))
        hint.update(dims=dims, row_length=fmt(numel(tuple(x.shape[d] for d in dims))),
                    rows=fmt(numel(tuple(n for d, n in enumerate(x.shape) if d not in dims))))
        return hint


def _agrees(types: dict, bound: Bound) -> bool:
    """The class types, evaluated at the run's sizes, are the run's types."""
    for name, t in bound.types.items():
        c = types[name]
        if c.dtype is not t.dtype or len(c.shape) != len(t.shape) or any(
                evaluate(d, bound.env) != n for d, n in zip(c.shape, t.shape)):
            return False
    return True


def _step_at(g: WorkGraph, pos: int) -> P.Step:
    return next(s for s in g.steps if s.pos == pos)


def _pos_of(g: WorkGraph, s: P.Step) -> int:
    """The fusion position a step belongs to (a copy belongs to its scatter)."""
    if s.pos is not None:
        return s.pos
    return g.consumers[s.outputs[0]][0][0].pos
