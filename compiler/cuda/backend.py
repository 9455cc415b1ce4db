"""The CUDA backend as the Engine sees it: whether it can run here, and the hooks Engine("cupy")
registers (compiler/engine.py imports this module, never the other way round)."""

from __future__ import annotations

from .arrays import signature
from .runtime import get_runtime
from .thread_state import DEFERRED_SLOTS


def unavailable() -> str | None:
    """Why the cupy backend cannot run in this process (no CuPy, no driver, no visible GPU), or None."""
    try:
        import cupy

        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # ImportError, or CUDA's own errors without a driver or device
        return f"CuPy and a CUDA GPU are needed ({type(e).__name__}: {e})"
    return None if n > 0 else "CuPy sees no CUDA GPU"


def _run(plan, fusion, bound, inputs, deferred: bool = False):
    rt = get_runtime()
    misses, spent = rt.cache.stats.misses, rt.cache.stats.compile_s
    outs, info = rt.run(fusion, inputs, plan, deferred)
    # compile time of this call only (a warm run reports 0, not its preparation's)
    return outs, {"compile": (rt.cache.stats.compile_s - spent) * 1e6,
                  "kernel_cache_misses": rt.cache.stats.misses - misses}


def hooks() -> dict:
    """`engine.register_backend`'s arguments for the cupy backend (all but the name)."""
    return dict(
        runner=_run, device="cuda",
        warmup=lambda plan, fusion, shapes: get_runtime().warmup(fusion, shapes, plan=plan),
        modules=lambda plan, fusion, shapes: get_runtime().warmup(fusion, shapes, plan=plan).modules,
        fast=(signature, lambda plan, fusion, inputs, deferred=False:
              get_runtime().prepared_call(fusion, inputs, plan, deferred)),
        synchronize=lambda: get_runtime().synchronize(),
        batch=(lambda: get_runtime().begin_batch(), lambda owner: get_runtime().batch_owner(owner),
               lambda: get_runtime().end_batch(), DEFERRED_SLOTS))
