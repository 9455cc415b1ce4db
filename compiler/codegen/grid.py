"""A segment in grid mode: every phase is its own `__global__` function (almost always just one),
launched in order from one module. Each anchor's kernels come from its family's renderer, chosen
by the op kind (`ANCHORS`); the lazily computed outputs are materialized by grid-stride loops
(pointwise.py), with a 16-byte-vector variant where their cone is flat and contiguous.
`GridRenderer` reads a `KernelInput` (kernel_input.py) and returns its kernels (`Rendered`).
"""

from __future__ import annotations

from ..ops.registry import OpKind
from .geometry import THREADS
from .kernel_input import KernelInput, Rendered
from .layout import numel
from .lazy import Unsupported
from .pointwise import PointwiseRenderer
from .reduction import ReductionRenderer
from .scatter_kernels import ScatterRenderer
from .sorting import SortRenderer


def _reduction(inp: KernelInput, nd, scratch: int) -> Rendered:
    return Rendered([ReductionRenderer(inp).grid_kernel(nd)], scratch)


def _scan(inp: KernelInput, nd, scratch: int) -> Rendered:
    return Rendered([ReductionRenderer(inp).scan_kernel(nd)], scratch)


def _sort(inp: KernelInput, nd, scratch: int) -> Rendered:
    return Rendered([SortRenderer(inp).grid_kernel(nd)], scratch)


def _scatter(inp: KernelInput, nd, scratch: int) -> Rendered:
    return ScatterRenderer(inp).grid_kernels(nd, scratch)


# An anchor's grid kernels, by its op kind: (input, node, where the scratch ends) -> Rendered.
ANCHORS = {OpKind.reduction: _reduction, OpKind.scan: _scan, OpKind.sort: _sort, OpKind.scatter: _scatter}


class GridRenderer:
    """The grid-mode kernels of a segment's phases; `vec_blocks_per_sm` caps the grid of the
    materialization's vector variant (segment.VEC_BLOCKS_PER_SM)."""

    def __init__(self, inp: KernelInput, vec_blocks_per_sm: int):
        self.inp, self.vec_blocks_per_sm = inp, vec_blocks_per_sm
        self.pointwise = PointwiseRenderer(inp)

    def render(self, phases) -> Rendered:
        """A kernel (or a few) per phase, in order; outputs of several shapes are materialized by
        one last kernel together."""
        kernels, scratch = [], self.inp.scratch
        groups = [what for kind, what in phases if kind == "materialize"]
        for kind, what in phases:
            if kind == "materialize":
                if len(groups) == 1:
                    kernels.extend(self._materialize(what))
                continue
            anchor = ANCHORS.get(what.op.kind)
            if anchor is None:
                raise Unsupported(f"anchor kind {what.op.kind}")
            rendered = anchor(self.inp, what, scratch)
            kernels.extend(rendered.kernels)
            scratch = rendered.scratch_bytes
        if len(groups) > 1:
            kernels.append(self._materialize_together(groups))
        return Rendered(kernels, scratch)

    def _materialize(self, outs) -> list:
        I = self.inp.I
        lam, _ = self.pointwise.lambdas()
        n = numel(self.inp.types[outs[0]].shape)
        res = [(lam + "\n" + self.pointwise.materialize(outs, f"(({I})blockIdx.x * blockDim.x + threadIdx.x)",
                                                        f"(({I})gridDim.x * blockDim.x)"),
                self.inp.grid(n), THREADS, 0, None)]
        vec = self.pointwise.vector_materialize(outs)
        if vec is not None:
            # listed first: the runtime launches it instead of the next (scalar) kernel when every
            # pointer is aligned to a vector
            res.insert(0, (vec, self.inp.grid(max(1, n // 4), per_sm=self.vec_blocks_per_sm), THREADS, 0, True))
        return res

    def _materialize_together(self, groups):
        """Outputs of several shapes in one launch (one kernel per segment): each shape group owns
        a range of the grid's blocks and strides over its elements within them. The groups are
        independent: each recomputes its values from the segment's inputs and anchor results."""
        I = self.inp.I
        lam, _ = self.pointwise.lambdas()
        parts, first = [], 0
        for what in groups:
            blocks = self.inp.grid(numel(self.inp.types[what[0]].shape))
            start = f"(({I})(blockIdx.x - {first}u) * blockDim.x + threadIdx.x)"
            parts.append(f"  if (blockIdx.x >= {first}u && blockIdx.x < {first + blocks}u) {{\n"
                         + self.pointwise.materialize(what, start, f"(({I}){blocks} * blockDim.x)") + "\n  }")
            first += blocks
        return (lam + "\n" + "\n".join(parts), first, THREADS, 0, None)
