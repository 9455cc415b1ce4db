"""Launch geometry shared by the kernel families (the limits the planner shares: compiler/limits.py)."""

from __future__ import annotations

THREADS = 256  # threads per block of grid-mode kernels


def align(n: int, a: int = 16) -> int:
    return (n + a - 1) // a * a
