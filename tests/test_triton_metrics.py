"""Statistics, metrics and server metadata as Triton 2.51 has them: a request refused before its fusion
ran is no failed run in the statistics (it is counted by reason in segfuse_infer_rejected_total);
Triton's metric families sit beside segfuse's with Triton's names, types, labels and units, their values
those of the statistics route; --metrics-port serves /metrics on a port of its own, started and stopped
with the server; GET /v2 lists the extensions segfuse implements under Triton's names.

Oracles: the requests each test sent (what each was answered, what each successful run's response
reports), prometheus_client's parser, and what a real Triton 2.51 (the nvidia-pytriton wheel, on this
CPU machine) answered, written down below as observed: its /v2 extensions and its metric families'
HELP texts, types and label names."""

from __future__ import annotations

import collections
import socket
import sys
import types

import httpx
import pytest
from cupy_standin import Devices, cupy_module
from helpers.graphs import counts_of
from helpers.service import assert_error, put_raw
from prometheus_client.parser import text_string_to_metric_families
from segfuse.server import array_backends as backend_mod
from segfuse.server import create_app
from segfuse.server import state as state_mod
from segfuse.server.metrics_port import MetricsPortError
from segfuse.server.settings import Settings

pytestmark = pytest.mark.anyio

MODEL = "moe_problem_sizes"
INFER = f"/v2/models/{MODEL}/infer"

# GET /v2 of tritonserver 2.51.0 (nvidia-pytriton 0.7.0), as it answered.
TRITON_EXTENSIONS = ["classification", "sequence", "model_repository", "model_repository(unload_dependents)",
                     "schedule_policy", "model_configuration", "system_shared_memory", "cuda_shared_memory",
                     "binary_tensor_data", "parameters", "statistics", "trace", "logging"]
# Its metrics port's inference families: (name as the parser reports it, type, HELP, label names).
TRITON_FAMILIES = [
    ("nv_inference_request_success", "counter", "Number of successful inference requests, all batch sizes",
     {"model", "version"}),
    ("nv_inference_request_failure", "counter", "Number of failed inference requests, all batch sizes",
     {"model", "reason", "version"}),
    ("nv_inference_count", "counter", "Number of inferences performed (does not include cached requests)",
     {"model", "version"}),
    ("nv_inference_exec_count", "counter", "Number of model executions performed (does not include cached requests)",
     {"model", "version"}),
    ("nv_inference_request_duration_us", "counter",
     "Cumulative inference request duration in microseconds (includes cached requests)", {"model", "version"}),
    ("nv_inference_queue_duration_us", "counter",
     "Cumulative inference queuing duration in microseconds (includes cached requests)", {"model", "version"}),
    ("nv_inference_compute_input_duration_us", "counter",
     "Cumulative compute input duration in microseconds (does not include cached requests)", {"model", "version"}),
    ("nv_inference_compute_infer_duration_us", "counter",
     "Cumulative compute inference duration in microseconds (does not include cached requests)", {"model", "version"}),
    ("nv_inference_compute_output_duration_us", "counter",
     "Cumulative inference compute output duration in microseconds (does not include cached requests)",
     {"model", "version"}),
]
TRITON_FAILURE_REASONS = {"OTHER", "CANCELED", "BACKEND", "REJECTED"}
# Triton's GPU families (its metrics documentation and metrics.cc): gauges by gpu_uuid.
TRITON_GPU_FAMILIES = {"nv_gpu_utilization": "GPU utilization rate [0.0 - 1.0)",
                       "nv_gpu_memory_total_bytes": "GPU total memory, in bytes",
                       "nv_gpu_memory_used_bytes": "GPU used memory, in bytes"}


def families(text: str) -> dict:
    return {f.name: f for f in text_string_to_metric_families(text)}


def model_samples(fams: dict, name: str, model: str = MODEL) -> dict:
    """{reason or None: value} of a family's samples of one model."""
    return {s.labels.get("reason"): s.value for s in fams[name].samples if s.labels.get("model") == model}


def inline(data, dtype="INT64", shape=None, **extra) -> dict:
    shape = shape or [1, len(data)]
    return {"inputs": [{"name": "topk_ids", "shape": shape, "datatype": dtype, "data": data}], **extra}


async def stats_of(c) -> dict:
    [s] = (await c.get(f"/v2/models/{MODEL}/stats")).json()["model_stats"]
    return s


