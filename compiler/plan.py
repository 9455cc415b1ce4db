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


@dataclass
class Buffer:
    """A device allocation. Several tensors may share one buffer (aliases, reuse after last use)."""

    id: int
    nbytes: int
    tensors: list[str]
    kind: str = "intermediate"  # intermediate | output | input


@dataclass
class Plan:
    fusion_id: str
    shape_class: str
    segments: list[Segment]
    buffers: list[Buffer] = field(default_factory=list)
    frees: dict = field(default_factory=dict)  # segment id -> tensors whose last use it is
    heuristics: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        for s in d["segments"]:
            s["kind"] = str(s["kind"].value if isinstance(s["kind"], Enum) else s["kind"])
        return d

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=True)

    @property
    def kernel_count(self) -> int:
        return sum(1 for s in self.segments if s.kind not in (SegmentKind.view,))
