"""`CodegenOptions`: the code generator's tunable choices, passed down as one frozen value.

The defaults are the measured winners (the measurements: each field's comment). A backend hands
its options to `generate` with every segment, and the kernel cache keys modules by them too
(compiler/cuda/cache.py), so two sets of options never share a cached kernel.
"""

from __future__ import annotations

import hashlib
from dataclasses import astuple, dataclass


@dataclass(frozen=True)
class CodegenOptions:
    # Inputs of the row's own shape broadcast over the rows (RMSNorm's and LayerNorm's weights) are
    # loaded once per thread, with vector loads, while a thread's share of them is at most this many
    # elements (0: read per element); 2-byte weights only while the rows do not fill the SMs. On the
    # H200 held weights took float32 RMSNorm/LayerNorm at 32768 rows 1-4.5% faster and 8 rows 4-18%
    # faster, but bfloat16 at 32768 rows 5-10% slower (RMSNorm [32768, 8192]: 273 -> 300 us).
    row_register_weights: int = 32
    # Row kernels in registers whose held elements are all 2-byte, a block a row, more rows than
    # SMs, ask ptxas to fit this many threads on an SM (`__launch_bounds__(block, this // block)`,
    # a register cap; 0: left to ptxas). On the H200 2048 took bfloat16 softmax [32768, 4096]
    # 164.3 -> 146.5 us and LayerNorm 146.0 -> 136.3 us (RMSNorm [32768, 8192] unchanged). The same
    # cap on 4-byte rows was measured slower (float32 LayerNorm 268 -> 729 us: its registers spill)
    # and removed.
    row_min_resident_threads_2byte: int = 2048
    # Row kernels of a block per row reduce across the block with one barrier instead of three (two
    # shared buffers alternating per row: sf_block_reduce1). None: while the rows do not fill the
    # SMs (few rows are a chain of latencies no other block hides: RMSNorm bfloat16 [8, 4096] 2.7 ->
    # 2.5 us on the H200, 9 of 10 norms as fast or faster on an H100); rows that fill the SMs keep
    # three (one barrier cost bfloat16 softmax [32768, 4096] 12%). True or False: always or never.
    row_one_barrier: bool | None = None
    # sf_block_reduce1 with the block's warp count compiled in, combined in a butterfly that leaves
    # the result in every lane (prelude BLOCK_REDUCE1_BUTTERFLY): two dependent shuffles fewer. On an
    # H100 faster for all 9 few-row norms measured (RMSNorm bfloat16 [8, 4096] 1.88 -> 1.83 us).
    row_reduce_butterfly: bool = True
    # Rows (and weights) held in registers load with L1/L2 evict-last hints, as torch.compile's
    # kernels do (prelude VLOAD_LAST; the vector variant only). On the H200 at 32768 rows float32
    # norms 4-6% faster, bfloat16 RMSNorm 3% faster, LayerNorm bfloat16 [32768, 8192] 2% slower.
    row_load_hints: bool = True
    # Weights held in registers load inside the row loop, after the row, where every block (or
    # cluster) has one row and the rows fit the SMs, instead of before the loop (where their
    # conversion waits for their load before the row's load is issued: two latencies in a row). On
    # an H100 RMSNorm bfloat16 [8, 4096] 1.84 -> 1.67 us; float32 at 8 rows within 0.07 us.
    row_weights_after_row: bool = True

    @property
    def key(self) -> str:
        """A short digest of every field (the kernel cache's key part)."""
        return hashlib.sha256(repr(astuple(self)).encode()).hexdigest()[:16]


DEFAULT_OPTIONS = CodegenOptions()
