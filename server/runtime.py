"""`Runtime`: what one app instance owns (engine, buffers, fusions, metrics, worker threads), the
bounded run executor that keeps compilation and GPU work off the event loop, and the budgeted
threads that validate graphs and plan runs (`CompilerPool`)."""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from segfuse.compiler import Limits
from segfuse.compiler.limits import BudgetExceeded, budget

from .backend import ArrayBackend, BackendUnavailable, resolve
from .buffers import BufferStore
from .codec import JsonCodec
from .errors import ApiError, too_large
from .fusions import FusionRegistry
from .metrics import Metrics
from .parsed_requests import ParsedRequests
from .regions import RegionStore, metrics_updater
from .runs import execute_batch, finish_batch
from .settings import Settings
from .stats import StatsRecorder
from .worker import RunWorkers

log = logging.getLogger("segfuse.server")


def within_budget(what: str, work: int, seconds: float, fn, *args):
    """fn(*args) under the compiler's work budget (compiler/limits.py); 413 past it."""
    with budget(what, work, seconds, "max_plan_work", "max_plan_seconds"):
        try:
            return fn(*args)
        except BudgetExceeded as e:
            raise too_large(str(e), ["graph"]) from None


class CompilerPool:
    """Threads for compiler work a request waits for (validating a graph, planning a run), each
    call under the work budget (settings max_plan_work, max_plan_seconds; 413 past it).

    Their own threads, not asyncio's default executor (buffer bodies, transfers, shared-memory
    registration), the run workers or the event loop: a graph that is slow to validate or plan
    delays only requests waiting for the same kind of work, and at most for the budget. At most
    `max_waiting` calls wait for a thread; more are refused with 429."""

    threads = 2
    max_waiting = 32

    def __init__(self, name: str, what: str, settings: Settings):
        self.name = name
        self.pool = ThreadPoolExecutor(self.threads, thread_name_prefix=f"segfuse-{name}")
        self.what, self.work, self.seconds = what, settings.max_plan_work, settings.max_plan_seconds
        self.pending = 0  # calls queued or running (counted on the event loop)

    async def call(self, fn, *args):
        """fn(*args) on a thread of the pool, under the budget."""
        if self.pending >= self.threads + self.max_waiting:
            limit = self.threads + self.max_waiting
            raise ApiError(429, f"too many requests at once need {self.what} ({self.pending} waiting or running, "
                                f"at most {limit}); retry later", [{"loc": [], "msg": f"busy {self.what}"}],
                           {"Retry-After": "1"})
        loop = asyncio.get_running_loop()
        self.pending += 1
        done = self.pool.submit(self._run, fn, args)
        # counted out when the thread is done, not when a client goes away (the work goes on)
        done.add_done_callback(lambda _: self._finished_on(loop))
        return await asyncio.wrap_future(done)

    def _finished_on(self, loop) -> None:
        try:
            loop.call_soon_threadsafe(self._finished)
        except RuntimeError:  # the loop closed while the thread worked (the app stopped)
            pass

    def _finished(self) -> None:
        self.pending -= 1

    def _run(self, fn, args):
        return within_budget(self.what, self.work, self.seconds, fn, *args)

    def shutdown(self) -> None:
        # A fresh pool (its threads start on first use) in place of the old: an app's lifespan may
        # run again in the same process, and validation must work then too (it answered 500).
        old, self.pool = self.pool, ThreadPoolExecutor(self.threads, thread_name_prefix=f"segfuse-{self.name}")
        old.shutdown(wait=False, cancel_futures=True)


class RunExecutor:
    """Run workers (server/worker.py) for runs, a thread pool for other work off the loop (plans),
    and a bound on runs admitted (queued or running).

    Beyond the bound a run is refused with 429 and Retry-After (the server is healthy, only busy;
    503 stays reserved for "not ready")."""

    def __init__(self, workers: RunWorkers, max_admitted: int, run_here, initializer=None,
                 plan_budget: tuple[int, float] | None = None):
        self.workers = workers
        self.plan_budget = plan_budget  # (work units, seconds) of `call`
        self._run_here = run_here  # execute and finish a batch on the event loop
        self._staged: list = []
        self.pool = ThreadPoolExecutor(2, thread_name_prefix="segfuse-aux", initializer=initializer)
        self.max_admitted = max_admitted
        self.admitted = 0
        self._idle: asyncio.Event | None = None

    def admit(self) -> None:
        """Count a run in, or refuse it (429); `release` counts it out when its work is done."""
        if self.admitted >= self.max_admitted:
            raise ApiError(429, f"too many runs queued ({self.admitted}, the limit is {self.max_admitted}); "
                                "retry later", [{"loc": [], "msg": "run queue full"}], {"Retry-After": "1"})
        self.admitted += 1

    def stage(self, job) -> None:
        """A warm run on small inputs (it only launches prepared kernels): it runs on the event
        loop, with the other such runs of the same turn of the loop, as one batch when the turn
        ends. Measured on the H200 host (benchmarks/README.md): handing these to a worker thread
        costs more in thread hand-offs and GIL contention than their launches take."""
        self._staged.append(job)
        if len(self._staged) == 1:
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        jobs, self._staged = self._staged, []
        now = time.perf_counter()
        for job in jobs:
            job.t_queued = now
        for k in range(0, len(jobs), self.workers.max_batch):
            self._run_here(jobs[k:k + self.workers.max_batch])

    def release(self) -> None:
        self.admitted -= 1
        if self._idle is not None and not self.admitted:
            self._idle.set()

    async def call(self, fn, *args):
        """Run fn(*args) on a helper thread (planning; not runs), under the plan budget if any."""
        if self.plan_budget is None:
            return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)
        return await asyncio.get_running_loop().run_in_executor(
            self.pool, within_budget, "planning", *self.plan_budget, fn, *args)

    async def drain(self) -> None:
        """Wait until every admitted run has finished."""
        while self.admitted:
            self._idle = asyncio.Event()
            await self._idle.wait()
        self._idle = None

    def shutdown(self) -> None:
        self.workers.stop()
        self.pool.shutdown(wait=True, cancel_futures=True)