# ---- statistics count only requests that ran ------------------------------------------------------------
@pytest.mark.parametrize("fast_lane", [True, False], ids=["fast lane", "FastAPI route"])
async def test_requests_refused_before_the_run_are_counted_apart_not_as_failed_runs(asgi_server, moe_graph,
                                                                                    fast_lane):
    sent: collections.Counter = collections.Counter()  # reason -> requests this test had refused
    ok = []  # the parameters of each successful run's response
    async with asgi_server(max_buffer_bytes=1 << 16) as c:
        c.app.state.fast_lane = fast_lane
        assert (await c.post("/v2/fusions", json=moe_graph)).status_code == 201
        assert (await put_raw(c, "taken", counts_of([1]))).status_code == 201

        async def refused(status: int, reason: str, **kw):
            r = await c.post(INFER, **kw)
            assert r.status_code == status, r.text
            sent[reason] += 1

        for data in ([1, 2], [3, 3, 15]):
            r = await c.post(INFER, json=inline(data))
            assert r.status_code == 200 and r.json()["outputs"][0]["data"] == counts_of(data).tolist()
            ok.append(r.json()["parameters"])
        await refused(400, "invalid", json=inline([1, 2], dtype="INT32"))  # wrong datatype
        await refused(400, "invalid", json=inline([1, 2], shape=[2]))  # wrong rank
        await refused(400, "invalid", json=inline([1, 2], outputs=[{"name": "nope"}]))  # unknown output
        await refused(400, "invalid", json={"inputs": []})  # missing input
        await refused(400, "invalid", content=b'{"inputs": [')  # not JSON
        await refused(400, "invalid", json=inline([1, 2], parameters={"custom": {"an": "object"}}))
        await refused(404, "not_found", json={"inputs": [{"name": "topk_ids", "parameters": {"buffer": "gone"}}]})
        await refused(409, "conflict", json=inline([1, 2], outputs=[{"name": "counts",
                                                                     "parameters": {"buffer": "taken"}}]))
        await refused(413, "too_large", json=inline([0] * 8193))  # 8193 ids over 64 KiB
        ex = c.app.state.server_state.executor
        ex.admitted = ex.max_admitted  # the run queue is full
        try:
            await refused(429, "queue_full", json=inline([1, 2]))
        finally:
            ex.admitted = 0
        # a run that failed (index 99 out of range): Triton's BACKEND failure
        assert_error(await c.post(INFER, json=inline([1, 99])), 400, "out of bounds")
        # an unknown model: refused before any fusion, so no model's count (and no label from the path)
        assert (await c.post("/v2/models/no_such_model/infer", json=inline([1]))).status_code == 404
        s = await stats_of(c)
        fams = families((await c.get("/metrics")).text)

    inf = s["inference_stats"]
    assert (s["inference_count"], s["execution_count"]) == (len(ok), len(ok)) == (2, 2)
    assert (inf["success"]["count"], inf["fail"]["count"]) == (2, 1)
    rejected = {frozenset(x.labels.items()): x.value for x in fams["segfuse_infer_rejected"].samples
                if x.name == "segfuse_infer_rejected_total"}
    assert rejected == {frozenset({"model": MODEL, "reason": r}.items()): float(n) for r, n in sent.items()}
    assert model_samples(fams, "nv_inference_request_failure") == {"BACKEND": 1, "OTHER": 0, "CANCELED": 0,
                                                                    "REJECTED": 0}
    assert model_samples(fams, "nv_inference_request_success") == {None: 2}
    # segfuse's own run counter keeps counting the refused runs (429 and the checks under the pins) as errors
    runs = {x.labels["outcome"]: x.value for x in fams["segfuse_runs"].samples if x.name == "segfuse_runs_total"}
    assert runs == {"ok": 2, "error": 1 + sent["not_found"] + sent["conflict"] + sent["too_large"]
                    + sent["queue_full"] + 3}  # (+3: the wrong datatype, rank, missing input: found binding)
    assert not any(x.labels.get("model") == "no_such_model" for f in fams.values() for x in f.samples)


