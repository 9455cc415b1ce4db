"""What the backend can generate: the segmenter's one table about code generation (rule 5).

The segmenter asks `can_generate(node, types, mode, checks)` for every op. An op the generator
cannot emit in a mode becomes a *library* segment (CuPy's own routine on the GPU) instead of an
error. The GPU engineer adjusts `DEFAULT_CAPABILITY` (or passes another `Capability`) as the
code generator grows; nothing else in the segmenter knows what codegen supports.

Modes:
- "grid": a multi-block kernel (any number of blocks, no grid-wide barrier).
- "single_block": one thread block, phases separated by __syncthreads (rule 4).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from ..dtypes import DType
from ..limits import (
    INDEX32_MAX,
    ROW_CACHE_BYTES,
    ROW_SPLIT_MAX,
    ROW_WARP_MAX,
    SMEM_PER_BLOCK,
    bitonic_sort_bytes,
)
from ..ops.registry import OpKind

GRID = "grid"
SINGLE_BLOCK = "single_block"

_INT = frozenset({DType.int32, DType.int64, DType.uint8, DType.int8, DType.int16})
_ATOMIC_ADD = frozenset({DType.int32, DType.int64, DType.float32, DType.float64})


@dataclass(frozen=True)
class Capability:
    # Op kinds the generator emits, per mode. Kinds missing from a mode become library calls.
    # (compiler/codegen: scans and sorts run one block per row; rows too long for shared memory
    # fall back to CuPy inside the runtime, so the segmenter need not know that limit)
    grid_kinds: frozenset = frozenset({OpKind.pointwise, OpKind.creation, OpKind.view, OpKind.movement,
                                       OpKind.gather, OpKind.reduction, OpKind.scatter, OpKind.scan,
                                       OpKind.sort})
    single_block_kinds: frozenset = frozenset(OpKind)
    # Scatter accumulation through atomics: reduce -> dtypes with a native atomic (nvFuser's
    # handleScatterAccumulate: add for int32/int64/float/double, max/min for integers only, no mul).
    # compiler/codegen has native atomics where the hardware does and compare-and-swap loops for
    # every other dtype/reduce (floats' amax/amin propagate NaN, mul included).
    scatter_atomics: dict = field(default_factory=lambda: {
        "none": frozenset(DType), "add": frozenset(DType), "amax": frozenset(DType), "amin": frozenset(DType),
        "mul": frozenset(DType)})
    # Single-block limits (rule 4): every tensor of the region at most this many elements, and
    # the region's intermediates within the shared memory a block gets without opting in.
    # (compiler/codegen spills single-block intermediates that exceed shared memory to global
    # scratch, L2-resident at these sizes, and sorts long integer rows with a block radix sort)
    single_block_max_elems: int = 32768
    smem_budget_bytes: int = 1024 * 1024
    # A sort row is sorted in shared memory as (key, index) pairs padded to a power of two
    # (compiler/codegen: bitonic sort within limits.SMEM_PER_BLOCK); a longer row is a
    # library sort, so the plan says what actually runs.
    sort_smem_bytes: int = SMEM_PER_BLOCK
    # In one thread block, a rank-1 row of integer keys (bool included) is sorted by the block
    # radix sort (compiler/codegen/radix.py: keys in L2-resident scratch, no shared-memory limit)
    # up to this many keys: one launch, but one SM. H200, kernel only: MoE argsort fusion at 32768
    # keys 109 us (its split into 5 launches with a multi-block library sort: 24 us); a plain
    # argsort of 32768 8-bit keys 63 us, of full-range int64 keys 669 us (8 passes). So longer rows
    # are library sorts (compiler/cuda/radix_sort.py, all SMs); one block keeps rows up to 16384
    # (MoE argsort fusion, kernel only: 1024 keys 5.9 us, 4096 keys 11.3 us, 16384 keys 56 us).
    radix_sort_max_row: int = 16384
    # A library argsort whose keys are views of one tensor and whose consumers are pointwise
    # position ops and permutation scatters (MoE argsort) runs them inside the multi-block radix
    # sort's final pass: one launch (compiler/codegen/sort_epilogue.py). H200, MoE argsort fusion
    # at 32768 keys, kernel only: 15.2 us in one launch instead of 21.8 us in four.
    fuse_sort_epilogues: bool = True
    # ... and the keys' histogram (counts of E <= 256 bins, its cumsum, the expert offsets), which
    # block 0 writes from the sort's own digit-0 counts after the first grid barrier: the whole MoE
    # prologue in one launch. H200, 2026-12-01, kernels only: T = 4096 int64 16.1 us against 21.8 us
    # in two launches, T = 65536 19.7 against 27.2 (benchmarks/README.md). SEGFUSE_SORT_HISTOGRAMS=0
    # turns it off.
    fuse_sort_histograms: bool = os.environ.get("SEGFUSE_SORT_HISTOGRAMS", "1") != "0"
    single_block_threads: int = 1024
    grid_threads: int = 256
    # Whether a private copy of a scatter's self may ride along as an extra store in another
    # kernel (Segment.copies with nodes); False gives every copy its own `copy` segment.
    fuse_copies: bool = True
    # Index arithmetic is 32-bit while every tensor has at most this many elements (codegen tests
    # the same limit, limits.INDEX32_MAX, also against non-contiguous inputs' stride extents, which
    # only the runtime knows).
    index32_limit: int = INDEX32_MAX
    # Row-persistent reductions (compiler/codegen/row_reduction.py): reductions over the same
    # innermost dims and the pointwise work between and after them in one kernel, a block (a warp
    # for rows of at most `row_warp_max` elements) per row, the row's inputs read once into shared
    # memory while they fit `row_cache_bytes` per block, else re-read (two passes) from L2/HBM.
    # False keeps one launch per reduction. (H200, softmax [32768, 4096] f32: 4 launches, 1324 us.)
    row_reductions: bool = True
    row_warp_max: int = ROW_WARP_MAX
    row_cache_bytes: int = ROW_CACHE_BYTES
    # Longer rows keep today's lowering: one block per row would leave most SMs idle while it
    # streams the row (a full reduction of 2^31 elements), where a grid kernel of the epilogue does not.
    row_max_length: int = 65536

    def library_routine(self, op) -> str:
        """What a library segment of the op runs: its registry entry's `library` (the GPU runtime
        has library routines for sorts only; any other library segment is still lowered to a
        kernel in grid mode, or run on the host)."""
        return op.library or "a grid kernel, else the host reference"


DEFAULT_CAPABILITY = Capability()


def scatter_reduce_of(node) -> str:
    """The accumulation a scatter-family op performs: none, add, mul, amax or amin (an attribute
    trait of every scatter-family op's attributes, see compiler/ops/indexing.py)."""
    return node.attrs.reduce


def max_sort_row(dtype: DType, cap: Capability, mode: str = GRID, rank: int = 2) -> int:
    """The longest sort row codegen emits: in one block, `radix_sort_max_row` for a rank-1 row of
    integer keys (radix sort); otherwise the longest row whose (key, index) pairs, padded to a power
    of two, fit `sort_smem_bytes` (bitonic sort in shared memory)."""
    key = 8 if dtype.itemsize == 8 else 4
    p = 1
    while bitonic_sort_bytes(2 * p, key) <= cap.sort_smem_bytes:
        p *= 2
    if mode == SINGLE_BLOCK and rank == 1 and not dtype.is_float:
        return max(p, cap.radix_sort_max_row)
    return p


def _radix(dtype: DType, mode: str, rank: int) -> bool:
    return mode == SINGLE_BLOCK and rank == 1 and not dtype.is_float


def can_schedule_rows(region, fusion, cap: Capability = DEFAULT_CAPABILITY, checks=None) -> tuple[bool, str]:
    """(True, reason) when a row region (segmenter/row_fusion.analyze) lowers to one row-persistent
    kernel (nvFuser's canSchedule for its inner-persistent scheduler); else (False, why). The row
    length test goes through `checks` (the plan's recorded size tests) when given."""
    if not cap.row_reductions:
        return False, "row-persistent reductions are off (Capability.row_reductions)"
    length = 1
    for d in region.row:
        length = length * d
    what = f"a row of {fusion.nodes[region.reductions[0]].label()} fits one block's row-persistent kernel"
    fits = checks.le(length, cap.row_max_length, what) if checks is not None else \
        not isinstance(length, int) or length <= cap.row_max_length
    if not fits:
        return False, f"rows of {length} elements exceed the {cap.row_max_length} one block streams well"
    names = ", ".join(f"{fusion.nodes[p].op.name} '{fusion.nodes[p].outputs[0]}'" for p in region.reductions)
    dims = ", ".join(str(d) for d in region.dims)
    rows = " x ".join(str(d) for d in region.kept) or "1"
    row = " x ".join(str(d) for d in region.row)
    return True, (f"row-persistent reduction: {names} over dim{'s' if len(region.dims) > 1 else ''} {dims} and "
                  f"the pointwise work between and after them run as one kernel ({rows} rows of {row}): a block "
                  f"per row (a warp for rows of at most {cap.row_warp_max}; a cluster of up to {ROW_SPLIT_MAX} blocks "
                  "sharing each row when the rows are too few to fill the SMs), the row's inputs read once into "
                  f"shared memory while they fit {cap.row_cache_bytes // 1024} KiB, and each reduction's result "
                  "is complete for the whole row after a block reduction")


def can_generate(node, types: dict, mode: str, cap: Capability = DEFAULT_CAPABILITY,
                 checks=None) -> tuple[bool, str]:
    """(True, "") when codegen emits `node` in `mode`; else (False, why) and it runs as a library call.

    Size-dependent answers go through `checks` (the plan's recorded size tests), so a plan is
    reused only at sizes where the answer is the same."""
    kinds = cap.grid_kinds if mode == GRID else cap.single_block_kinds
    if node.kind not in kinds:
        where = "a multi-block kernel" if mode == GRID else "one thread block"
        return False, f"codegen has no {node.kind.value} in {where}"
    if node.kind is OpKind.scatter:
        reduce = scatter_reduce_of(node)
        dt = types[node.outputs[0]].dtype
        if dt not in cap.scatter_atomics.get(reduce, frozenset()):
            return False, f"no atomic for reduce='{reduce}' on {dt}"
    if node.kind is OpKind.sort:
        x = types[node.inputs[0]]
        row = x.shape[node.attrs.dim % x.rank] if x.rank else 1
        limit = max_sort_row(x.dtype, cap, mode, x.rank)
        where = "one block's radix sort" if _radix(x.dtype, mode, x.rank) else "shared memory"
        fits = checks.le(row, limit, f"a sort row of {node.label()} fits {where}") if checks is not None \
            else not isinstance(row, int) or row <= limit
        if not fits:
            return False, f"a sort row of {row} elements exceeds the {limit} that fit {where}"
    return True, ""