class Runtime:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.metrics = Metrics()
        self.limits = Limits(max_ops=settings.max_ops, max_rank=settings.max_rank)
        self.fusions = FusionRegistry(self.limits, settings.max_fusions, settings.max_fusion_bytes,
                                      directory=settings.fusion_dir)
        self.codec = JsonCodec()  # large JSON tensor bodies, in a helper process (server/codec.py)
        self.stats = StatsRecorder(self.fusions)  # Triton-style per-fusion statistics
        self.parsed_requests = ParsedRequests()  # repeated small infer bodies, parsed once
        self.validation = CompilerPool("validate", "validating the graph", settings)
        self.planning = CompilerPool("plan", "planning the run", settings)  # cold runs (server/runs.py)
        self.regions = RegionStore(settings.max_region_bytes, on_change=metrics_updater(self.metrics),
                                   max_regions=settings.max_regions)  # shared memory
        self.engine = None
        self.arrays: ArrayBackend | None = None
        self.store: BufferStore | None = None
        self.executor: RunExecutor | None = None
        self.ready = False
        self.init_error: str | None = None
        self.started = time.time()
        self.freeze_gc = False  # `segfuse serve` sets it: the process is the server's alone
        self.shard: str | None = None  # the shard id, set by a segfuse.scaleout shard before start
        self.gpu: dict | None = None  # the GPU (server/gpu_info.py), read at start; None on NumPy

    @property
    def backend_name(self) -> str:
        return self.arrays.name if self.arrays else self.settings.backend

    @property
    def device(self) -> str:
        return self.arrays.device if self.arrays else "unknown"

    async def start(self) -> None:
        """Initialise the backend off the event loop (CUDA context creation takes seconds)."""
        s = self.settings
        for name, why in await asyncio.to_thread(self.fusions.load_directory):
            log.error("fusion repository %s: %s not registered: %s", s.fusion_dir, name, why)
        if s.fusion_dir:
            log.info("fusion repository %s: %d fusion(s) registered", s.fusion_dir, len(self.fusions))
            self.metrics.fusions.set(len(self.fusions))
        try:
            self.engine, self.arrays = await asyncio.to_thread(resolve, s.backend, s.device, s.cache_dir)
            await asyncio.to_thread(self.arrays.activate)
            self.arrays.activate()  # warm runs may run on the event loop's thread (server/runs.py)
            self.gpu = await asyncio.to_thread(self.arrays.gpu_info)
        except Exception as e:  # stays not ready (503) with the reason
            self.init_error = str(e) if isinstance(e, BackendUnavailable) else f"{type(e).__name__}: {e}"
            log.error("backend not available: %s", self.init_error)
            return
        self.metrics.gpu_identified(self.shard, self.gpu)
        self.store = BufferStore(s.max_buffer_bytes, s.max_total_bytes, self.arrays.device,
                                 on_change=self.metrics.buffers_changed)
        workers = RunWorkers(s.run_workers, s.max_batch, lambda batch: execute_batch(self, batch),
                             lambda batch: finish_batch(self, batch), asyncio.get_running_loop(),
                             initializer=self.arrays.activate)
        def run_here(batch):
            try:
                execute_batch(self, batch)
            except BaseException as e:  # a bug in execute: fail the batch rather than leave it hanging
                log.exception("run batch failed")
                for job in batch:
                    job.error = job.error or e
            finish_batch(self, batch)

        self.executor = RunExecutor(workers, s.max_queued_runs, run_here, initializer=self.arrays.activate,
                                    plan_budget=(s.max_plan_work, s.max_plan_seconds))
        if self.freeze_gc:
            # Startup objects (CuPy, FastAPI, the op registry) will never be garbage: keep them out
            # of the collector's full passes, which otherwise pause requests for milliseconds.
            gc.collect()
            gc.freeze()
        self.ready = True
        g = self.gpu
        log.info("segfuse ready: backend %s on %s%s", self.arrays.name, self.arrays.device,
                 f" ({g['name']}, {g['uuid']}, PCI {g['pci_bus_id']})" if g else "")

    async def validate(self, graph: dict):
        """A graph validated as a Fusion (GraphError -> 422), on the validation threads under the
        budget (413 past it)."""
        return await self.validation.call(self.fusions.parse, graph)

    async def stop(self) -> None:
        self.ready = False
        await asyncio.to_thread(self.codec.shutdown)
        if self.executor:
            await self.executor.drain()
            await asyncio.to_thread(self.executor.shutdown)
        self.validation.shutdown()
        self.planning.shutdown()

    async def on_device(self, fn, *args):
        """fn(*args) on a helper thread with the device selected (transfers; not runs)."""
        def call():
            self.arrays.activate()
            return fn(*args)

        return await asyncio.to_thread(call)

    def require_ready(self) -> None:
        if not self.ready:
            why = f": {self.init_error}" if self.init_error else " (the backend is starting)"
            raise ApiError(503, f"not ready{why}", [{"loc": [], "msg": "not ready"}], {"Retry-After": "1"})
