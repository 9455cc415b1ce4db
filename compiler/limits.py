"""Limits the planner and the code generator share, each in one place (issue 14, item 4).

The segmenter's capability table (`segmenter.capability.Capability`) takes its defaults from here,
and codegen tests against the same numbers, so a plan's hints say what the kernels do. Also the
work budget that bounds validating and planning one graph (`budget`, `charge`; at the end).
"""

from __future__ import annotations

import functools
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

from .errors import GraphError

# 32-bit index arithmetic while every element count and every input's stride extent is at most
# this: grid-stride loops step past the end by up to one grid (at most 2^25 threads here) before
# they test, and that step must not overflow.
INDEX32_MAX = 2**31 - 2**25 - 1

# Dynamic shared memory a kernel may use per block (the H200 allows 227 KiB with opt-in; the rest
# stays for static shared memory and the runtime's headroom).
SMEM_PER_BLOCK = 200 * 1024

# The SM count kernels are sized for when the device is not known (an H200's)
NOMINAL_SM_COUNT = 132
# Sources per block of a multi-block histogram (codegen/scatter_block.py: one batch of 8 loads for
# each of a block's 1024 threads); the planner spreads histograms up to one batch per SM
# (segmenter/spread.py).
HIST_BLOCK_SOURCES = 8 * 1024

