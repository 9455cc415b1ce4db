"""The plan: what the segmenter decides, as plain data (printable, diffable, testable on CPU).

A `Plan` lists `Segment`s in execution order. Each segment becomes exactly one kernel launch,
one library call, or nothing at all (a pure view). Backends (NumPy, CuPy) execute plans; the
CUDA renderer turns one segment into one kernel.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from enum import Enum


class SegmentKind(str, Enum):
    pointwise = "pointwise"  # elementwise ops, creation, views and movement fused into one grid
    reduction = "reduction"
    scan = "scan"
    sort = "sort"
    gather = "gather"
    scatter = "scatter"  # writes in place into its self buffer
    single_block = "single_block"  # one thread block, phases separated by barriers
    library = "library"  # a backend routine (CuPy on the GPU) instead of generated code
    view = "view"  # no kernel: only metadata changes
    copy = "copy"  # a private copy of a scatter's self (rule 1)


@dataclass
class Alias:
    """`tensor` is written into the buffer of `buffer` (a scatter's output shares its self's buffer)."""

    tensor: str
    buffer: str
    why: str = ""
    # How rule 1 was satisfied: "inplace" (self has no other use), "ordered" (its other readers
    # run in earlier segments), "copy" (a private copy; `buffer` names it), "input" (writes a
    # graph input that an output declares alias_of).
    mode: str = "inplace"


@dataclass
class Copy:
    """A private copy of a scatter's self: `dst` gets `src`'s data before the scatter writes into it.

    It runs after the segment's first `at` nodes (0: at the start), inside the segment's kernel."""

    src: str
    dst: str
    at: int = 0


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
    hints: dict = field(default_factory=dict)  # launch geometry and heuristics (threads, blocks, ...)
    copies: list[Copy] = field(default_factory=list)  # private copies made in this segment (rule 1)


@dataclass
class Buffer:
    """A device allocation. Several tensors may share one buffer (aliases, reuse after last use)."""

    id: int
    nbytes: int | str  # an int when static, else an expression in the size symbols ("8*K*T")
    tensors: list[str]
    kind: str = "intermediate"  # intermediate | output | input
    live: list[int] = field(default_factory=list)  # [first segment writing it, last segment using it]


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

    def segment_of(self, tensor: str) -> Segment | None:
        """The segment making `tensor` (None for a graph input)."""
        for s in self.segments:
            if tensor in s.outputs or tensor in s.intermediates:
                return s
        return None

    def to_dict(self) -> dict:
        d = asdict(self)
        for s in d["segments"]:
            s["kind"] = str(s["kind"].value if isinstance(s["kind"], Enum) else s["kind"])
        return d

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    @property
    def kernel_count(self) -> int:
        """Launches: one per segment, except pure views (library calls count as one)."""
        return sum(1 for s in self.segments if s.kind not in (SegmentKind.view,))

    @classmethod
    def from_dict(cls, d: dict) -> Plan:
        segs = [Segment(**{**s, "kind": SegmentKind(s["kind"]), "aliases": [Alias(**a) for a in s["aliases"]],
                           "copies": [Copy(**c) for c in s.get("copies", [])]}) for s in d["segments"]]
        bufs = [Buffer(**b) for b in d.get("buffers", [])]
        return cls(**{**d, "segments": segs, "buffers": bufs})
