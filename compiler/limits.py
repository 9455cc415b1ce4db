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
# The code generator's measured choices for row kernels (weights in registers, launch bounds, the
# block reduction's form, load hints) are `codegen.options.CodegenOptions`, passed down as a value.
# Loading the next row while this one reduces (a second set of registers) was measured and dropped:
# no faster in float32, bfloat16 softmax [32768, 8192] 335 -> 398 us.

# Few long rows split over a thread-block cluster (sm_90; codegen/row_reduction.py): the blocks of
# a cluster each hold a contiguous part of one row in registers, reduce it, and combine their
# partials through distributed shared memory at the cluster barrier, so 8 rows of 65536 still use
# 64 SMs instead of 8. Up to ROW_SPLIT_MAX blocks a row (8: the portable cluster size), doubling while the
# rows times the blocks a row stay within the SM count and each block keeps more than ROW_WARP_MAX
# elements (a block's work, not a warp's). Only rows longer than ROW_SPLIT_MIN_LENGTH: on the H200
# (the split on against off, in one run)
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