# Row-persistent reductions (segmenter/row_fusion.py, codegen/row_reduction.py): rows of at most
# ROW_WARP_MAX elements run a warp per row, longer rows a block per row; a block caches its rows'
# inputs in shared memory while they need at most ROW_CACHE_BYTES (else it re-reads them).
ROW_WARP_MAX = 512
ROW_CACHE_BYTES = 96 * 1024
# A thread holds its elements of the cached rows in registers instead while they are at most
# ROW_REGISTER_ELEMS (all cached inputs together; 32 keeps a 1024-thread block within its 64
# registers a thread)
ROW_REGISTER_ELEMS = 32
# Inputs of the row's own shape broadcast over the rows (RMSNorm's and LayerNorm's weights) are then
# loaded once per thread, with vector loads, before the row loop, while a thread's share of them is
# at most ROW_REGISTER_WEIGHTS elements (0: read per element). 2-byte weights only while the rows
# do not fill the SMs. On the H200 (benchmarks/norm_variants.py, 2026-12-02 00:1x UTC), held weights
# took float32 RMSNorm/LayerNorm at 32768 rows 1-4.5% faster and 8 rows 4-18% faster, but bfloat16
# at 32768 rows 5-10% slower (RMSNorm [32768, 8192]: 273 -> 300 us).
ROW_REGISTER_WEIGHTS = 32
# Row kernels ask ptxas to fit this many threads on an SM (`__launch_bounds__(block, this // block)`,
# a register cap): 0 leaves it to ptxas. The first applies to rows of 4-byte (or wider) elements,
# the second to rows in registers whose held elements are all 2-byte, a block a row, more rows than SMs. Measured on the H200
# (2026-12-02 02:1x-02:3x UTC, benchmarks/norm_variants.py NORM_MIN_THREADS, a block per row):
# 2048 took bfloat16 softmax [32768, 4096] 164.3 -> 146.5 us and LayerNorm 146.0 -> 136.3 us
# (RMSNorm [32768, 8192] unchanged), but float32 RMSNorm 262.5 -> 358.6 us and LayerNorm 268 -> 729
# us: at 32 registers their 16 elements and 16 weights a thread spill. 1536 was slower in float32 too.
ROW_MIN_RESIDENT_THREADS = 0
ROW_MIN_RESIDENT_THREADS_2BYTE = 2048
# Row kernels of a block per row reduce across the block with one barrier instead of three (two
# shared buffers, alternating per row: sf_block_reduce1) while the rows do not fill the SMs: a
# few-row kernel is a chain of latencies (load, reduce, store) that no other block hides. On the
# H200 one barrier took RMSNorm bfloat16 [8, 4096] from 2.7 to 2.5 us (2026-12-02 03:28 UTC,
# benchmarks/norm_variants.py NORM_ONE_BARRIER=1); on an H100 (2026-12-06 17:06 UTC, norm_ab.py,
# one process) it was as fast or faster for 9 of 10 norms at [8, 4096] and [8, 8192] (softmax
# float32 2.48 -> 2.39 us, RMSNorm float32 [8, 8192] 2.55 -> 2.43; the tenth 1.92 -> 1.93).
# Rows that fill the SMs keep three: there every warp's own pass over the partials cost bfloat16
# softmax [32768, 4096] 12% (145.8 -> 163.2 us), and the norms were within 2%. None: that rule;
# True or False: one barrier always or never.
# Loading the next row while this one reduces (a second set of registers) was measured and dropped:
# 2026-12-02 02:1x UTC, no faster in float32, bfloat16 softmax [32768, 8192] 335 -> 398 us.
ROW_ONE_BARRIER = None
# sf_block_reduce1 with the block's warp count compiled in, its partials combined in a butterfly
# that leaves the result in every lane (codegen/prelude.py BLOCK_REDUCE1_BUTTERFLY), instead of a
# predicated shuffle-down and a broadcast: two dependent shuffles fewer on a few-row kernel's chain of
# latencies. On an H100 (2026-12-07 00:12 UTC, benchmarks/norm_ab.py NORM_BFLY=1, one process) it was
# faster for all 9 few-row norms measured: RMSNorm bfloat16 [8, 4096] 1.88 -> 1.83 us, float32 1.93 ->
# 1.86, LayerNorm bfloat16 2.22 -> 2.09, softmax bfloat16 [8, 8192] 2.89 -> 2.79, RMSNorm bfloat16
# [8, 8192] 2.16 -> 2.15. Not yet measured on the H200.
ROW_REDUCE_BUTTERFLY = True
# Rows (and weights) held in registers load with L1/L2 evict-last hints, as torch.compile's kernels
# load theirs (codegen/prelude.py VLOAD_LAST). On the H200 (2026-12-02 12:09-12:13 UTC,
# benchmarks/norm_variants.py NORM_HINTS=0 against the default) at 32768 rows: RMSNorm float32
# [32768, 4096] 262.1 -> 251.8 us, LayerNorm float32 266.0 -> 250.6, softmax float32 [32768, 8192]
# 516.6 -> 498.8, RMSNorm bfloat16 [32768, 8192] 260.3 -> 251.5; LayerNorm bfloat16 [32768, 8192]
# the one row slower, 278.1 -> 283.5; 8 rows the same. The vector variant only (the scalar one,
# for misaligned tensors, loads plainly).
ROW_LOAD_HINTS = True
# Weights held in registers load inside the row loop, after the row, where every block (or cluster)
# has one row and the rows fit the SMs (few rows: one wave, a latency chain), instead of before the
# loop. Before the loop, nvcc converts them (bfloat16 to float) there as well, and that conversion
# waits for their load before the row's load is even issued: two memory latencies in a row on a
# few-row kernel's critical path (SASS of RMSNorm bfloat16 [8, 4096], 2026-12-07). Measured
# (norm_ab.py NORM_LATE_W=1, H100, 2026-12-07 01:45 and 01:55, two processes): RMSNorm bfloat16
# [8, 4096] 1.84 -> 1.67 us, [8, 8192] 2.14 -> 2.02, LayerNorm bfloat16 [8, 4096] 2.08 -> 2.00;
# float32 at 8 rows -0.05 to +0.07 us. Rows that fill the SMs keep the old order (not measured).
ROW_WEIGHTS_AFTER_ROW = True
# Rows in registers whose every vector access (rows, weights, row-shaped outputs) is of 2-byte
# elements, not split over a cluster, rows of a multiple of 8: vectors of 8 (16-byte loads and
# stores, the width of torch.compile's float32 row accesses in its PTX) instead of 4 (8 bytes).
# Off: measured (norm_ab.py NORM_WIDE=1, H100, 2026-12-06 20:54) it is 1% faster for RMSNorm
# bfloat16 [8, 8192] (2.17 -> 2.15 us) and slower for the rest: softmax bfloat16 [8, 4096] 2.28 ->
# 2.34 us, LayerNorm bfloat16 [8, 8192] 2.49 -> 2.54, [32768, 4096] 180.6 -> 196.5.
ROW_WIDE_2BYTE_VECTORS = False

