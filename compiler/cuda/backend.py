"""The CUDA backend as the Engine sees it (compiler/backend.py's interface): the process's CuPy
runtime (compiler/cuda/runtime.py), made at the first call that needs it. compiler/engine.py
imports this module, never the other way round; nothing here imports CuPy at import time."""

from __future__ import annotations

from ..backend import Backend
from ..codegen.options import DEFAULT_OPTIONS, CodegenOptions
from ..numpy_backend import input_types
from .arrays import shape_proxies, signature
from .prepare import compile_fallbacks
from .runtime import CupyRuntime, get_runtime
from .thread_state import DEFERRED_SLOTS


class CupyBackend(Backend):
    name = "cupy"
    device = "cuda"
    compiles = True
    fast_path = True
    batch_size = DEFERRED_SLOTS  # a batch's runs each hold a block of the thread's error ring

    # (a plain function: the Engine calls it on every run of a warm graph)
    signature = staticmethod(signature)

    def __init__(self, options: CodegenOptions | None = None):
        super().__init__(options)
        self._rt = None

    @classmethod
    def unavailable(cls) -> str | None:
        """Why the cupy backend cannot run in this process (no CuPy, no driver, no visible GPU), or None."""
        try:
            import cupy
        except Exception as e:
            return f"CuPy does not import ({type(e).__name__}: {e})"
        try:
            n = cupy.cuda.runtime.getDeviceCount()
        except Exception as e:  # CUDA's own errors without a driver or device
            return f"no CUDA driver or device ({type(e).__name__}: {e})"
        return None if n > 0 else "CUDA sees no device"

    @classmethod
    def compile_fallbacks(cls) -> dict:
        return compile_fallbacks()

    @property
    def runtime(self):
        """The process's CupyRuntime (made at the first use: CuPy, the device, the kernel cache)."""
        rt = self._rt
        if rt is None:
            # other options: a runtime of its own, on the device's kernel cache (keyed by options)
            rt = self._rt = get_runtime() if self.options == DEFAULT_OPTIONS else CupyRuntime(options=self.options)
        return rt

    def start(self) -> None:
        self.runtime  # noqa: B018  (its creation starts NVRTC's one-time warm-up in the background)

    # ---- running ---------------------------------------------------------------------------
    def read_inputs(self, fusion, inputs: dict) -> tuple[dict, dict, dict]:
        shapes, dtypes = input_types(shape_proxies(fusion, inputs))  # NumPy or CuPy arrays in
        return shapes, dtypes, inputs

    def run(self, plan, fusion, bound, inputs: dict, deferred: bool = False) -> tuple[dict, dict]:
        rt = self.runtime
        stats = rt.cache.stats
        misses, spent = stats.misses, stats.compile_s
        outs, _info = rt.run(fusion, inputs, plan, deferred)
        # compile time of this call only (a warm run reports 0, not its preparation's)
        return outs, {"compile": (stats.compile_s - spent) * 1e6, "kernel_cache_misses": stats.misses - misses}

    def prepared_call(self, plan, fusion, inputs: dict, deferred: bool = False):
        return self.runtime.prepared_call(fusion, inputs, plan, deferred)

    def synchronize(self) -> None:
        self.runtime.synchronize()

    def begin_batch(self) -> None:
        self.runtime.begin_batch()

    def batch_owner(self, index: int) -> None:
        self.runtime.batch_owner(index)

    def end_batch(self) -> dict:
        return self.runtime.end_batch()

    def stream_ptr(self) -> int:
        return self.runtime.stream().ptr

    # ---- preparation -----------------------------------------------------------------------
    def warmup(self, plan, fusion, shapes: dict) -> None:
        self.runtime.warmup(fusion, shapes, plan)

    def kernel_modules(self, plan, fusion, shapes: dict) -> list:
        # prepared as warmup does (compiling): runs then find the kernels
        return self.runtime.warmup(fusion, shapes, plan).modules

    def prepared(self, fusion, inputs: dict):
        return self.runtime.prepared_for(fusion, inputs)

    def kernel_time_us(self, plan, fusion, inputs: dict, reps: int = 20, warmup: int = 3) -> float:
        return self.runtime.kernel_time_us(fusion, inputs, plan, reps=reps, warmup=warmup)

    def compile_stats(self) -> dict:
        cache = self.runtime.cache
        return {**cache.stats.as_dict(), "first_compile_s": getattr(cache, "first_compile_s", None)}

    def load_module(self, source: str):
        """A CUDA source compiled (or found in the kernel cache) and loaded: its kernels by
        `get_function(name)` (benchmarks time a cold compile with it)."""
        return self.runtime.cache.get(source)

    def compiler_ready(self, timeout: float | None = None) -> bool:
        """Wait (at most `timeout` seconds) for NVRTC's one-time start; whether it finished."""
        ready = getattr(self.runtime.cache, "compiler_ready", None)
        return True if ready is None else ready.wait(timeout)

    # ---- runs on a stream the caller owns (segfuse.torch) ------------------------------------
    def external_streams(self):
        """The process's runner of prepared plans on callers' streams with no host
        synchronization (compiler/cuda/external_stream.py: error blocks, stream states)."""
        from .external_stream import external_streams

        return external_streams(self.runtime)
