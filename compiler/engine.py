"""`Engine`: the one entry point that runs fusions, whatever the backend.

The server, the CLI and `FusionDefinition.execute` all go through it. A run binds the inputs'
sizes, gets the plan of their shape class from the `PlanCache` (planning only on a miss), and
executes the plan segment by segment on the backend.

Contract: `Engine(backend).run(fusion, inputs) -> RunResult`; an input array is never written
unless an output declares `alias_of` it, and those are updated only when the whole run
succeeded (a RunError leaves every input untouched).

Errors found on the device (a bad index, an integer division by zero) are raised by the run that
hit them: it waits for its kernels first. `Engine("cupy", errors="deferred")` trades that for
latency, as CUDA and PyTorch do: such a run returns once launched and its failure is raised by a
later run on the same thread or by `Engine.synchronize()` (a `DeferredRunError` naming the graph,
op and index). Runs that update an input in place are always checked before they return.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np

from .backend import Backend
from .codegen.options import DEFAULT_OPTIONS, CodegenOptions
from .ir import Fusion
from .plan import Plan
from .segmenter.cache import SHARED_PLANS, PlanCache

_clock = time.perf_counter


class RunResult:
    """A run's outputs, its timings in microseconds (plan, compile, run, and the backend's own)
    and its plan-cache hits and misses. A fast-path run keeps only its run time and builds the
    timings dict when it is read (about 1 us of a decode-size call's host time otherwise)."""

    __slots__ = ("outputs", "_timings", "cache_hits", "cache_misses")

    def __init__(self, outputs: dict, timings_us: dict | None = None, cache_hits: int = 0, cache_misses: int = 0):
        self.outputs = outputs
        self._timings = {} if timings_us is None else timings_us
        self.cache_hits, self.cache_misses = cache_hits, cache_misses

    @property
    def timings_us(self) -> dict[str, float]:
        t = self._timings
        if type(t) is float:  # a fast-path run's time
            t = self._timings = {"plan": 0.0, "compile": 0.0, "run": t}
        return t

    @timings_us.setter
    def timings_us(self, value: dict) -> None:
        self._timings = value

    def __repr__(self) -> str:
        return (f"RunResult(outputs={self.outputs!r}, timings_us={self.timings_us!r}, "
                f"cache_hits={self.cache_hits}, cache_misses={self.cache_misses})")

    def __eq__(self, other) -> bool:
        if not isinstance(other, RunResult):
            return NotImplemented
        return (self.outputs, self.timings_us, self.cache_hits, self.cache_misses) == \
            (other.outputs, other.timings_us, other.cache_hits, other.cache_misses)

    __hash__ = None


def _fast_result(outputs: dict, run_us: float) -> RunResult:
    r = _NEW(RunResult)
    r.outputs, r._timings, r.cache_hits, r.cache_misses = outputs, run_us, 1, 0
    return r


_NEW = object.__new__


ERROR_MODES = ("raise", "deferred")
MAX_FAST_SIGNATURES = 4096  # per Engine; past that the table starts over (bounded memory)


def _numpy_backend() -> type[Backend]:
    from .numpy_backend import NumpyBackend

    return NumpyBackend


def _cupy_backend() -> type[Backend]:
    from .cuda.backend import CupyBackend  # its module imports CuPy only when it runs

    return CupyBackend


# Backend name -> its class (imported when first asked for). One instance per process and name
# (`backend_for`): a backend's state (the CUDA runtime, its kernel cache) is the process's.
BACKEND_CLASSES: dict[str, Callable[[], type[Backend]]] = {"numpy": _numpy_backend, "cupy": _cupy_backend}
_INSTANCES: dict[str, Backend] = {}
_ILOCK = threading.Lock()


def backend_unavailable(name: str) -> str | None:
    """Why backend `name` cannot run in this process, or None (ValueError: no such backend)."""
    if name not in BACKEND_CLASSES:
        raise ValueError(f"unknown backend '{name}' (available: {', '.join(sorted(BACKEND_CLASSES))})")
    return BACKEND_CLASSES[name]().unavailable()


def resolve_backend(name: str) -> str:
    """The backend a name stands for: "auto" is "cupy" where CuPy sees a GPU, else "numpy"; other
    names stand for themselves (ValueError: unknown, or not available here)."""
    if name == "auto":
        return "cupy" if backend_unavailable("cupy") is None else "numpy"
    why = backend_unavailable(name)
    if why:  # refused here, not at the first run
        raise ValueError(f"the {name} backend is not available here: {why}")
    return name


def backend_for(name: str, options: CodegenOptions | None = None) -> Backend:
    """The process's instance of backend `name` ("auto" resolved first); with code generator
    options other than the defaults, an instance of its own."""
    if options is not None and options != DEFAULT_OPTIONS:
        return BACKEND_CLASSES[resolve_backend(name)]()(options)
    hit = _INSTANCES.get(name)
    if hit is not None:
        return hit
    name = resolve_backend(name)
    with _ILOCK:
        hit = _INSTANCES.get(name)
        if hit is None:
            hit = _INSTANCES[name] = BACKEND_CLASSES[name]()()
        return hit


def compile_fallbacks() -> dict:
    """{lowering taken: count} over the process for generated kernels that did not compile
    (whichever backend compiled them; the server's segfuse_compile_fallbacks metric)."""
    out: dict = {}
    for load in BACKEND_CLASSES.values():
        for lowering, n in load().compile_fallbacks().items():
            out[lowering] = out.get(lowering, 0) + n
    return out


class Engine:
    """Runs fusions on one backend: "numpy", "cupy", "auto" (cupy where CuPy sees a GPU, else
    numpy), or a `Backend` instance (compiler/backend.py). `options`: the code generator's
    (`CodegenOptions`; with a Backend instance, give them to the instance instead)."""

    _defaults: dict[str, Engine] = {}

    def __init__(self, backend: str | Backend = "numpy", plan_cache: PlanCache | None = None, errors: str = "raise",
                 options: CodegenOptions | None = None):
        if errors not in ERROR_MODES:
            raise ValueError(f"errors must be one of {', '.join(ERROR_MODES)}, not {errors!r}")
        if isinstance(backend, Backend) and options is not None:
            raise ValueError("options go to the Backend instance itself (Backend(options=...))")
        impl = backend if isinstance(backend, Backend) else backend_for(backend, options)
        self.device_backend = impl
        self.backend = impl.name
        self.errors = errors
        self._deferred = errors == "deferred"
        # One cache per process unless given (segmenter.cache.SHARED_PLANS)
        self.plans = plan_cache if plan_cache is not None else SHARED_PLANS
        # input signature -> prepared call: a warm graph skips binding, planning and lookups
        self._signature = impl.signature if impl.fast_path else None
        self._calls: dict = {}
        # run_batch defers every run's errors: its prepared calls are made in that mode
        self._deferred_calls: dict = self._calls if self._deferred else {}

    @classmethod
    def default(cls, backend: str = "numpy") -> Engine:
        if backend not in cls._defaults:
            cls._defaults[backend] = cls(backend)
        return cls._defaults[backend]

    @property
    def device(self) -> str:
        return self.device_backend.device

    @property
    def compiles(self) -> bool:
        """Whether this backend compiles kernels (and so whether warmup does more than plan)."""
        return self.device_backend.compiles

    def start(self) -> None:
        """Set the backend up now rather than in the first run (CUDA: the runtime, and NVRTC's
        one-time start in the background)."""
        self.device_backend.start()

    def synchronize(self) -> None:
        """Wait for this thread's runs on this backend; with `errors="deferred"`, raise the first
        failure among them (`DeferredRunError`). A no-op on the NumPy backend."""
        self.device_backend.synchronize()

    def warmup(self, fusion: Fusion, shapes: dict[str, tuple]) -> Plan:
        """Plan for these input shapes and compile every kernel of the plan, without running it."""
        plan = self.plan(fusion, shapes)
        self.device_backend.warmup(plan, fusion, shapes)  # the cached plan: runs find its kernels
        return plan

    def kernel_modules(self, fusion: Fusion, shapes: dict[str, tuple], plan: Plan | None = None) -> list:
        """(segment id, codegen Module) for every generated module a run of contiguous inputs of
        these shapes compiles, in launch order, from the backend's own preparation of the cached
        plan (aliases, strides and splits included). The CUDA backend prepares it as `warmup` does
        (compiling; runs then find the kernels); a backend that compiles nothing answers with the
        CUDA preparation's modules for the code generator's nominal device, compiling nothing."""
        plan = plan if plan is not None else self.plan(fusion, shapes)
        modules = self.device_backend.kernel_modules(plan, fusion, shapes)
        if modules is not None:
            return modules
        from .cuda.prepare import modules_without_device

        return modules_without_device(fusion, plan, fusion.bind(shapes), options=self.device_backend.options)

    def compile_offline(self, fusion: Fusion, shapes: dict[str, tuple], arch: str = "sm_90") -> tuple[str, list]:
        """Compile every module `kernel_modules` lists with NVRTC for `arch`, with no GPU (the
        nvrtc extra): (NVRTC's version, [(segment id, module key, cubin bytes), ...]). Checks a
        deployment's graphs where the GPU is not (a CI machine, an image build). Raises
        CompileError with NVRTC's log, or RuntimeError where NVRTC cannot be loaded."""
        from .cuda import nvrtc

        compiler = nvrtc.version()
        if compiler == "nvrtc-none":
            raise RuntimeError("NVRTC cannot be loaded: pip install 'segfuse[nvrtc]' "
                               "(cuda-bindings and nvidia-cuda-nvrtc)")
        return compiler, [(seg, mod.key, len(nvrtc.compile_cubin(mod.source, nvrtc.default_options(arch))[0]))
                          for seg, mod in self.kernel_modules(fusion, shapes)]

    def plan(self, fusion: Fusion, shapes: dict[str, tuple], dtypes: dict | None = None) -> Plan:
        """The plan for inputs of these shapes (and dtypes; default: the graph's), through the
        per-shape-class cache."""
        return self.plans.get(fusion, fusion.bind(shapes, dtypes))[0]

    def prepared(self, fusion: Fusion, inputs: dict):
        """What the backend's last prepared run of `fusion` on inputs of these shapes executes (its
        steps, launch count, fallbacks), or None (not prepared; a backend that prepares nothing)."""
        return self.device_backend.prepared(fusion, inputs)

    def kernel_time_us(self, fusion: Fusion, inputs: dict, reps: int = 20, warmup: int = 3,
                       plan: Plan | None = None) -> float:
        """Mean device time of the launches alone of a run on `inputs` (of `plan`; default: the
        cached one), for benchmarks. NotImplementedError on a backend that launches no kernels."""
        if plan is None:
            shapes, dtypes, _ = self.device_backend.read_inputs(fusion, inputs)
            plan = self.plan(fusion, shapes, dtypes)
        return self.device_backend.kernel_time_us(plan, fusion, inputs, reps=reps, warmup=warmup)

    def run(self, fusion: Fusion, inputs: dict[str, np.ndarray]) -> RunResult:
        sig = self._signature
        if sig is not None:  # `_run`'s fast path, inline (a call's host time at decode sizes)
            key = sig(fusion, inputs)
            call = self._calls.get(key) if key is not None else None
            if call is not None:
                t0 = _clock()
                outputs = call(inputs)
                return _fast_result(outputs, (_clock() - t0) * 1e6)
        return self._run(fusion, inputs, self._deferred, self._calls)

    def is_warm(self, fusion: Fusion, inputs: dict, bound=None) -> bool:
        """Whether a run of `fusion` on inputs like these does no planning or compiling: on a
        device backend it takes the prepared fast path in a batch (only launches); on the host
        backend (nothing compiles) its plan is cached, for `bound` (fusion.bind of the inputs)
        when given. A server runs warm runs inline."""
        sig = self._signature
        if sig is None:
            be = self.device_backend
            if be.compiles or be.device != "cpu":
                return False
            if bound is None:
                shapes, dtypes, _ = be.read_inputs(fusion, inputs)
                bound = fusion.bind(shapes, dtypes)
            return self.plans.cached(fusion, bound) is not None
        key = sig(fusion, inputs)
        return key is not None and key in self._deferred_calls

    def run_batch(self, calls: list[tuple[Fusion, dict]],
                  on_launched: Callable[[int, RunResult], None] | None = None) -> list[RunResult | Exception]:
        """Run `(fusion, inputs)` pairs back to back and wait for the device once, as a server
        does with the runs waiting in its queue. Each pair gets its own outcome, in order: a
        RunResult, or the exception that run alone failed with (a bad index fails its run with the
        RunError a lone run raises; the other runs' outputs are complete). Runs that update an
        input in place wait for their own outcome, as in `run`. On the GPU every run of a batch
        uses the calling thread's stream, so a later run sees an earlier one's outputs.
        `on_launched(i, result)` is called once run i is launched, before the batch waits: work it
        queues on the thread's stream (copies of the outputs, say) is covered by the same wait; an
        exception from it becomes run i's outcome."""
        be = self.device_backend
        results: list = []
        step = be.batch_size or len(calls) or 1
        for start in range(0, len(calls), step):
            be.begin_batch()
            try:
                for k, (fusion, inputs) in enumerate(calls[start:start + step]):
                    be.batch_owner(k)
                    try:
                        result = self._run(fusion, inputs, True, self._deferred_calls)
                        if on_launched is not None:
                            on_launched(start + k, result)
                        results.append(result)
                    except Exception as e:  # this run's failure; the batch goes on
                        results.append(e)
            finally:
                failures = be.end_batch()
            for k, err in failures.items():
                results[start + k] = err
        return results

    def _run(self, fusion: Fusion, inputs: dict, deferred: bool, calls: dict) -> RunResult:
        sig = self._signature
        key = None
        if sig is not None:
            key = sig(fusion, inputs)
            call = calls.get(key) if key is not None else None
            if call is not None:
                t0 = _clock()
                outputs = call(inputs)
                return _fast_result(outputs, (_clock() - t0) * 1e6)
        be = self.device_backend
        t0 = time.perf_counter()
        shapes, dtypes, inputs = be.read_inputs(fusion, inputs)
        bound = fusion.bind(shapes, dtypes)  # (remembered per input signature)
        plan, hit = self.plans.get(fusion, bound)
        t1 = time.perf_counter()
        outputs, extra = be.run(plan, fusion, bound, inputs, deferred)
        t2 = time.perf_counter()
        if key is not None:  # it ran, so the signature is valid: later calls take the fast path
            if len(calls) >= MAX_FAST_SIGNATURES:
                calls.clear()
            call = be.prepared_call(plan, fusion, inputs, deferred)
            if call is not None:
                calls[key] = call
        timings = {"plan": (t1 - t0) * 1e6, "compile": 0.0, "run": (t2 - t1) * 1e6}
        timings.update(extra)
        return RunResult(outputs=outputs, timings_us=timings, cache_hits=int(hit), cache_misses=int(not hit))
