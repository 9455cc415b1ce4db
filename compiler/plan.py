"""The plan: what the segmenter decides, as plain data (printable, diffable, testable on CPU).

A `Plan` lists `Segment`s in execution order. Each segment becomes exactly one kernel launch,
one library call, or nothing at all (a pure view). Backends (NumPy, CuPy) execute plans; the
CUDA renderer turns one segment into one kernel.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields, replace
from enum import Enum
from typing import TypedDict

from .ops.registry import OpDef


class SegmentKind(str, Enum):
    pointwise = "pointwise"  # elementwise ops, creation, views and movement fused into one grid
    reduction = "reduction"
    row_reduction = "row_reduction"  # reductions over the same innermost dims + pointwise work: a block per row
    scan = "scan"
    sort = "sort"
    gather = "gather"
    scatter = "scatter"  # writes in place into its self buffer
    single_block = "single_block"  # one thread block, phases separated by barriers
    library = "library"  # a backend routine (CuPy on the GPU) instead of generated code
    view = "view"  # no kernel: only metadata changes
    copy = "copy"  # a private copy of a scatter's self (rule 1)


class AliasMode(str, Enum):
    """How rule 1 (a scatter writes into its self's buffer only if nothing reads self later) was met."""

    inplace = "inplace"  # self has no other use
    ordered = "ordered"  # its other readers run in earlier segments
    copy = "copy"  # a private copy of self; the alias's `buffer` names the copy
    input = "input"  # writes a graph input that an output declares alias_of


@dataclass
class Alias:
    """`tensor` is written into the buffer of `buffer` (a scatter's output shares its self's buffer)."""

    tensor: str
    buffer: str
    why: str = ""
    mode: AliasMode = AliasMode.inplace

    def __post_init__(self):
        self.mode = AliasMode(self.mode)


@dataclass
class Copy:
    """A private copy of a scatter's self: `dst` gets `src`'s data before the scatter writes into it.

    It runs after the segment's first `at` nodes (0: at the start), inside the segment's kernel."""

    src: str
    dst: str
    at: int = 0


class LibraryRoutine(str, Enum):
    """What a library segment runs (the backend maps each to its routine)."""

    sort_epilogue = "sort_epilogue"  # the radix sort's fused variant: `Segment.sort_epilogue`
    library_sort = "library_sort"  # the op's library sort (`OpDef.library_sort`; `OpDef.library` says which)
    kernel_or_host = "kernel_or_host"  # no routine: a grid kernel, else the host reference

    def describe(self, op: OpDef | None = None) -> str:
        """What runs, in words (`segfuse explain`); `op`: the segment's library op."""
        if self is LibraryRoutine.sort_epilogue:
            return "segfuse.radix_sort+epilogue"
        if self is LibraryRoutine.library_sort and op is not None and op.library:
            return op.library
        return "a grid kernel, else the host reference"


@dataclass(frozen=True)
class RowKernel:
    """A row_reduction segment's kernel as the planner decided it (compiler/segmenter/row_fusion.py):
    a block (or a warp) owns a row and runs every reduction of the row and the pointwise work around
    them. Sizes are the shape class's (for display); the code generator takes the concrete rows and
    row length from the run's types, with the same dims."""

    reductions: tuple  # node positions of the reductions, in order
    rank: int  # the rank of the row-shaped tensors
    dims: tuple  # the reduced dims (a trailing run)
    rows: int | str
    row_length: int | str
    full_outputs: tuple  # segment outputs stored per element of a row
    row_outputs: tuple  # segment outputs stored once per row
    cached_inputs: tuple  # segment inputs of the row's shape read only at their own row
    in_place: tuple  # segment inputs every op reads at the element it computes (row_fusion.read_in_place)
    combined: tuple  # per reduction, the tensor it combines (its input, or the source of an identity pad)


@dataclass(frozen=True)
class SortHistogram:
    """The keys' histogram a fused sort writes (compiler/segmenter/sort_epilogue.py): the keys' low
    byte is the bin."""

    scatter: int  # node position of the histogram scatter
    counts: str
    bins: int
    csum: str | None = None  # cumsum(counts), inclusive
    offsets: str | None = None  # pad(csum, [1, 0]): exclusive offsets and the total
    outputs: tuple = ()  # which of counts, csum, offsets are segment outputs


@dataclass(frozen=True)
class SortEpilogue:
    """A multi-block sort whose consumers run in its last pass (compiler/segmenter/sort_epilogue.py
    matched it; compiler/codegen/sort_epilogue.py renders it)."""

    argsort: int  # node position of the sort
    key: str  # the segment input holding the keys, in the row's element order
    descending: bool
    order: str  # the argsort's output
    stores: tuple  # position tensors stored at pos (segment outputs), in output order
    scatters: tuple  # (node position, target needs a phase-0 init) per scatter
    producer: dict  # tensor -> node position, for every tensor made in the region
    hist: SortHistogram | None = None

    @classmethod
    def from_dict(cls, d: dict) -> SortEpilogue:
        h = d.get("hist")
        return cls(**{**d, "stores": tuple(d["stores"]), "scatters": tuple(tuple(x) for x in d["scatters"]),
                      "hist": None if h is None else SortHistogram(**{**h, "outputs": tuple(h["outputs"])})})


class SegmentHints(TypedDict, total=False):
    """The keys a segment's `hints` may hold (tests/test_plan_fields.py checks every plan's)."""

    launch: bool  # False: a pure view, nothing runs
    index_bits: int  # 32 or 64: the index type of the kernel's offsets (compiler/limits.py)
    single_block: bool
    blocks: int | str  # an int when static, else an expression in the size symbols
    threads: int
    # single-block: the bytes of intermediates the planner counts against the shared-memory budget
    # (Capability.smem_budget_bytes). Not the kernel's shared memory: that is the code generator's
    # (each launch's `smem` plus its static arrays), which may also stage scatter targets and sort
    # keys; the plan layer runs no codegen, so the name says what the planner knows.
    intermediate_smem_bytes: int | str
    elements: int | str
    anchor: dict  # the heavy op's geometry (rows, row length, axis) in grid segments
    launches: int  # 2: a grid anchor's kernel, then one for the segment's other outputs (default 1)


@dataclass
class Commit:
    """How a backend returns one graph output, once the whole run succeeded (the one commit rule).

    `alias_of`: the output is written into that input, and the input is returned. `copy`: the
    output is a graph input or a view of one (`Plan.views`), so it is returned as a copy (an output
    never exposes an input's buffer), or a broadcast view (stride 0), returned as a dense copy (an
    output is always dense and writable). Copies are taken before any alias is written, so an
    output `reshape(x)` keeps x's old value when another output updates x in place."""

    name: str
    alias_of: str | None = None
    copy: bool = False


def commits_for(outputs, input_names, views: dict, broadcast=frozenset()) -> list[Commit]:
    """The commit of each graph output (`outputs`: objects with `.name` and `.alias_of`, as
    `Fusion.outputs`), given the plan's views and which of them are broadcasts."""
    inputs = set(input_names)

    def root(t):
        while t in views:
            t = views[t]
        return t

    return [Commit(o.name, o.alias_of, copy=o.alias_of is None and (root(o.name) in inputs or o.name in broadcast))
            for o in outputs]


@dataclass
class Segment:
    id: int
    kind: SegmentKind
    nodes: list[int]  # positions in Fusion.nodes, in execution order
    inputs: list[str]  # tensors read that were made outside this segment
    outputs: list[str]  # tensors made here that are read later or are graph outputs
    reason: str  # why a boundary starts this segment
    aliases: list[Alias] = field(default_factory=list)
    intermediates: list[str] = field(default_factory=list)  # made and consumed inside (registers/smem)
    hints: SegmentHints = field(default_factory=dict)  # launch geometry and heuristics
    copies: list[Copy] = field(default_factory=list)  # private copies made in this segment (rule 1)
    routine: LibraryRoutine | None = None  # library segments: what runs
    # a library segment the sort epilogue pass made: a multi-block sort whose consumers run in its last pass
    sort_epilogue: SortEpilogue | None = None
    row: RowKernel | None = None  # row_reduction segments: the row kernel's plan

    def __post_init__(self):
        if self.routine is not None:
            self.routine = LibraryRoutine(self.routine)

    @property
    def fused_sort(self) -> bool:
        return self.sort_epilogue is not None


@dataclass
class Buffer:
    """A device allocation. Several tensors may share one buffer (aliases, reuse after last use)."""

    id: int
    nbytes: int | str  # an int when static, else an expression in the size symbols ("8*K*T")
    tensors: list[str]
    kind: str = "intermediate"  # intermediate | output | input
    live: list[int] = field(default_factory=list)  # [first segment writing it, last segment using it]


def _nbytes(t) -> int:
    return math.prod(int(d) for d in t.shape) * t.dtype.itemsize


def bytes_needed(plan: Plan, types: dict, host_arrays: bool = False) -> int:
    """The bytes a run of `plan` allocates where it runs, at the concrete `types` of its tensors
    (`Fusion.bind`): its buffers other than the inputs' (outputs, and intermediates after reuse:
    each buffer at its largest tensor), and as much again as a library segment's outputs (the
    routine's scratch). `host_arrays`: the backend keeps every tensor a segment makes in registers
    or shared memory as an array until the segment ends, and makes each op's result (and a
    temporary in its compute type) before it moves into its buffer (the NumPy plan executor): add
    the largest such segment's, and twice the largest tensor at 8 bytes an element."""
    types = dict(types)
    for seg in plan.segments:
        for c in seg.copies:
            types[c.dst] = types[c.src]
    total = 0
    for b in plan.buffers:
        if b.kind != "input":
            total += max((_nbytes(types[t]) for t in b.tensors if t in types), default=0)
    for seg in plan.segments:
        if seg.kind is SegmentKind.library:
            total += sum(_nbytes(types[t]) for t in seg.outputs if t in types)
    if host_arrays:
        in_buffers = set(plan.tensor_buffer) | set(plan.views)
        total += max((sum(_nbytes(types[t]) for t in seg.intermediates if t not in in_buffers and t in types)
                      for seg in plan.segments), default=0)
        total += 2 * 8 * max((math.prod(int(d) for d in t.shape) for t in types.values()), default=0)
    return total


@dataclass
class Plan:
    fusion_id: str
    shape_class: str
    segments: list[Segment]
    buffers: list[Buffer] = field(default_factory=list)
    frees: dict = field(default_factory=dict)  # segment id -> tensors whose last use it is
    heuristics: dict = field(default_factory=dict)
    # Added by the segmenter (issue 3):
    tensor_buffer: dict = field(default_factory=dict)  # tensor -> Buffer.id holding its data
    views: dict = field(default_factory=dict)  # tensor -> tensor whose buffer it views (no data moves)
    tensors: dict = field(default_factory=dict)  # tensor -> {"dtype", "shape"} (class shapes)
    outputs: list = field(default_factory=list)  # graph outputs, in order
    commits: list[Commit] = field(default_factory=list)  # how each graph output is returned, in order
    # The size tests behind the plan (segmenter.shapes.Checks), replayed by the plan cache at other
    # sizes of the class; not plan data: kept off the JSON and out of comparisons.
    checks: object = field(default=None, repr=False, compare=False)

    def output_commits(self, fusion) -> list[Commit]:
        """The commit of each graph output: the plan's, or (a plan made without them, such as an
        older plan's JSON) derived from `fusion`'s outputs and the plan's views."""
        return self.commits or commits_for(fusion.outputs, fusion.input_names, self.views)

    def to_dict(self) -> dict:
        d = asdict(replace(self, checks=None))  # (the checks are not plan data)
        d.pop("checks")
        for s in d["segments"]:
            s["kind"] = str(s["kind"].value if isinstance(s["kind"], Enum) else s["kind"])
            for a in s["aliases"]:
                a["mode"] = a["mode"].value
            if s["routine"] is not None:
                s["routine"] = s["routine"].value
        return d

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    @property
    def kernel_count(self) -> int:
        """Launches: one per segment (a library call counts as one; a grid anchor's segment with
        other outputs too, `hints.launches`, two), none for pure views."""
        return sum(s.hints.get("launches", 1) for s in self.segments if s.kind is not SegmentKind.view)

    @classmethod
    def from_dict(cls, d: dict) -> Plan:
        def row(r):
            return None if r is None else RowKernel(**{k: tuple(v) if isinstance(v, list) else v for k, v in r.items()})

        def sort_epilogue(e):
            return None if e is None else SortEpilogue.from_dict(e)

        segs = [Segment(**{**{k: v for k, v in s.items() if k != "fused_sort"}, "kind": SegmentKind(s["kind"]),
                           "aliases": [Alias(**a) for a in s["aliases"]],
                           "copies": [Copy(**c) for c in s.get("copies", [])], "row": row(s.get("row")),
                           "sort_epilogue": sort_epilogue(s.get("sort_epilogue"))}) for s in d["segments"]]
        bufs = [Buffer(**b) for b in d.get("buffers", [])]
        commits = [Commit(**c) for c in d.get("commits", [])]
        known = {f.name for f in fields(cls)} - {"checks"}
        return cls(**{**{k: v for k, v in d.items() if k in known}, "segments": segs, "buffers": bufs,
                      "commits": commits})
