"""GET /metrics counts what the requests did, and keeps its exposition: every metric's name, type,
HELP text, labels and bucket boundaries, and values that agree with counts made here.

The oracles are independent of server/metrics.py: the requests this test sent (their routes,
methods and the statuses they got), what each run's response reports (its latency, batch size and
cache counts), and prometheus_client's own Counter and Histogram objects fed the same observations."""

from __future__ import annotations

import asyncio
import collections
import math

import numpy as np
import pytest
from helpers.graphs import counts_of
from helpers.service import put_raw
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from segfuse.server.metrics import LATENCY_BUCKETS, Metrics

pytestmark = pytest.mark.anyio

INF = float("inf")
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)
INFER = "/v2/models/moe_problem_sizes/infer"

# (family name as the parser reports it, type, HELP): the exposition's contract with dashboards
FAMILIES = [
    ("segfuse_requests", "counter", "HTTP requests by endpoint, method and status"),
    ("segfuse_run_seconds", "histogram", "Fusion run latency, queue wait included"),
    ("segfuse_runs", "counter", "Fusion runs by outcome"),
    ("segfuse_compiles", "counter", "CUDA kernels compiled"),
    ("segfuse_compile_seconds", "counter", "Time spent compiling kernels"),
    ("segfuse_kernel_cache_hits", "counter", "Engine cache hits (plans and kernels of a shape class)"),
    ("segfuse_kernel_cache_misses", "counter", "Engine cache misses"),
    ("segfuse_buffer_bytes", "gauge", "Bytes held by stored buffers"),
    ("segfuse_buffers", "gauge", "Number of stored buffers"),
    ("segfuse_runs_admitted", "gauge", "Runs queued or running"),
    ("segfuse_run_batch_size", "histogram", "Runs a worker launched together (one wait)"),
    ("segfuse_run_queue_seconds", "histogram", "Time a run waited in the queue for a worker"),
    ("segfuse_fusion_bytes", "gauge", "Canonical JSON bytes of the fusions held (what --max-fusion-bytes counts)"),
    ("segfuse_fusions", "gauge", "Registered fusions"),
    ("segfuse_region_bytes", "gauge", "Bytes of registered shared-memory regions"),
    ("segfuse_regions", "gauge", "Registered shared-memory regions"),
    ("segfuse_gpu_info", "gauge", "The GPU this runtime runs on (value 1)"),
    ("segfuse_infer_priority_requests", "counter",
     "Infer requests that carried parameters.priority (no effect: runs wait in one queue)"),
    ("segfuse_infer_rejected", "counter",
     "Infer requests refused before their fusion ran, by fusion and reason (not runs: no statistics)"),
    ("segfuse_compile_fallbacks", "counter", "Generated kernels that did not compile, by the lowering that ran instead"),
    # Triton's families, as Triton 2.51 names and documents them (tests/test_triton_metrics.py: their labels)
    ("nv_inference_request_success", "counter", "Number of successful inference requests, all batch sizes"),
    ("nv_inference_request_failure", "counter", "Number of failed inference requests, all batch sizes"),
    ("nv_inference_count", "counter", "Number of inferences performed (does not include cached requests)"),
    ("nv_inference_exec_count", "counter", "Number of model executions performed (does not include cached requests)"),
    ("nv_inference_request_duration_us", "counter",
     "Cumulative inference request duration in microseconds (includes cached requests)"),
    ("nv_inference_queue_duration_us", "counter",
     "Cumulative inference queuing duration in microseconds (includes cached requests)"),
    ("nv_inference_compute_input_duration_us", "counter",
     "Cumulative compute input duration in microseconds (does not include cached requests)"),
    ("nv_inference_compute_infer_duration_us", "counter",
     "Cumulative compute inference duration in microseconds (does not include cached requests)"),
    ("nv_inference_compute_output_duration_us", "counter",
     "Cumulative inference compute output duration in microseconds (does not include cached requests)"),
]
# counted per fusion (tests/test_triton_metrics.py), or read from the compiler: not in `reference`
PER_FUSION = ("segfuse_compile_fallbacks", "segfuse_infer_rejected")
COUNTED = [name for name, kind, _ in FAMILIES if kind in ("counter", "histogram") and name not in PER_FUSION
           and not name.startswith("nv_")]


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def samples(fams: dict, family: str, suffix: str) -> dict:
    """{frozenset(labels): value} of one family's samples named family + suffix."""
    return {frozenset(s.labels.items()): s.value for s in fams[family].samples if s.name == family + suffix}


