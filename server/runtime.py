"""`Runtime`: what one app instance owns (engine, buffers, fusions, metrics, worker threads), and the
bounded run executor that keeps compilation and GPU work off the event loop."""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor

from segfuse.compiler import Limits

from .backend import ArrayBackend, BackendUnavailable, resolve
from .buffers import BufferStore
from .errors import ApiError
from .fusions import FusionRegistry
from .metrics import Metrics
from .regions import RegionStore, metrics_updater
from .settings import Settings

log = logging.getLogger("segfuse.server")


class RunExecutor:
    """Worker threads for runs, with a bound on runs admitted (queued or running).

    Beyond the bound a run is refused with 429 and Retry-After (the server is healthy, only busy;
    503 stays reserved for "not ready"). Work is submitted as detached tasks so a client that
    disconnects cannot release a run's pins while a worker thread still uses its buffers.
    """

    def __init__(self, workers: int, max_admitted: int, initializer=None):
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="segfuse-run", initializer=initializer)
        self.max_admitted = max_admitted
        self.admitted = 0
        self._tasks: set[asyncio.Task] = set()

    def admit(self) -> None:
        """Count a run in, or refuse it (429); `release` counts it out when its work is done."""
        if self.admitted >= self.max_admitted:
            raise ApiError(429, f"too many runs queued ({self.admitted}, the limit is {self.max_admitted}); "
                                "retry later", [{"loc": [], "msg": "run queue full"}], {"Retry-After": "1"})
        self.admitted += 1

    def release(self) -> None:
        self.admitted -= 1

    async def call(self, fn, *args):
        """Run fn(*args) on a worker thread."""
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    async def detached(self, coro):
        """Await `coro` as its own task: cancelling the caller does not cancel it."""
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return await asyncio.shield(task)

    def _finished(self, task: asyncio.Task) -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: a caller that went away must not leave a warning

    async def drain(self) -> None:
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def shutdown(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


class Runtime:
    def __init__(self, settings: Settings):
        self.settings = settings
        self.metrics = Metrics()
        self.limits = Limits(max_ops=settings.max_ops, max_rank=settings.max_rank)
        self.fusions = FusionRegistry(self.limits)
        self.regions = RegionStore(settings.max_region_bytes, on_change=metrics_updater(self.metrics))  # shared memory
        self.engine = None
        self.arrays: ArrayBackend | None = None
        self.store: BufferStore | None = None
        self.executor: RunExecutor | None = None
        self.ready = False
        self.init_error: str | None = None
        self.started = time.time()

    @property
    def backend_name(self) -> str:
        return self.arrays.name if self.arrays else self.settings.backend

    @property
    def device(self) -> str:
        return self.arrays.device if self.arrays else "unknown"

    async def start(self) -> None:
        """Initialise the backend off the event loop (CUDA context creation takes seconds)."""
        s = self.settings
        try:
            self.engine, self.arrays = await asyncio.to_thread(resolve, s.backend, s.device, s.cache_dir)
            await asyncio.to_thread(self.arrays.activate)
        except Exception as e:  # stays not ready (503) with the reason
            self.init_error = str(e) if isinstance(e, BackendUnavailable) else f"{type(e).__name__}: {e}"
            log.error("backend not available: %s", self.init_error)
            return
        self.store = BufferStore(s.max_buffer_bytes, s.max_total_bytes, self.arrays.device,
                                 on_change=self.metrics.buffers_changed)
        self.executor = RunExecutor(s.run_workers, s.max_queued_runs, initializer=self.arrays.activate)
        self.ready = True
        log.info("segfuse ready: backend %s on %s", self.arrays.name, self.arrays.device)

    async def stop(self) -> None:
        self.ready = False
        if self.executor:
            await self.executor.drain()
            await asyncio.to_thread(self.executor.shutdown)

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