# Few long rows split over a thread-block cluster (sm_90; codegen/row_reduction.py): the blocks of
# a cluster each hold a contiguous part of one row in registers, reduce it, and combine their
# partials through distributed shared memory at the cluster barrier, so 8 rows of 65536 still use
# 64 SMs instead of 8. Up to ROW_SPLIT_MAX blocks a row (8: the portable cluster size), doubling while the
# rows times the blocks a row stay within the SM count and each block keeps more than ROW_WARP_MAX
# elements (a block's work, not a warp's). Only rows longer than ROW_SPLIT_MIN_LENGTH: on the H200
# (2026-12-02 03:43 and 03:51 UTC, benchmarks/norm_variants.py NORM_SPLIT=1 against the default)
# the split took 2 rows of 40000 from 13.4 to 6.3 us (LayerNorm float32), 1 row of 65536 from 15.5
# to 4.8 us (RMSNorm), 8 from 21.3 to 7.6 us (softmax), bfloat16 softmax [8, 32768] 7.2 -> 6.5 us
# and RMSNorm [4, 32768] 5.2 -> 4.5 us, but rows of 4096 and 8192 0.9-1.3 us slower (8, 16 and
# 64 rows: 2.5-3.7 us a block per row; the cluster's launch and barriers cost more than they
# spread), RMSNorm float32 [8, 16384] the same (4.0 / 4.1 us) and LayerNorm bfloat16 [16, 16384]
# slower (4.3 -> 5.7 us).
ROW_SPLIT_MAX = 8
ROW_SPLIT_MIN_LENGTH = 16384


