"""Launch geometry and on-chip budgets shared by the kernel families."""

from __future__ import annotations

THREADS = 256  # threads per block of grid-mode kernels
SMEM_BUDGET = 200 * 1024  # dynamic shared memory we allow ourselves per block (H200: 227 KiB)


def align(n: int, a: int = 16) -> int:
    return (n + a - 1) // a * a
