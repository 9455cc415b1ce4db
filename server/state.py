"""`ServerState`: what one app instance owns (engine, buffers, fusions, metrics, the executors of
server/executors.py), its start and stop. The FastAPI app keeps it as `app.state.server_state`."""

from __future__ import annotations

import asyncio
import gc
import logging
import time

from segfuse.compiler import Limits

from .array_backends import ArrayBackend, BackendUnavailable, resolve
from .buffers import BufferStore
from .codec import JsonCodec
from .errors import ApiError
from .executors import CompilerPool, RunExecutor
from .fusions import FusionRegistry
from .metrics import Metrics
from .parsed_requests import ParsedRequests
from .regions import RegionStore, metrics_updater
from .settings import Settings
from .stats import StatsRecorder
from .worker import RunWorkers

log = logging.getLogger("segfuse.server")


class ServerState:
    """The app's state, handed to every route and stage of a run."""

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

    async def start(self, launch_batch, commit_batch) -> None:
        """Initialise the backend off the event loop (CUDA context creation takes seconds).
        `launch_batch(state, runs)` executes a batch of admitted runs on a run worker (or the
        event loop), `commit_batch(state, runs, done)` answers them on the event loop
        (server/launch.py, server/runs.py: passed in, so that this module needs neither)."""
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
        workers = RunWorkers(s.run_workers, s.max_batch, lambda runs: launch_batch(self, runs),
                             lambda runs, done: commit_batch(self, runs, done), asyncio.get_running_loop(),
                             initializer=self.arrays.activate)
        self.executor = RunExecutor(workers, s.max_queued_runs, initializer=self.arrays.activate,
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
        """A graph validated as a Fusion (GraphError -> 400), on the validation threads under the
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