def row_split(length: int, rows: int, sm_count: int, most: int = ROW_SPLIT_MAX) -> int:
    """Blocks (a cluster, at most `most`) that share each row of a row-persistent kernel: 1 (a block
    per row) unless the rows are long and leave most SMs idle."""
    s = 1
    while length > ROW_SPLIT_MIN_LENGTH and s < most and rows * s * 2 <= sm_count and -(-length // (2 * s)) > ROW_WARP_MAX:
        s *= 2
    return s


# The longest row that few rows (a block each) spread at 8 elements a thread; longer ones take 16.
FEW_ROWS_8_A_THREAD_MAX = 4096


def row_threads(length: int, rows: int, sm_count: int, split: int = 1) -> int:
    """Threads working on one row (or on a block's part of a row split over `split` blocks): a warp
    for short rows; else about 16 elements per thread while the rows fill the SMs, 8 when they do
    not (4 for the parts of a split row), 128 to 1024. On the H200 (benchmarks/README.md): 16
    rather than 8 for rows that fill the SMs, since rows of 4096 and 8192 in registers ran 3-18%
    faster in bfloat16 and within 3% in float32 (8 a thread cost LayerNorm float32 [32768, 4096]
    6.5%, 2026-12-02 18:45 UTC); 8 rather than 4 for few rows, since every norm at [8, 4096] ran
    1.6-10% faster with 512 threads than with 1024 (2026-12-02 18:34 and 18:44 UTC, one process,
    paired rounds). Few rows longer than 4096 take 16 a thread: 512 threads at 8192, the shape
    torch.compile's autotuner picks there, as fast or 1-7% faster than 1024 for the 8 norms at
    [8, 8192] on an H100 (2026-12-06 18:28 UTC). Split parts keep 4, as their split rule was
    measured."""
    if length <= ROW_WARP_MAX:
        return 32
    per = 16 if rows > sm_count or (split == 1 and length > FEW_ROWS_8_A_THREAD_MAX) else 8 if split == 1 else 4
    t = 128
    while t < 1024 and t * per < length:
        t *= 2
    return t


def index_bits(extent: int) -> int:
    """The index width for a kernel whose largest element count or stride extent is `extent`."""
    return 32 if extent <= INDEX32_MAX else 64


def bitonic_sort_bytes(padded_row: int, key_bytes: int) -> int:
    """Shared memory of the bitonic sort of one row: keys (in their value type, `key_bytes` 4 or
    8) then int32 indices, for a row padded to the power of two `padded_row`."""
    return -(-padded_row * key_bytes // 16) * 16 + padded_row * 4


# ---- the work budget of validating or planning one graph -----------------------------------------
# Validation and planning cost grows with the graph (the segmenter's passes are quadratic in the
# ops at worst) and with its size expressions (sympy). A caller that must stay responsive (the
# server) runs them inside `budget(...)`: the passes `charge` the work they do (steps visited, size
# expressions simplified), and past the work or the wall-clock bound the next charge raises
# `BudgetExceeded`. The count is deterministic: a memoized computation (`memoized`) charges a hit
# what its miss charged, so the same graph costs the same whatever was planned before. Without a
# budget (the library, the CLI) nothing is counted.


class BudgetExceeded(GraphError):
    """Validating or planning took more work or time than the budget it ran under."""

    def __init__(self, msg: str, limit: str):
        super().__init__(msg)
        self.limit = limit  # the name of the bound that was passed (Budget.work_name or seconds_name)


@dataclass
class Budget:
    what: str  # "validating the graph", "planning the run": for messages
    work: int | None = None  # work units (None: unbounded)
    seconds: float | None = None  # wall-clock seconds (None: unbounded)
    work_name: str = "work"  # how the caller names its bounds (the server: its settings)
    seconds_name: str = "seconds"
    used: int = 0
    deadline: float = float("inf")


_state = threading.local()  # .budget: the Budget in force; .counts: memoized misses being counted


@contextmanager
def budget(what: str, work: int | None = None, seconds: float | None = None, work_name: str = "work",
           seconds_name: str = "seconds"):
    """Count the work done on this thread inside the block against `work` units and `seconds`."""
    b = Budget(what, work, seconds, work_name, seconds_name)
    if seconds is not None:
        b.deadline = time.monotonic() + seconds
    outer = getattr(_state, "budget", None)
    _state.budget = b
    try:
        yield b
    finally:
        _state.budget = outer


def charge(units: int = 1) -> None:
    """Count `units` of work against this thread's budget, if any; BudgetExceeded past it."""
    counts = getattr(_state, "counts", None)
    b = getattr(_state, "budget", None)
    if counts:
        counts[-1] += units  # inside a memoized miss: its caller charges the total (`memoized`)
        units = 0
    if b is None:
        return
    b.used += units
    if b.work is not None and b.used > b.work:
        raise BudgetExceeded(f"{b.what} needs more than its budget of {b.work} work units ({b.work_name})",
                             b.work_name)
    if time.monotonic() > b.deadline:
        raise BudgetExceeded(f"{b.what} takes longer than its budget of {b.seconds:g} s ({b.seconds_name})",
                             b.seconds_name)


def counted(fn, *args):
    """(fn(*args), the work units it charged), those units not charged yet: for a computation
    whose result is kept, so that later uses can charge the same (`memoized`)."""
    if not hasattr(_state, "counts"):
        _state.counts = []
    _state.counts.append(0)
    try:
        value = fn(*args)
    except BaseException:
        charge(_state.counts.pop())  # the work done before it failed
        raise
    return value, _state.counts.pop()


def memoized(maxsize: int):
    """functools.lru_cache for work that charges the budget: a hit charges what the miss charged
    (so the count does not depend on what is cached)."""
    def wrap(fn):
        @functools.lru_cache(maxsize)
        def cached(*args):
            return counted(fn, *args)

        @functools.wraps(fn)
        def call(*args):
            value, units = cached(*args)
            if units:
                charge(units)
            return value

        call.cache_clear = cached.cache_clear
        return call

    return wrap
