"""Prometheus metrics, one CollectorRegistry per app (several apps in one process don't clash)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily

# The request counter's `method` label: these, or "other" (a label from the raw method would let
# any client add series without bound).
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
LATENCY_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


class Metrics:
    def __init__(self):
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("segfuse_requests", "HTTP requests by endpoint, method and status",
                                ["endpoint", "method", "status"], registry=r)
        self.run_seconds = Histogram("segfuse_run_seconds", "Fusion run latency, queue wait included",
                                     buckets=LATENCY_BUCKETS, registry=r)
        self.runs = Counter("segfuse_runs", "Fusion runs by outcome", ["outcome"], registry=r)
        self.runs_ok, self.runs_error = self.runs.labels("ok"), self.runs.labels("error")
        self.compiles = Counter("segfuse_compiles", "CUDA kernels compiled", registry=r)
        self.compile_seconds = Counter("segfuse_compile_seconds", "Time spent compiling kernels", registry=r)
        self.cache_hits = Counter("segfuse_kernel_cache_hits", "Engine cache hits (plans and kernels of a shape class)", registry=r)
        self.cache_misses = Counter("segfuse_kernel_cache_misses", "Engine cache misses", registry=r)
        self.buffer_bytes = Gauge("segfuse_buffer_bytes", "Bytes held by stored buffers", registry=r)
        self.buffers = Gauge("segfuse_buffers", "Number of stored buffers", registry=r)
        self.runs_admitted = Gauge("segfuse_runs_admitted", "Runs queued or running", registry=r)
        self.run_batch_size = Histogram("segfuse_run_batch_size", "Runs a worker launched together (one wait)",
                                        buckets=(1, 2, 4, 8, 16, 32, 64, 128), registry=r)
        self.run_queue_seconds = Histogram("segfuse_run_queue_seconds", "Time a run waited in the queue for a worker",
                                           buckets=LATENCY_BUCKETS, registry=r)
        self.fusion_bytes = Gauge("segfuse_fusion_bytes", "Canonical JSON bytes of the fusions held "
                                  "(what --max-fusion-bytes counts)", registry=r)
        self.fusions = Gauge("segfuse_fusions", "Registered fusions", registry=r)
        self.region_bytes = Gauge("segfuse_region_bytes", "Bytes of registered shared-memory regions", ["kind"], registry=r)
        self.regions = Gauge("segfuse_regions", "Registered shared-memory regions", ["kind"], registry=r)
        # Prometheus's "info" convention: value 1, the facts in labels (one sample once the backend
        # started on a GPU, none on NumPy). `shard` is "" outside a segfuse.scaleout shard.
        self.gpu_info = Gauge("segfuse_gpu_info", "The GPU this runtime runs on (value 1)",
                              ["shard", "gpu_uuid", "pci_bus_id", "name", "visible_devices"], registry=r)
        r.register(_CompileFallbacks())

        self._request_counters: dict = {}

    def request_done(self, endpoint: str, method: str, status: int) -> None:
        """Count a request; the labelled counter is looked up once per label set (labels() costs
        microseconds, which the hot path pays on every request otherwise)."""
        if method not in METHODS:
            method = "other"
        key = (endpoint, method, status)
        c = self._request_counters.get(key)
        if c is None:
            c = self._request_counters[key] = self.requests.labels(endpoint, method, str(status))
        c.inc()

    def gpu_identified(self, shard: str | None, gpu: dict | None) -> None:
        """Set segfuse_gpu_info once the backend started (`gpu`: server/gpu_info.py's, or None)."""
        if gpu is not None:
            values = (shard, gpu["uuid"], gpu["pci_bus_id"], gpu["name"], gpu["visible_devices"])
            self.gpu_info.labels(*("" if v is None else v for v in values)).set(1)

    def buffers_changed(self, store) -> None:
        self.buffer_bytes.set(store.used_bytes)
        self.buffers.set(len(store))

    def observe_run(self, seconds: float, hits: int, misses: int, compiled: int, compile_us: float) -> None:
        self.runs_ok.inc()
        self.run_seconds.observe(seconds)
        if hits:
            self.cache_hits.inc(hits)
        if misses:
            self.cache_misses.inc(misses)
        if compiled:
            self.compiles.inc(compiled)
        if compile_us:
            self.compile_seconds.inc(compile_us / 1e6)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _CompileFallbacks:
    """segfuse_compile_fallbacks{lowering}: generated kernels that did not compile, by the lowering
    that ran instead (split, library, host); the process's count (one compiler per process),
    read from the engine's backends when scraped."""

    def describe(self):
        return [self._family()]

    def collect(self):
        from segfuse.compiler.engine import compile_fallbacks

        fam = self._family()
        for lowering, n in sorted(compile_fallbacks().items()):
            fam.add_metric([lowering], n)
        return [fam]

    @staticmethod
    def _family():
        return CounterMetricFamily("segfuse_compile_fallbacks", "Generated kernels that did not compile, "
                                   "by the lowering that ran instead", labels=["lowering"])
