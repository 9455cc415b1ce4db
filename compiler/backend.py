"""`Backend`: what an Engine needs from a device, one class per device (the NumPy one in
compiler/numpy_backend.py, the CUDA one in compiler/cuda/backend.py; compiler/engine.py keeps the
registry of names).

A backend executes plans it is handed (it never plans), and says how it reads inputs, whether it
compiles, how a warm signature takes its fast path, how a batch of runs defers its errors, and
where results are ordered. Outside the compiler, code reaches a backend only through the Engine
(`Engine.device_backend`), never by importing its modules.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable
from typing import ClassVar

from .codegen.options import DEFAULT_OPTIONS, CodegenOptions


class Backend(ABC):
    name: ClassVar[str]
    device: ClassVar[str] = "cpu"  # "cpu" or "cuda": where a run's outputs live
    compiles: ClassVar[bool] = False  # whether warmup compiles kernels (else it only plans)
    fast_path: ClassVar[bool] = False  # whether `signature`/`prepared_call` give warm calls a fast path
    batch_size: ClassVar[int] = 0  # the most runs one batch holds (0: any number)
    options: CodegenOptions = DEFAULT_OPTIONS

    def __init__(self, options: CodegenOptions | None = None):
        # what its kernels are generated with (compiler/codegen/options.py)
        self.options = options if options is not None else DEFAULT_OPTIONS

    @classmethod
    def unavailable(cls) -> str | None:
        """Why this backend cannot run in this process (no CuPy, no GPU), or None."""
        return None

    @classmethod
    def compile_fallbacks(cls) -> dict:
        """{lowering taken: count} over the process for kernels that did not compile."""
        return {}

    def start(self) -> None:
        """Set up now what the first run would (the CUDA runtime and NVRTC's one-time warm-up)."""
        return None

    # ---- running ---------------------------------------------------------------------------
    @abstractmethod
    def read_inputs(self, fusion, inputs: dict) -> tuple[dict, dict, dict]:
        """(shapes, dtypes, inputs as `run` takes them) of a run's inputs. BindError for an input
        of a dtype segfuse does not know."""

    @abstractmethod
    def run(self, plan, fusion, bound, inputs: dict, deferred: bool) -> tuple[dict, dict]:
        """Execute `plan` (the run's bound sizes `bound`): (outputs, extra timings). `deferred`:
        device errors may be raised by a later run of the thread (see compiler/engine.py)."""

    def signature(self, fusion, inputs: dict) -> Hashable | None:
        """The key of the fast path's table for inputs like these (None: no fast path for them)."""
        return None

    def prepared_call(self, plan, fusion, inputs: dict, deferred: bool) -> Callable[[dict], dict] | None:
        """A call running `plan` on inputs of exactly this signature, skipping binding, planning
        and lookups (None: none for these inputs)."""
        return None

    def synchronize(self) -> None:
        """Wait for the calling thread's runs; raise a deferred failure among them."""
        return None

    # ---- batches (Engine.run_batch) ---------------------------------------------------------
    def begin_batch(self) -> None:
        """Runs until `end_batch` defer their errors, each to a block of its own."""
        return None

    def batch_owner(self, index: int) -> None:
        """The run being launched now is the batch's `index`th."""
        return None

    def end_batch(self) -> dict:
        """Wait for the batch; {index: RunError} of each run that failed on the device."""
        return {}

    def stream_ptr(self) -> int | None:
        """The calling thread's stream (CUDA), where its runs' results are ordered: work queued
        there after a run (a copy of an output) sees them. None where runs are synchronous."""
        return None

    # ---- preparation -----------------------------------------------------------------------
    def warmup(self, plan, fusion, shapes: dict) -> None:
        """Compile `plan`'s kernels for contiguous inputs of these shapes, without running it."""
        return None

    def kernel_modules(self, plan, fusion, shapes: dict) -> list | None:
        """(segment id, codegen Module) of every module a run of contiguous inputs of these shapes
        compiles, in launch order; None where this backend compiles nothing."""
        return None

    def prepared(self, fusion, inputs: dict):
        """What the last prepared run of `fusion` on inputs of these shapes executes (its steps,
        launch count and fallbacks), or None."""
        return None

    def kernel_time_us(self, plan, fusion, inputs: dict, reps: int = 20, warmup: int = 3) -> float:
        """Mean device time of `plan`'s launches alone on these inputs (benchmarks)."""
        raise NotImplementedError(f"the {self.name} backend launches no kernels")

    def compile_stats(self) -> dict:
        """The kernel cache's counts (compiles, hits, seconds spent compiling; empty: none)."""
        return {}