# ---- Triton's metric families ----------------------------------------------------------------------------
async def test_tritons_families_have_its_names_types_labels_and_the_statistics_values(asgi_server, moe_graph):
    async with asgi_server() as c:
        await c.post("/v2/fusions", json=moe_graph)
        fams = families((await c.get("/metrics")).text)
        for name, kind, doc, labels in TRITON_FAMILIES:  # at zero before any request
            f = fams[name]
            assert (f.type, f.documentation) == (kind, doc), name
            assert {frozenset(x.labels) for x in f.samples} == {frozenset(labels)}, name
            assert all(x.value == 0 for x in f.samples), name
        assert {x.labels["reason"] for x in fams["nv_inference_request_failure"].samples} == TRITON_FAILURE_REASONS
        assert not set(TRITON_GPU_FAMILIES) & set(fams)  # no GPU on the NumPy backend, as Triton without one

        ok = []
        for k in range(5):
            r = await c.post(INFER, json=inline([k, k + 1, 15]))
            assert r.status_code == 200, r.text
            ok.append(r.json()["parameters"]["timings_us"])
        await c.post(INFER, json=inline([16]))  # a failed run
        await c.post(INFER, json=inline([1], dtype="FP32"))  # refused
        s = await stats_of(c)
        text = (await c.get("/metrics")).text
    fams = families(text)
    assert [n for n in fams if n.startswith("nv_")] == [n for n, *_ in TRITON_FAMILIES]
    for name in ("nv_inference_request_success", "nv_inference_count", "nv_inference_exec_count"):
        assert model_samples(fams, name) == {None: len(ok)}, name
    assert model_samples(fams, "nv_inference_request_failure")["BACKEND"] == 1
    # durations in whole microseconds: the statistics' nanoseconds, and what the responses reported
    inf = s["inference_stats"]
    parts = {"nv_inference_request_duration_us": ("success", "total"), "nv_inference_queue_duration_us":
             ("queue", "queue"), "nv_inference_compute_infer_duration_us": ("compute_infer", "run")}
    for name, (field, timing) in parts.items():
        us = model_samples(fams, name)[None]
        assert us == inf[field]["ns"] // 1000, name
        assert abs(us - sum(t[timing] for t in ok)) <= len(ok) + 1, name
    prepare = sum(t.get("plan", 0) + t.get("compile", 0) for t in ok)
    assert abs(model_samples(fams, "nv_inference_compute_input_duration_us")[None] - prepare) <= len(ok) + 1
    total = sum(model_samples(fams, n)[None] for n in ("nv_inference_queue_duration_us",
                                                        "nv_inference_compute_input_duration_us",
                                                        "nv_inference_compute_infer_duration_us",
                                                        "nv_inference_compute_output_duration_us"))
    assert abs(total - model_samples(fams, "nv_inference_request_duration_us")[None]) <= 4
    # Triton's exposition: counters named without _total, integer values
    assert f'nv_inference_request_success{{model="{MODEL}",version="1"}} {len(ok)}\n' in text
    assert "nv_inference_request_success_total" not in text


UUID = "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"


@pytest.fixture
def standin_gpu(monkeypatch):
    """The server's CuPy backend on a stand-in GPU whose driver reports 80 GB, 30 GB of it free (the
    engine is NumPy's: nothing runs there)."""
    props = {"name": b"NVIDIA H100", "uuid": bytes(range(16)), "totalGlobalMem": 80_000_000_000,
             "pciDomainID": 0, "pciBusID": 0x19, "pciDeviceID": 0}
    cp = cupy_module(Devices([props], ["0000:19:00.0"]))
    cp.cuda.runtime.memGetInfo = lambda: (30_000_000_000, 80_000_000_000)
    monkeypatch.setitem(sys.modules, "cupy", cp)
    monkeypatch.setitem(sys.modules, "pynvml", None)  # no nvidia-ml-py
    monkeypatch.setattr(state_mod, "resolve",
                        lambda backend, device, cache_dir: (backend_mod.make_engine("numpy"),
                                                            backend_mod.CupyArrayBackend(device)))


def gpu_values(fams: dict) -> dict:
    return {name: {x.labels["gpu_uuid"]: x.value for x in fams[name].samples} for name in TRITON_GPU_FAMILIES
            if name in fams}


async def test_gpu_memory_families_come_from_the_driver_and_utilization_from_nvml(asgi_server, standin_gpu,
                                                                                  monkeypatch):
    async with asgi_server() as c:
        fams = families((await c.get("/metrics")).text)
        for name in ("nv_gpu_memory_total_bytes", "nv_gpu_memory_used_bytes"):
            assert (fams[name].type, fams[name].documentation) == ("gauge", TRITON_GPU_FAMILIES[name])
        # without NVML: memory from cudaMemGetInfo (used = total - free), no utilization
        assert gpu_values(fams) == {"nv_gpu_memory_total_bytes": {UUID: 80e9}, "nv_gpu_memory_used_bytes": {UUID: 50e9}}

        class Nvml:  # nvidia-ml-py's calls, for this GPU's UUID only
            def nvmlInit(self):
                pass

            def nvmlDeviceGetHandleByUUID(self, uuid):
                assert uuid == UUID
                return "handle"

            def nvmlDeviceGetUtilizationRates(self, h):
                return types.SimpleNamespace(gpu=37)

            def nvmlDeviceGetMemoryInfo(self, h):
                return types.SimpleNamespace(total=80_000_000_000, used=12_000_000_000)

        monkeypatch.setitem(sys.modules, "pynvml", Nvml())
        fams = families((await c.get("/metrics")).text)
    assert fams["nv_gpu_utilization"].type == "gauge"
    assert gpu_values(fams) == {"nv_gpu_utilization": {UUID: 0.37}, "nv_gpu_memory_total_bytes": {UUID: 80e9},
                                "nv_gpu_memory_used_bytes": {UUID: 12e9}}


