"""`KernelInput`: what a kernel family's renderer reads of a segment, once the driver
(segment.py) has placed its tensors. Renderers get this value, not the driver, and hand back what
they rendered (`Rendered`) instead of setting the driver's state; where they extend the segment's
scratch, they are handed where it ends and return where it ends after them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .geometry import THREADS
from .options import CodegenOptions


@dataclass(frozen=True)
class Loc:
    """Where a tensor's data lives in the kernels."""

    kind: str  # param | smem | scratch
    ref: str  # C pointer expression
    strides: tuple


@dataclass(frozen=True)
class KernelInput:
    fusion: object
    seg: object  # the plan's Segment
    nodes: tuple  # the segment's nodes (a scatter whose self is a private copy reads the copy)
    types: dict  # tensor -> concrete TensorType
    strides: dict  # segment input -> element strides
    loc: dict  # tensor -> Loc: where its data lives (parameter, shared memory, scratch)
    stage: dict  # block mode: scatter targets staged in shared memory (tensor -> Loc)
    copies: dict  # private copy -> its source (rule 1), made in this segment
    producer: dict  # tensor -> the node making it here
    aliased: frozenset  # scatter outputs whose parameter already holds self's data
    params: tuple  # the kernels' tensor parameters, in order (parameter k is `t<k>`)
    I: str  # the index type's C name
    sm: int  # SMs the kernels are sized for
    options: CodegenOptions
    scratch: int  # bytes of scratch the placement uses: renderers' own buffers go after them
    smem: int  # bytes of shared memory the placement uses (single-block mode)
    # lambdas(flat_leaf=None, only=None, leaf=None) -> (C++ lambda definitions, tensor -> lambda
    # name): the pointwise family's per-tensor lambdas (pointwise.py; None in the input that
    # family itself reads)
    lambdas: Callable | None = None

    def dst(self, o: str) -> str:
        """The C pointer a kernel writes tensor `o` through (its staging copy, if any)."""
        return (self.stage.get(o) or self.loc[o]).ref

    def grid(self, work: int, threads: int = THREADS, per_sm: int = 8) -> int:
        """Blocks of a grid-stride kernel over `work` items: enough for one each, at most
        `per_sm` an SM."""
        return max(1, min(-(-work // threads), self.sm * per_sm))


@dataclass(frozen=True)
class Rendered:
    """A family's kernels: (body, grid, block, smem, vector flag) each, the vector variant before
    its scalar twin, and the launch attributes they need."""

    kernels: list
    scratch_bytes: int = 0  # where the segment's scratch ends after them
    min_blocks: int = 0  # __launch_bounds__'s minimum of resident blocks an SM (0: none)
    cluster: int = 1  # blocks of a thread-block cluster (__cluster_dims__; 1: none)
