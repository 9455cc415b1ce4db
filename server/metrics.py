"""Prometheus metrics, one CollectorRegistry per app (several apps in one process don't clash).

The counters and histograms that every request and run updates are plain numbers owned by
`Metrics`, exported when scraped by a collector with the names, HELP, labels and buckets they had
as prometheus_client objects: those take a lock per update (about nine per infer), and these
updates all happen on the event loop's thread (GuardMiddleware, server/runs.py's `run` and
`commit_batch`), where nothing interleaves with them. prometheus_client keeps the registry and the
exposition format; the buffer gauges (set per stored output) are plain numbers too, gauges set now
and then stay its objects.
"""

from __future__ import annotations

import time
from bisect import bisect_left

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client import metrics as prometheus_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from . import triton_metrics
from .protocol import MODEL_VERSION

# The request counter's `method` label: these, or "other" (a label from the raw method would let
# any client add series without bound).
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
LATENCY_BUCKETS = (1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


class PlainCounter:
    """A counter's value. `inc` on the event loop's thread only (no lock: `+=` is not atomic
    between threads); a scrape may read it from anywhere."""

    __slots__ = ("name", "help", "value", "created")

    def __init__(self, name: str, help: str):
        self.name, self.help, self.value, self.created = name, help, 0.0, time.time()

    def inc(self, amount: float = 1) -> None:
        self.value += amount

    def family(self, created: bool) -> CounterMetricFamily:
        fam = CounterMetricFamily(self.name, self.help)
        fam.add_metric([], self.value, self.created if created else None)
        return fam


class PlainHistogram:
    """A histogram's per-bucket counts (not cumulative: one is added per observation) and sum,
    exported cumulatively. `observe` on the event loop's thread only, like PlainCounter.inc."""

    __slots__ = ("name", "help", "bounds", "counts", "sum", "created", "_le")

    def __init__(self, name: str, help: str, buckets):
        self.name, self.help = name, help
        self.bounds = (*(float(b) for b in buckets), float("inf"))
        self._le = [floatToGoString(b) for b in self.bounds]
        self.counts = [0] * len(self.bounds)
        self.sum, self.created = 0.0, time.time()

    def observe(self, amount: float) -> None:
        # the first bucket whose bound is >= amount: a value on a bound counts in it (`le`)
        self.counts[bisect_left(self.bounds, amount)] += 1
        self.sum += amount

    def family(self, created: bool) -> HistogramMetricFamily:
        counts, total = tuple(self.counts), self.sum  # one read: the buckets agree with each other
        cumulative, acc = [], 0
        for le, n in zip(self._le, counts):
            acc += n
            cumulative.append((le, float(acc)))
        fam = HistogramMetricFamily(self.name, self.help)
        fam.add_metric([], cumulative, total)
        if created:
            fam.samples.append(Sample(self.name + "_created", {}, self.created))
        return fam


class Metrics:
    def __init__(self):
        self.registry = CollectorRegistry(auto_describe=True)
        # (endpoint, method, status) -> [count, time first seen], in the order first seen
        self._requests: dict[tuple, list] = {}
        self.run_seconds = PlainHistogram("segfuse_run_seconds", "Fusion run latency, queue wait included",
                                          LATENCY_BUCKETS)
        self.runs_ok = PlainCounter("segfuse_runs", "Fusion runs by outcome")
        self.runs_error = PlainCounter("segfuse_runs", "Fusion runs by outcome")
        self.compiles = PlainCounter("segfuse_compiles", "CUDA kernels compiled")
        self.compile_seconds = PlainCounter("segfuse_compile_seconds", "Time spent compiling kernels")
        self.cache_hits = PlainCounter("segfuse_kernel_cache_hits",
                                       "Engine cache hits (plans and kernels of a shape class)")
        self.cache_misses = PlainCounter("segfuse_kernel_cache_misses", "Engine cache misses")
        self.priority_requests = PlainCounter("segfuse_infer_priority_requests", "Infer requests that carried "
                                              "parameters.priority (no effect: runs wait in one queue)")
        self.buffer_count, self.buffer_bytes = 0, 0  # set on each change of the buffer store
        self.runs_admitted = Gauge("segfuse_runs_admitted", "Runs queued or running", registry=None)
        self.run_batch_size = PlainHistogram("segfuse_run_batch_size", "Runs a worker launched together (one wait)",
                                             BATCH_BUCKETS)
        self.run_queue_seconds = PlainHistogram("segfuse_run_queue_seconds",
                                                "Time a run waited in the queue for a worker", LATENCY_BUCKETS)
        self.fusion_bytes = Gauge("segfuse_fusion_bytes", "Canonical JSON bytes of the fusions held "
                                  "(what --max-fusion-bytes counts)", registry=None)
        self.fusions = Gauge("segfuse_fusions", "Registered fusions", registry=None)
        self.region_bytes = Gauge("segfuse_region_bytes", "Bytes of registered shared-memory regions", ["kind"],
                                  registry=None)
        self.regions = Gauge("segfuse_regions", "Registered shared-memory regions", ["kind"], registry=None)
        # Prometheus's "info" convention: value 1, the facts in labels (one sample once the backend
        # started on a GPU, none on NumPy). `shard` is "" outside a segfuse.scaleout shard.
        self.gpu_info = Gauge("segfuse_gpu_info", "The GPU this runtime runs on (value 1)",
                              ["shard", "gpu_uuid", "pci_bus_id", "name", "visible_devices"], registry=None)
        # Read when scraped (`watch`): each fusion's counts (server/stats.py) and the GPU's usage.
        self.read_models, self.read_gpus = (lambda: []), (lambda: [])
        self.registry.register(_Exposition(self))
        self.registry.register(_CompileFallbacks())

    def watch(self, read_models, read_gpus) -> None:
        """Where scrapes read the per-fusion counts (`StatsRecorder.counts`: Triton's inference
        families and segfuse_infer_rejected) and the GPU's usage (server/gpu_info.py `usage` of each
        GPU, [] without one) from: functions that may be called on any thread."""
        self.read_models, self.read_gpus = read_models, read_gpus

    def request_done(self, endpoint: str, method: str, status: int) -> None:
        """Count a request (on the event loop's thread)."""
        if method not in METHODS:
            method = "other"
        cell = self._requests.get((endpoint, method, status))
        if cell is None:
            cell = self._requests[(endpoint, method, status)] = [0, time.time()]
        cell[0] += 1

    def gpu_identified(self, shard: str | None, gpu: dict | None) -> None:
        """Set segfuse_gpu_info once the backend started (`gpu`: server/gpu_info.py's, or None)."""
        if gpu is not None:
            values = (shard, gpu["uuid"], gpu["pci_bus_id"], gpu["name"], gpu["visible_devices"])
            self.gpu_info.labels(*("" if v is None else v for v in values)).set(1)

    def buffers_changed(self, store) -> None:
        self.buffer_bytes, self.buffer_count = store.used_bytes, len(store)

    def observe_run(self, seconds: float, hits: int, misses: int, compiled: int, compile_us: float) -> None:
        """Count a successful run (on the event loop's thread): PlainCounter.inc and
        PlainHistogram.observe written out, this being once per run."""
        self.runs_ok.value += 1
        h = self.run_seconds
        h.counts[bisect_left(h.bounds, seconds)] += 1
        h.sum += seconds
        if hits:
            self.cache_hits.value += hits
        if misses:
            self.cache_misses.value += misses
        if compiled:
            self.compiles.value += compiled
        if compile_us:
            self.compile_seconds.value += compile_us / 1e6

    def render(self) -> bytes:
        """segfuse's families (prometheus_client's exposition), then Triton's (server/triton_metrics.py)."""
        return generate_latest(self.registry) + \
            triton_metrics.exposition(self.read_models(), MODEL_VERSION, self.read_gpus())


class _Exposition:
    """Every metric of `Metrics` but the compile fallbacks, in the order dashboards have seen them:
    the plain numbers as metric families, the gauges as prometheus_client collects them."""

    def __init__(self, metrics: Metrics):
        self.metrics = metrics

    def collect(self):
        m = self.metrics
        created = prometheus_metrics._use_created  # prometheus_client's switch for `_created` samples
        requests = CounterMetricFamily("segfuse_requests", "HTTP requests by endpoint, method and status",
                                       labels=["endpoint", "method", "status"])
        for (endpoint, method, status), (n, first) in tuple(m._requests.items()):  # a copy: a scrape may run anywhere
            requests.add_metric([endpoint, method, str(status)], n, first if created else None)
        yield requests
        yield m.run_seconds.family(created)
        runs = CounterMetricFamily(m.runs_ok.name, m.runs_ok.help, labels=["outcome"])
        for outcome, c in (("ok", m.runs_ok), ("error", m.runs_error)):
            runs.add_metric([outcome], c.value, c.created if created else None)
        yield runs
        for c in (m.compiles, m.compile_seconds, m.cache_hits, m.cache_misses):
            yield c.family(created)
        yield GaugeMetricFamily("segfuse_buffer_bytes", "Bytes held by stored buffers", m.buffer_bytes)
        yield GaugeMetricFamily("segfuse_buffers", "Number of stored buffers", m.buffer_count)
        yield from m.runs_admitted.collect()
        yield m.run_batch_size.family(created)
        yield m.run_queue_seconds.family(created)
        for g in (m.fusion_bytes, m.fusions, m.region_bytes, m.regions, m.gpu_info):
            yield from g.collect()
        yield m.priority_requests.family(created)
        rejected = CounterMetricFamily("segfuse_infer_rejected", "Infer requests refused before their fusion ran, "
                                       "by fusion and reason (not runs: no statistics)", labels=["model", "reason"])
        for counts in m.read_models():
            for reason, n in counts.rejected.items():
                if n:
                    rejected.add_metric([counts.name, reason], n)
        yield rejected


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