# ---- --metrics-port ----------------------------------------------------------------------------------------
async def test_metrics_port_serves_the_same_families_without_the_token_and_stops_with_the_server(asgi_server,
                                                                                                 moe_graph):
    auth = {"authorization": "Bearer s3cret"}
    async with asgi_server(token="s3cret", metrics_port=0) as c:
        port = c.app.state.metrics_port
        assert port
        await c.post("/v2/fusions", json=moe_graph, headers=auth)
        assert (await c.post(INFER, json=inline([1, 2]), headers=auth)).status_code == 200
        assert (await c.get("/metrics")).status_code == 401  # the HTTP port's /metrics keeps the token
        http = families((await c.get("/metrics", headers=auth)).text)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as scraper:
            r = await scraper.get("/metrics")
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
            assert (await scraper.get("/v2")).status_code == 404  # the metrics port serves metrics only
        own = families(r.text)
        assert list(own) == list(http)
        for name in ("nv_inference_request_success", "nv_inference_count", "segfuse_runs"):
            assert own[name].samples == http[name].samples, name
        assert model_samples(own, "nv_inference_request_success") == {None: 1}
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)


async def test_a_metrics_port_in_use_stops_the_start_with_a_clear_error():
    from asgi_lifespan import LifespanManager

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        app = create_app(Settings(backend="numpy", metrics_port=port))
        with pytest.raises(MetricsPortError, match=f"--metrics-port {port}: cannot listen on 127.0.0.1:{port}"):
            async with LifespanManager(app):
                pass
    with pytest.raises(ValueError, match="metrics_port must differ from port"):
        Settings.from_env({"SEGFUSE_PORT": "9000", "SEGFUSE_METRICS_PORT": "9000"})
    assert Settings.from_env({"SEGFUSE_METRICS_PORT": "8002"}).metrics_port == 8002
    assert Settings.from_env({}).metrics_port is None  # off by default


async def test_a_grpc_port_in_use_stops_the_start_and_frees_the_metrics_port():
    """The metrics listener starts first; a gRPC port that cannot be bound ends the start, and the
    metrics port must not stay bound by the server that never started."""
    pytest.importorskip("grpc")
    from asgi_lifespan import LifespanManager

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        metrics_port = free.getsockname()[1]
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        app = create_app(Settings(backend="numpy", metrics_port=metrics_port, grpc_port=taken.getsockname()[1]))
        with pytest.raises(Exception):  # noqa: B017 - grpc's own error for a port in use
            async with LifespanManager(app):
                pass
    with socket.socket() as again:
        again.bind(("127.0.0.1", metrics_port))  # free again


def test_serve_passes_metrics_port_to_the_settings():
    import argparse

    from segfuse.cli import serve_cmd

    parser = argparse.ArgumentParser()
    serve_cmd.add_parsers(parser.add_subparsers())
    assert serve_cmd.settings_from_args(parser.parse_args(["serve", "--metrics-port", "9102"])).metrics_port == 9102
    assert serve_cmd.settings_from_args(parser.parse_args(["serve"])).metrics_port is None


# ---- server metadata ---------------------------------------------------------------------------------------
async def test_server_metadata_lists_tritons_extensions_that_segfuse_implements(asgi_server):
    async with asgi_server() as c:
        got = (await c.get("/v2")).json()["extensions"]
    shared = [e for e in got if not e.startswith("segfuse_")]
    # Triton's names, in Triton's order; all but classification (class_count is refused) and sequence
    # (no sequence batcher); then segfuse's own
    assert shared == [e for e in TRITON_EXTENSIONS if e not in ("classification", "sequence")]
    assert got[len(shared):] == ["segfuse_buffers", "segfuse_fusions", "segfuse_plan", "segfuse_execute"]


def test_failed_runs_get_tritons_reasons():
    """A run that starts after its parameters.timeout is Triton's REJECTED (its queue timeout), one the
    engine fails BACKEND, one cancelled while it waited CANCELED: from the errors the run path raises."""
    import asyncio
    import time

    from segfuse.compiler.errors import RunError
    from segfuse.server.errors import too_large
    from segfuse.server.protocol import check_started_in_time
    from segfuse.server.stats import failure_reason

    with pytest.raises(Exception) as late:
        check_started_in_time(time.perf_counter() - 1)
    assert failure_reason(late.value) == "REJECTED"
    assert failure_reason(RunError("scatter: index 99 is out of bounds")) == "BACKEND"
    assert failure_reason(too_large("the run ran out of memory on cuda:0")) == "BACKEND"  # launch's device OOM
    assert failure_reason(asyncio.CancelledError()) == "CANCELED"