def value(fams: dict, family: str, suffix: str = "", **labels) -> float:
    return samples(fams, family, suffix)[frozenset(labels.items())]


def buckets(fams: dict, family: str) -> list[tuple[float, float]]:
    """(upper bound, cumulative count) of an unlabelled histogram, in exposition order."""
    return [(float(s.labels["le"]), s.value) for s in fams[family].samples if s.name == family + "_bucket"]


def expected_buckets(bounds, observed) -> list[tuple[float, float]]:
    """Cumulative counts of `observed` per upper bound (inclusive), +Inf last: Prometheus's rule."""
    return [(float(b), float(sum(1 for x in observed if x <= b))) for b in (*bounds, INF)]


def check_histogram(fams: dict, family: str, bounds, count: int) -> list[tuple[float, float]]:
    """The bucket boundaries are `bounds` then +Inf; counts are cumulative (never fall), +Inf is the
    count and _count says the same."""
    got = buckets(fams, family)
    assert [b for b, _ in got] == [float(b) for b in (*bounds, INF)], got
    counts = [n for _, n in got]
    assert counts == sorted(counts), got
    assert counts[-1] == value(fams, family, "_count") == count, (got, count)
    return got


async def test_metrics_count_the_requests_runs_and_batches(asgi_server, server_backend, moe_graph):
    sent: collections.Counter = collections.Counter()  # (endpoint, method, status) as this test sent them

    async with asgi_server(backend=server_backend) as c:
        async def call(method: str, path: str, endpoint: str, label: str | None = None, **kw):
            r = await c.request(method, path, **kw)
            sent[(endpoint, label or method, str(r.status_code))] += 1
            return r

        for _ in range(3):
            assert (await call("GET", "/v2/health/live", "/v2/health/live")).status_code == 200
        assert (await call("GET", "/v2/health/ready", "/v2/health/ready")).status_code == 200
        assert (await call("POST", "/v2/fusions", "/v2/fusions", json=moe_graph)).status_code in (200, 201)
        ids = np.array([[1, 2], [2, 3], [3, 3]], np.int64)
        r = await put_raw(c, "ids", ids)
        assert r.status_code in (200, 201)
        sent[("/v2/buffers/{name}", "PUT", str(r.status_code))] += 1

        ok = []  # the parameters of every successful run's response
        for _ in range(3):  # one at a time, from the stored buffer
            r = await call("POST", INFER, "/v2/models/{model}/infer",
                           json={"inputs": [{"name": "topk_ids", "parameters": {"buffer": "ids"}}]})
            assert r.status_code == 200, r.text
            assert r.json()["outputs"][0]["data"] == counts_of(ids).tolist()
            ok.append(r.json()["parameters"])
        # a run that fails (an index out of range): admitted, launched alone, counted as an error
        r = await call("POST", INFER, "/v2/models/{model}/infer",
                       json={"inputs": [{"name": "topk_ids", "shape": [1, 1], "datatype": "INT64", "data": [99]}]})
        assert r.status_code == 400, r.text
        failed_runs = 1
        # an unknown model: no run at all
        r = await call("POST", "/v2/models/no_such_model/infer", "/v2/models/{model}/infer",
                       json={"inputs": [{"name": "topk_ids", "shape": [1, 1], "datatype": "INT64", "data": [1]}]})
        assert r.status_code == 404, r.text
        # at once: runs that wait together are launched in batches (each response says its batch's size)
        inline = [[k % 16, (3 * k) % 16] for k in range(8)]
        answers = await asyncio.gather(*(
            call("POST", INFER, "/v2/models/{model}/infer",
                 json={"inputs": [{"name": "topk_ids", "shape": [1, 2], "datatype": "INT64", "data": row}]})
            for row in inline))
        for row, r in zip(inline, answers):
            assert r.status_code == 200, r.text
            assert r.json()["outputs"][0]["data"] == counts_of(row).tolist()
            ok.append(r.json()["parameters"])
        r = await call("BREW", "/no/such/path", "unmatched", "other")
        assert r.status_code >= 400
        assert (await call("GET", "/metrics", "/metrics")).status_code == 200  # counted once answered
        text = (await c.get("/metrics")).text

    fams = families(text)
    assert [(f.name, f.type, f.documentation) for f in fams.values() if not f.name.endswith("_created")] == FAMILIES

    # requests, by what the test sent
    got = samples(fams, "segfuse_requests", "_total")
    want = {frozenset({"endpoint": e, "method": m, "status": s}.items()): float(n) for (e, m, s), n in sent.items()}
    assert got == want

    # runs: what each response reports
    assert value(fams, "segfuse_runs", "_total", outcome="ok") == len(ok) == 11
    assert value(fams, "segfuse_runs", "_total", outcome="error") == failed_runs
    totals = [p["timings_us"]["total"] / 1e6 for p in ok]
    got = check_histogram(fams, "segfuse_run_seconds", LATENCY_BUCKETS, len(ok))
    assert got == expected_buckets(LATENCY_BUCKETS, totals)
    assert math.isclose(value(fams, "segfuse_run_seconds", "_sum"), sum(totals), rel_tol=1e-9)
    assert value(fams, "segfuse_kernel_cache_hits", "_total") == sum(p["cache_hits"] for p in ok)
    assert value(fams, "segfuse_kernel_cache_misses", "_total") == sum(p["cache_misses"] for p in ok)
    # (the plan cache is the process's: earlier tests may have planned these sizes, so misses may be 0)
    assert sum(p["cache_hits"] + p["cache_misses"] for p in ok) >= len(ok)
    assert value(fams, "segfuse_compiles", "_total") == sum(p["kernels_compiled"] for p in ok)
    assert math.isclose(value(fams, "segfuse_compile_seconds", "_total"),
                        sum(p["timings_us"].get("compile", 0.0) for p in ok) / 1e6, rel_tol=1e-9, abs_tol=1e-12)

    # batches: a batch of size s answers s runs, each saying s; the failed run was launched alone
    sizes = collections.Counter(p["batch_size"] for p in ok)
    batches = [1] * failed_runs
    for s, n in sizes.items():
        assert n % s == 0, sizes
        batches += [s] * (n // s)
    got = check_histogram(fams, "segfuse_run_batch_size", BATCH_BUCKETS, len(batches))
    assert got == expected_buckets(BATCH_BUCKETS, batches)
    assert value(fams, "segfuse_run_batch_size", "_sum") == len(ok) + failed_runs
    # every launched run waited in the queue once (the failed one too)
    check_histogram(fams, "segfuse_run_queue_seconds", LATENCY_BUCKETS, len(ok) + failed_runs)
    assert value(fams, "segfuse_run_queue_seconds", "_sum") >= 0

    assert value(fams, "segfuse_buffers") == 1 and value(fams, "segfuse_buffer_bytes") == ids.nbytes
    assert value(fams, "segfuse_fusions") == 1 and value(fams, "segfuse_runs_admitted") == 0
    assert not fams["segfuse_regions"].samples
    if server_backend == "numpy":
        assert not fams["segfuse_gpu_info"].samples  # no GPU, no info sample


def reference(observations: dict) -> bytes:
    """The counted metrics as prometheus_client's own Counter and Histogram objects count them."""
    r = CollectorRegistry()
    help_of = {name: doc for name, _, doc in FAMILIES}
    requests = Counter("segfuse_requests", help_of["segfuse_requests"], ["endpoint", "method", "status"], registry=r)
    run_seconds = Histogram("segfuse_run_seconds", help_of["segfuse_run_seconds"], buckets=LATENCY_BUCKETS, registry=r)
    runs = Counter("segfuse_runs", help_of["segfuse_runs"], ["outcome"], registry=r)
    runs_ok, runs_error = runs.labels("ok"), runs.labels("error")
    plain = {name: Counter(name, help_of[name], registry=r) for name in
             ("segfuse_compiles", "segfuse_compile_seconds", "segfuse_kernel_cache_hits", "segfuse_kernel_cache_misses",
              "segfuse_infer_priority_requests")}
    batch = Histogram("segfuse_run_batch_size", help_of["segfuse_run_batch_size"], buckets=BATCH_BUCKETS, registry=r)
    queue = Histogram("segfuse_run_queue_seconds", help_of["segfuse_run_queue_seconds"], buckets=LATENCY_BUCKETS,
                      registry=r)
    for endpoint, method, status in observations["requests"]:
        requests.labels(endpoint, method if method in ("GET", "POST", "DELETE") else "other", str(status)).inc()
    for seconds, hits, misses, compiled, compile_us in observations["runs"]:
        runs_ok.inc()
        run_seconds.observe(seconds)
        for name, n in (("segfuse_kernel_cache_hits", hits), ("segfuse_kernel_cache_misses", misses),
                        ("segfuse_compiles", compiled), ("segfuse_compile_seconds", compile_us / 1e6)):
            if n:
                plain[name].inc(n)
    for _ in range(observations["errors"]):
        runs_error.inc()
    for size in observations["batches"]:
        batch.observe(size)
    for seconds in observations["queued"]:
        queue.observe(seconds)
    return generate_latest(r)


def without_created(fams: dict) -> dict:
    return {name: [(s.name, s.labels, s.value) for s in f.samples if not s.name.endswith("_created")]
            for name, f in fams.items() if not name.endswith("_created")}


def test_exposition_matches_prometheus_clients_own_counting_at_the_bucket_edges():
    """Values on a bucket's bound count in that bucket (Prometheus's `le`), just above it in the
    next; labelled requests are counted per label set, in the order first seen; sums add up as
    floats do."""
    edges = [b * f for b in LATENCY_BUCKETS for f in (1.0, 1 + 1e-12, 1 - 1e-12)] + [0.0, 11.0, 1e9]
    obs = {
        "requests": [("/v2/health/live", "GET", 200)] * 3 + [("/v2/models/{model}/infer", "POST", 200)] * 2
        + [("/v2/models/{model}/infer", "POST", 400), ("unmatched", "BREW", 404), ("/v2/buffers/{name}", "DELETE", 404)]
        + [("/v2/health/live", "GET", 200)],
        "runs": [(s, k % 3, k % 2, int(k % 4 == 0), 1500.0 * (k % 5 == 0)) for k, s in enumerate(edges)],
        "errors": 4,
        "batches": [1, 2, 3, 4, 5, 8, 9, 128, 129, 1000],
        "queued": edges[::-1],
    }
    m = Metrics()
    for endpoint, method, status in obs["requests"]:
        m.request_done(endpoint, method, status)
    for run in obs["runs"]:
        m.observe_run(*run)
    for _ in range(obs["errors"]):
        m.runs_error.inc()
    for size in obs["batches"]:
        m.run_batch_size.observe(size)
    for seconds in obs["queued"]:
        m.run_queue_seconds.observe(seconds)
    got, want = families(m.render().decode()), families(reference(obs).decode())
    assert [(f.name, f.type, f.documentation) for f in got.values() if not f.name.endswith("_created")] == FAMILIES
    counted = without_created(got)
    assert {name: counted[name] for name in COUNTED} == without_created(want)
    # The bucket counts by hand, too (not only prometheus_client's word for them).
    run_seconds = [s for s, *_ in obs["runs"]]
    assert buckets(got, "segfuse_run_seconds") == expected_buckets(LATENCY_BUCKETS, run_seconds)
    assert buckets(got, "segfuse_run_batch_size") == expected_buckets(BATCH_BUCKETS, obs["batches"])
    # Each counter and histogram (each label set) says when it started counting, as
    # prometheus_client's own do (unless PROMETHEUS_DISABLE_CREATED_SERIES turns that off).
    assert {n for n in got if n.endswith("_created")} == {n for n in want if n.endswith("_created")}
    for name in COUNTED if "segfuse_runs_created" in want else ():
        first = {frozenset((k, v) for k, v in s.labels.items() if k != "le") for s in got[name].samples}
        created = {frozenset(s.labels.items()) for s in got[name + "_created"].samples}
        assert created == first and all(s.value > 1e9 for s in got[name + "_created"].samples), name


def test_two_metrics_objects_count_apart():
    a, b = Metrics(), Metrics()
    a.request_done("/v2", "GET", 200)
    a.observe_run(0.002, 1, 0, 0, 0.0)
    a.run_batch_size.observe(3)
    fa, fb = families(a.render().decode()), families(b.render().decode())
    assert value(fa, "segfuse_requests", "_total", endpoint="/v2", method="GET", status="200") == 1
    assert not samples(fb, "segfuse_requests", "_total")
    assert value(fa, "segfuse_runs", "_total", outcome="ok") == 1 and value(fb, "segfuse_runs", "_total", outcome="ok") == 0
    assert buckets(fa, "segfuse_run_batch_size")[2] == (4.0, 1.0) and value(fb, "segfuse_run_batch_size", "_count") == 0
    assert buckets(fa, "segfuse_run_seconds")[3:5] == [(0.001, 0.0), (0.0025, 1.0)]
