"""A segment in single-block mode (segment kind `single_block`): all its phases in one kernel of
one thread block, separated by `__syncthreads()`, with intermediates in shared memory. Each
anchor's phase comes from its family's renderer, chosen by the op kind (`ANCHORS`); a first
scatter over many sources may share its phase among several blocks (scatter_block.py,
`histogram_blocks`). `SingleBlockRenderer` reads a `KernelInput` (kernel_input.py) and returns
its one kernel (`Rendered`).
"""

from __future__ import annotations

import re
from typing import NamedTuple

from ..limits import SMEM_PER_BLOCK
from ..ops.registry import OpKind
from . import radix
from .geometry import align
from .kernel_input import KernelInput, Rendered
from .layout import numel
from .lazy import Unsupported
from .pointwise import PointwiseRenderer
from .reduction import ReductionRenderer
from .scatter_block import BlockScatterRenderer
from .sorting import SortRenderer


class Phase(NamedTuple):
    """One phase of the kernel: its code and what it needs."""

    body: str
    smem: int  # where the shared memory it uses ends
    work: int  # threads it keeps busy
    scratch: int  # where the segment's scratch ends after it


class SingleBlockRenderer:
    """The one kernel of a single-block segment's phases. Rank-1 integer sorts of rows longer
    than `radix_min` use the block radix sort (radix.py; segment.RADIX_MIN), shorter ones the
    bitonic sort in shared memory."""

    def __init__(self, inp: KernelInput, radix_min: int):
        self.inp, self.radix_min = inp, radix_min
        self.pointwise = PointwiseRenderer(inp)

    def render(self, phases) -> Rendered:
        blocks = BlockScatterRenderer(self.inp).histogram_blocks(phases)
        lam, names = self.pointwise.lambdas()
        parts, smem, work, scratch = [lam], self.inp.smem, 32, self.inp.scratch
        for kind, what in phases:
            if kind == "materialize":
                phase = Phase(self.pointwise.materialize(what, "threadIdx.x", "blockDim.x", names), 0,
                              numel(self.inp.types[what[0]].shape), scratch)
            else:
                anchor = ANCHORS.get(what.op.kind)
                if anchor is None:
                    raise Unsupported(f"anchor kind {what.op.kind}")
                phase = anchor(self, what, scratch, blocks if what is phases[0][1] else 1)
            parts += [phase.body, "  __syncthreads();"]
            smem, work, scratch = max(smem, phase.smem), max(work, phase.work), phase.scratch
        if smem > SMEM_PER_BLOCK:
            raise Unsupported("single-block segment needs too much shared memory")
        threads = min(1024, max(32, -(-work // 32) * 32))
        return Rendered([(_unroll_block_loops("\n".join(parts), threads), blocks, threads, align(smem), None)], scratch)

    # ---- the anchors' phases: (node, where the scratch ends, blocks sharing it) -> Phase ----
    def _reduction(self, nd, scratch: int, blocks: int) -> Phase:
        reductions = ReductionRenderer(self.inp)
        K = reductions.parts(nd)[-1]
        body = reductions.body(nd, "0", "1", "threadIdx.x", "blockDim.x", "sf_block_reduce(acc, comb)",
                               self.inp.dst(nd.outputs[0]))
        return Phase(body, 0, K, scratch)

    def _scan(self, nd, scratch: int, blocks: int) -> Phase:
        body = ReductionRenderer(self.inp).scan_body(nd, "0", "1", self.inp.dst(nd.outputs[0]))
        xt = self.inp.types[nd.inputs[0]]
        return Phase(body, 0, xt.shape[nd.attrs.dim % xt.rank] if xt.rank else 1, scratch)

    def _sort(self, nd, scratch: int, blocks: int) -> Phase:
        sorts, free = SortRenderer(self.inp), self.inp.smem
        x, xt, d, L, P, V, nbytes = sorts.parts(nd)
        if L > self.radix_min and xt.rank == 1 and not xt.dtype.is_float:
            body, scratch = sorts.radix_body(nd, free, scratch)
            return Phase(body, free + radix.SMEM_BYTES, radix.THREADS, scratch)  # (exactly 1024 threads)
        return Phase(sorts.body(nd, "0", "1", free), free + nbytes, P // 2, scratch)

    def _scatter(self, nd, scratch: int, blocks: int) -> Phase:
        scatters, free = BlockScatterRenderer(self.inp), self.inp.smem
        body, extra, scratch = scatters.block_body(nd, free, scratch, blocks)
        return Phase(body, free + extra, numel(scatters.parts(nd)[0]), scratch)


# An anchor's phase, by its op kind.
ANCHORS = {OpKind.reduction: SingleBlockRenderer._reduction, OpKind.scan: SingleBlockRenderer._scan,
           OpKind.sort: SingleBlockRenderer._sort, OpKind.scatter: SingleBlockRenderer._scatter}

_BLOCK_LOOP = re.compile(r"^(\s*)(for \((?:int|long long) [a-z]\w* = threadIdx\.x; )", re.M)


def _unroll_block_loops(body: str, threads: int) -> str:
    """A single-block kernel always runs with `threads` threads: with that constant as the stride,
    loop trip counts are known and `#pragma unroll` lets the compiler issue several iterations'
    global loads before their uses. One SM runs the whole segment, so its loops are bound by
    memory latency, not bandwidth (MoE histogram of 32768 ids: 32 dependent load-atomic rounds)."""
    body = body.replace("blockDim.x", str(threads))
    return _BLOCK_LOOP.sub(lambda m: f"{m.group(1)}#pragma unroll 4\n{m.group(1)}{m.group(2)}", body)
