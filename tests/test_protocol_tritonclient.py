"""The KServe v2 / Triton HTTP protocol checked with the real tritonclient[http], unchanged, against a
live uvicorn server: health, metadata, versions, infer (JSON and binary, sync, async_infer and the aio
client), model config, repository index, load/unload, statistics, trace and log settings,
compression, reserved names, timeout/priority/sequence/custom parameters, unknown fields and the 400
for invalid requests. Oracle: NumPy."""

from __future__ import annotations

import asyncio
import copy
import gzip
import json
import logging
import threading
import time
import uuid
import zlib

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from helpers.graphs import ELEMENTWISE_CHAIN, MOE_PROBLEM_SIZES
from helpers.service import GatedEngine
from helpers.waiting import scaled, wait_until
from tritonclient.utils import InferenceServerException


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def register(server, graph: dict, name: str) -> dict:
    g = copy.deepcopy(graph)
    g["name"] = name
    r = httpx.post(server.url + "/v2/fusions", json=g, timeout=scaled(30))
    assert r.status_code in (200, 201), r.text
    return r.json()


@pytest.fixture
def triton(live_server):
    c = httpclient.InferenceServerClient(live_server.url.removeprefix("http://"), network_timeout=scaled(60))
    yield c
    c.close()


@pytest.fixture
def moe(live_server) -> str:
    return register(live_server, MOE_PROBLEM_SIZES, unique("moe"))["name"]


@pytest.fixture
def chain(live_server) -> str:
    return register(live_server, ELEMENTWISE_CHAIN, unique("chain"))["name"]


def ids_input(ids: np.ndarray, binary: bool = True):
    i = httpclient.InferInput("topk_ids", list(ids.shape), "INT64")
    i.set_data_from_numpy(ids, binary_data=binary)
    return i


def counts_of(ids: np.ndarray) -> np.ndarray:
    return np.bincount(ids.reshape(-1), minlength=16).astype(np.int64)


def chain_inputs(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    arrays = {k: rng.standard_normal(n).astype(np.float32) for k in "abc"}
    inputs = []
    for k, a in arrays.items():
        i = httpclient.InferInput(k, [n], "FP32")
        i.set_data_from_numpy(a)
        inputs.append(i)
    a, b, c = (arrays[k] for k in "abc")
    expected = np.where(a > 0, a * b + c, np.exp(c) * np.float32(0.5)).astype(np.float32)
    return inputs, expected


def refused(status: str, fn, *args, **kwargs) -> str:
    """The message of the InferenceServerException that fn(*args, **kwargs) raises with `status`."""
    with pytest.raises(InferenceServerException) as ei:
        fn(*args, **kwargs)
    got, msg = ei.value.status(), ei.value.message()
    assert got == status, (got, msg)
    return msg


# ---- health and metadata --------------------------------------------------------------------
def test_health_and_server_metadata(triton, live_server):
    assert triton.is_server_live() and triton.is_server_ready()
    assert httpx.get(live_server.url + "/v2/health/live").json() == {"live": True}
    assert httpx.get(live_server.url + "/v2/health/ready").json() == {"ready": True}
    meta = triton.get_server_metadata()
    assert meta["name"] == "segfuse"
    for ext in ("binary_tensor_data", "model_repository", "model_configuration", "statistics", "trace", "logging"):
        assert ext in meta["extensions"], ext


def test_model_metadata_and_ready_with_and_without_version(triton, moe):
    plain, versioned = triton.get_model_metadata(moe), triton.get_model_metadata(moe, "1")
    assert plain == versioned and versioned["versions"] == ["1"]
    assert versioned["inputs"] == [{"name": "topk_ids", "datatype": "INT64", "shape": [-1, -1]}]
    assert triton.is_model_ready(moe) and triton.is_model_ready(moe, "1")
    assert not triton.is_model_ready(moe, "2")
    msg = refused("404", triton.get_model_metadata, moe, "2")
    assert "no version '2'" in msg and moe in msg


# ---- infer ----------------------------------------------------------------------------------
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("version", ["", "1"], ids=["unversioned", "v1"])
def test_infer_both_ways(triton, moe, binary, version):
    ids = np.random.default_rng(1).integers(0, 16, (64, 8), dtype=np.int64)
    out = httpclient.InferRequestedOutput("counts", binary_data=binary)
    r = triton.infer(moe, [ids_input(ids, binary)], model_version=version, outputs=[out], request_id="r-7")
    np.testing.assert_array_equal(r.as_numpy("counts"), counts_of(ids))
    body = r.get_response()
    assert body["model_name"] == moe and body["model_version"] == "1" and body["id"] == "r-7"
    assert ("binary_data_size" in body["outputs"][0].get("parameters", {})) == binary


def test_infer_unknown_version_is_404(triton, moe):
    ids = np.zeros((2, 2), np.int64)
    assert "no version '3'" in refused("404", triton.infer, moe, [ids_input(ids)], model_version="3")


def test_async_infer_and_aio_client(triton, moe, live_server):
    rng = np.random.default_rng(2)
    batches = [rng.integers(0, 16, (32, 4), dtype=np.int64) for _ in range(4)]
    handles = [triton.async_infer(moe, [ids_input(b)], model_version="1") for b in batches]
    for b, h in zip(batches, handles):
        np.testing.assert_array_equal(h.get_result().as_numpy("counts"), counts_of(b))

    import tritonclient.http.aio as aioclient

    async def go():
        async with aioclient.InferenceServerClient(live_server.url.removeprefix("http://")) as c:
            assert await c.is_server_ready() and await c.is_model_ready(moe, "1")
            assert (await c.get_model_metadata(moe, "1"))["name"] == moe
            results = await asyncio.gather(*(c.infer(moe, [ids_input(b)], model_version="1") for b in batches))
            for b, r in zip(batches, results):
                np.testing.assert_array_equal(r.as_numpy("counts"), counts_of(b))
            stats = await c.get_inference_statistics(moe, "1")
            assert stats["model_stats"][0]["name"] == moe

    asyncio.run(go())


# ---- model configuration and repository -----------------------------------------------------
def test_model_config(triton, moe):
    for cfg in (triton.get_model_config(moe), triton.get_model_config(moe, "1")):
        assert cfg["name"] == moe and cfg["platform"] == "segfuse" and cfg["backend"] == "segfuse"
        assert cfg["max_batch_size"] == 0
        assert cfg["input"] == [{"name": "topk_ids", "data_type": "TYPE_INT64", "dims": [-1, -1],
                                 "format": "FORMAT_NONE", "optional": False}]
        assert cfg["output"] == [{"name": "counts", "data_type": "TYPE_INT64", "dims": [16]}]
    refused("404", triton.get_model_config, moe, "2")
    refused("404", triton.get_model_config, unique("missing"))


def test_repository_index_and_ready_filter(triton, moe, live_server):
    index = triton.get_model_repository_index()
    assert {"name": moe, "version": "1", "state": "READY", "reason": ""} in index
    ready = httpx.post(live_server.url + "/v2/repository/index", json={"ready": True}).json()
    assert all(e["state"] == "READY" for e in ready) and moe in [e["name"] for e in ready]
    r = httpx.post(live_server.url + "/v2/repository/index", json={"ready": "yes"})
    assert r.status_code == 400


def test_unload_then_load(triton, moe, live_server):
    ids = np.random.default_rng(3).integers(0, 16, (8, 2), dtype=np.int64)
    triton.unload_model(moe)
    assert not triton.is_model_ready(moe)
    assert {"name": moe, "version": "1", "state": "UNAVAILABLE", "reason": "unloaded"} in \
        triton.get_model_repository_index()
    assert moe not in [e["name"] for e in httpx.post(live_server.url + "/v2/repository/index",
                                                     json={"ready": True}).json()]
    refused("404", triton.infer, moe, [ids_input(ids)])
    triton.load_model(moe)  # back from the unloaded list
    assert triton.is_model_ready(moe, "1")
    np.testing.assert_array_equal(triton.infer(moe, [ids_input(ids)]).as_numpy("counts"), counts_of(ids))
    triton.load_model(moe)  # already loaded: 200
    refused("404", triton.unload_model, unique("missing"))


def test_load_with_config_registers_the_graph(triton, live_server):
    name = unique("loaded")
    g = copy.deepcopy(MOE_PROBLEM_SIZES)
    g["name"] = name
    triton.load_model(name, config=json.dumps(g))
    ids = np.arange(12, dtype=np.int64).reshape(6, 2)
    np.testing.assert_array_equal(triton.infer(name, [ids_input(ids)], model_version="1").as_numpy("counts"),
                                  counts_of(ids))
    # A graph without a name takes the URL's
    g2 = copy.deepcopy(MOE_PROBLEM_SIZES)
    del g2["name"]
    other = unique("unnamed")
    triton.load_model(other, config=json.dumps(g2))
    assert triton.is_model_ready(other)
    bad = [(json.dumps({**g, "name": "elsewhere"}), "400", "graph.name 'elsewhere'"),
           (json.dumps({"name": name, "backend": "onnxruntime", "max_batch_size": 8}), "400",
            "Triton model configuration"),
           ("{not json", "400", "not valid JSON"),
           (json.dumps({**g, "ops": [{"op": "nope", "out": "x", "inputs": []}]}), "400", "invalid graph")]
    for config, status, text in bad:
        msg = refused(status, triton.load_model, name, config=config)
        assert text in msg, msg
    assert "model files" in refused("400", triton.load_model, name, config=json.dumps(g),
                                    files={"file:1/model.onnx": b"\0"})
    refused("404", triton.load_model, unique("missing"))
    assert triton.is_model_ready(name)  # failed loads changed nothing


# ---- statistics -----------------------------------------------------------------------------
def test_statistics_count_runs_and_failures(triton, moe):
    def stats(version=""):
        s = triton.get_inference_statistics(moe, version)["model_stats"]
        assert len(s) == 1 and s[0]["name"] == moe and s[0]["version"] == "1"
        return s[0]

    zero = stats()
    assert zero["inference_count"] == 0 and zero["inference_stats"]["success"] == {"count": 0, "ns": 0}
    t0 = int(time.time() * 1000)
    rng = np.random.default_rng(4)
    for _ in range(3):
        triton.infer(moe, [ids_input(rng.integers(0, 16, (16, 4), dtype=np.int64))], model_version="1")
    refused("400", triton.infer, moe, [ids_input(np.full((1, 2), 16, np.int64))])  # index 16: a failed run
    s = stats("1")
    assert s == stats()
    assert s["inference_count"] == 3 and s["execution_count"] == 3
    inf = s["inference_stats"]
    assert inf["success"]["count"] == 3 and inf["fail"]["count"] == 1 and inf["fail"]["ns"] > 0
    for k in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert inf[k]["count"] == 3, k
    assert inf["compute_infer"]["ns"] > 0
    parts = sum(inf[k]["ns"] for k in ("queue", "compute_input", "compute_infer", "compute_output"))
    assert abs(parts - inf["success"]["ns"]) <= 4 * 1000  # the parts add up to the total (rounding)
    assert inf["cache_hit"] == {"count": 0, "ns": 0}
    assert s["batch_stats"][0]["batch_size"] == 1 and s["batch_stats"][0]["compute_infer"]["count"] == 3
    assert t0 <= s["last_inference"] <= int(time.time() * 1000)
    everything = triton.get_inference_statistics()["model_stats"]
    assert s in everything
    refused("404", triton.get_inference_statistics, moe, "2")
    refused("404", triton.get_inference_statistics, unique("missing"))


# ---- trace and log settings -----------------------------------------------------------------
def test_trace_settings(triton, moe):
    settings = triton.get_trace_settings()
    assert settings["trace_level"] == ["OFF"] and {"trace_rate", "trace_count", "log_frequency"} <= set(settings)
    assert triton.get_trace_settings(model_name=moe) == settings
    assert triton.update_trace_settings(settings={"trace_level": ["OFF"]}) == settings
    assert triton.update_trace_settings(model_name=moe, settings={"trace_rate": None}) == settings
    for bad, key in (({"trace_level": ["TIMESTAMPS"]}, "trace_level"), ({"trace_rate": "5"}, "trace_rate"),
                     ({"bogus": 1}, "bogus")):
        assert key in refused("400", triton.update_trace_settings, settings=bad)
    refused("404", triton.get_trace_settings, model_name=unique("missing"))


def test_log_settings(triton):
    logger = logging.getLogger("segfuse")
    before = logger.level
    try:
        s = triton.update_log_settings({"log_verbose_level": 1})
        assert s["log_verbose_level"] == 1 and s["log_info"] and s["log_warning"] and s["log_error"]
        assert logger.getEffectiveLevel() == logging.DEBUG
        s = triton.update_log_settings({"log_verbose_level": 0, "log_info": False})
        assert not s["log_info"] and s["log_warning"] and logger.getEffectiveLevel() == logging.WARNING
        assert triton.get_log_settings() == s
        for bad, key in (({"log_info": True, "log_warning": False}, "minimum level"),
                         ({"log_file": "/tmp/x.log"}, "log_file"), ({"log_info": "yes"}, "log_info"),
                         ({"bogus": 1}, "bogus")):
            assert key in refused("400", triton.update_log_settings, bad)
        assert triton.get_log_settings() == s  # refused updates changed nothing
    finally:
        logger.setLevel(before)


# ---- compression ----------------------------------------------------------------------------
@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_request_and_response_compression(triton, chain, algorithm):
    inputs, expected = chain_inputs(4096)
    r = triton.infer(chain, inputs, model_version="1", request_compression_algorithm=algorithm,
                     response_compression_algorithm=algorithm)
    np.testing.assert_allclose(r.as_numpy("out"), expected, rtol=1e-6)
    out = httpclient.InferRequestedOutput("out", binary_data=False)
    r = triton.infer(chain, inputs, outputs=[out], request_compression_algorithm=algorithm,
                     response_compression_algorithm=algorithm)
    np.testing.assert_allclose(r.as_numpy("out"), expected, rtol=1e-6)


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compression_on_the_wire(live_server, chain, algorithm):
    """The binary framing survives compression: Inference-Header-Content-Length is the length of the
    uncompressed JSON header, as tritonclient reads it."""
    n = 4096
    a = np.linspace(-1, 1, n, dtype=np.float32)
    header = json.dumps({"inputs": [{"name": k, "shape": [n], "datatype": "FP32",
                                     "parameters": {"binary_data_size": 4 * n}} for k in "abc"],
                         "outputs": [{"name": "out", "parameters": {"binary_data": True}}]}).encode()
    body = header + a.tobytes() * 3
    packed = gzip.compress(body) if algorithm == "gzip" else zlib.compress(body)
    with httpx.stream("POST", f"{live_server.url}/v2/models/{chain}/versions/1/infer", content=packed,
                      headers={"Content-Encoding": algorithm, "Accept-Encoding": algorithm,
                               "Inference-Header-Content-Length": str(len(header)),
                               "Content-Type": "application/octet-stream"}) as r:
        raw = b"".join(r.iter_raw())
        assert r.status_code == 200
        assert r.headers["content-encoding"] == algorithm and int(r.headers["content-length"]) == len(raw)
        n_json = int(r.headers["inference-header-content-length"])
    plain = gzip.decompress(raw) if algorithm == "gzip" else zlib.decompress(raw)
    doc = json.loads(plain[:n_json])
    assert doc["outputs"][0]["parameters"]["binary_data_size"] == 4 * n == len(plain) - n_json
    expected = np.where(a > 0, a * a + a, np.exp(a) * np.float32(0.5))
    np.testing.assert_allclose(np.frombuffer(plain[n_json:], np.float32), expected, rtol=1e-6)


def test_compression_edges(live_server, chain):
    url = live_server.url
    # errors, small bodies and other routes answer uncompressed
    r = httpx.post(f"{url}/v2/models/{unique('missing')}/infer", json={"inputs": []},
                   headers={"Accept-Encoding": "gzip"})
    assert r.status_code == 404 and "content-encoding" not in r.headers
    r = httpx.get(f"{url}/v2/models/{chain}", headers={"Accept-Encoding": "gzip"})
    assert r.status_code == 200 and "content-encoding" not in r.headers
    # request compression works on every route
    a = np.arange(6, dtype=np.int64)
    r = httpx.put(f"{url}/v2/buffers/{unique('gz')}", params={"dtype": "int64", "shape": "6"},
                  content=gzip.compress(a.tobytes()),
                  headers={"Content-Encoding": "gzip", "Content-Type": "application/octet-stream"})
    assert r.status_code == 201 and r.json()["buffer"]["bytes"] == 48
    r = httpx.post(f"{url}/v2/models/{chain}/infer", content=b"\x1f\x8b\x08garbage",
                   headers={"Content-Encoding": "gzip"})
    assert r.status_code == 400 and "corrupt" in r.json()["error"]
    r = httpx.post(f"{url}/v2/models/{chain}/infer", content=gzip.compress(b'{"inputs": []}')[:-6],
                   headers={"Content-Encoding": "gzip"})
    assert r.status_code == 400 and "truncated" in r.json()["error"]
    r = httpx.post(f"{url}/v2/models/{chain}/infer", content=b"{}", headers={"Content-Encoding": "br"})
    assert r.status_code == 415 and "br" in r.json()["error"]


def test_zip_bomb_is_413_without_inflating(live_server_factory):
    import tracemalloc

    server = live_server_factory(backend="numpy", max_body_bytes=1 << 20)
    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    bomb = b"".join(c.compress(zeros) for _ in range(512)) + c.flush()  # 512 MiB inflated
    assert len(bomb) < 1 << 20
    tracemalloc.start()
    try:
        r = httpx.post(server.url + "/v2/models/x/infer", content=bomb,
                       headers={"Content-Encoding": "gzip"}, timeout=scaled(60))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert r.status_code == 413 and "inflates past the limit" in r.json()["error"]
    assert peak < 64 << 20, peak  # the server thread shares this process: it never held the 512 MiB
    ok = httpx.post(server.url + "/v2/fusions", content=gzip.compress(json.dumps(MOE_PROBLEM_SIZES).encode()),
                    headers={"Content-Encoding": "gzip", "Content-Type": "application/json"})
    assert ok.status_code == 201


# ---- names, KServe fields, request parameters -----------------------------------------------
def test_reserved_names_cover_the_routes(live_server):
    from segfuse.server.protocol import RESERVED_MODEL_NAMES

    literal = set()
    for path in live_server.app.openapi()["paths"]:  # every route (included routers are lazy)
        if path.startswith("/v2/models/"):
            literal |= {seg for seg in path.split("/")[3:] if seg and not seg.startswith("{")}
    assert literal and literal <= RESERVED_MODEL_NAMES, literal - RESERVED_MODEL_NAMES


def test_stats_as_a_fusion_name_is_refused(triton, live_server):
    g = copy.deepcopy(MOE_PROBLEM_SIZES)
    g["name"] = "stats"
    r = httpx.post(live_server.url + "/v2/fusions", json=g)
    assert r.status_code == 400 and "graph.name 'stats'" in r.json()["error"]
    assert r.json()["details"][0]["loc"] == ["graph", "name"]
    r = httpx.post(live_server.url + "/v2/execute", json={"graph": {**g, "name": "config"}, "inputs": []})
    assert r.status_code == 400 and "graph.name 'config'" in r.json()["error"]
    refused("400", triton.load_model, "stats", config=json.dumps(g))
    assert "model_stats" in triton.get_inference_statistics()  # the route still answers


def test_kserve_fields_in_the_body(live_server, moe):
    url = f"{live_server.url}/v2/models/{moe}/infer"
    inp = {"name": "topk_ids", "shape": [1, 2], "datatype": "INT64", "data": [3, 3]}
    ok = httpx.post(url, json={"model_name": moe, "model_version": "1", "inputs": [inp]})
    assert ok.status_code == 200 and ok.json()["outputs"][0]["data"][3] == 2
    r = httpx.post(url, json={"model_name": "someone_else", "inputs": [inp]})
    assert r.status_code == 400 and "body.model_name 'someone_else'" in r.json()["error"]
    r = httpx.post(url, json={"model_version": "2", "inputs": [inp]})
    assert r.status_code == 400 and "body.model_version '2'" in r.json()["error"]


def priority_requests(server) -> float:
    """segfuse_infer_priority_requests_total, as /metrics reports it."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(server.url + "/metrics").text
    (fam,) = [f for f in text_string_to_metric_families(text) if f.name == "segfuse_infer_priority_requests"]
    return next(s.value for s in fam.samples if s.name.endswith("_total"))


@pytest.mark.parametrize("binary", [True, False])
def test_priority_sequence_and_custom_parameters_are_accepted(triton, moe, live_server, binary):
    """As Triton 2.51 answers them for a model without a sequence batcher: accepted, the run's result
    unchanged; priority has no effect and is counted."""
    rng = np.random.default_rng(11)
    before = priority_requests(live_server)
    calls = [{"priority": 2}, {"priority": 2 ** 64 - 1}, {"sequence_id": 7}, {"sequence_id": "conversation-1"},
             {"sequence_id": 7, "sequence_start": True, "sequence_end": True},
             {"parameters": {"my_custom": 1, "flag": True, "name": "x", "ratio": 0.5}},
             {"priority": 3, "sequence_id": 9, "parameters": {"my_custom": "on"}}]
    for kwargs in calls:
        ids = rng.integers(0, 16, (5, 3), dtype=np.int64)
        r = triton.infer(moe, [ids_input(ids, binary)], **kwargs)
        np.testing.assert_array_equal(r.as_numpy("counts"), counts_of(ids), err_msg=str(kwargs))
    assert priority_requests(live_server) == before + sum("priority" in k for k in calls)


def test_request_parameters_segfuse_reads_are_still_checked(live_server, moe):
    """Known parameters of the wrong type or range, and custom ones that are not a string, a number
    or a boolean, are 400 located at the parameter (Triton: 500 and 400)."""
    url = f"{live_server.url}/v2/models/{moe}/infer"
    inp = {"name": "topk_ids", "shape": [1, 1], "datatype": "INT64", "data": [1]}
    for params, key in (({"timeout": -1}, "timeout"), ({"timeout": "soon"}, "timeout"), ({"priority": -1}, "priority"),
                        ({"priority": "high"}, "priority"), ({"priority": 2 ** 64}, "priority"),
                        ({"sequence_id": -1}, "sequence_id"), ({"sequence_id": 1.5}, "sequence_id"),
                        ({"sequence_start": "yes"}, "sequence_start"),
                        ({"binary_data_output": "yes"}, "binary_data_output"),
                        ({"my_custom": {"a": 1}}, "my_custom"), ({"my_custom": [1]}, "my_custom"),
                        ({"my_custom": None}, "my_custom")):
        r = httpx.post(url, json={"inputs": [inp], "parameters": params})
        assert r.status_code == 400, (params, r.text)
        assert r.json()["details"][0]["loc"][-2:] == ["parameters", key], (params, r.text)
    ok = httpx.post(url, json={"inputs": [inp], "parameters": {"priority": 0, "sequence_id": 0, "timeout": 0,
                                                               "binary_data_output": False}})
    assert ok.status_code == 200 and ok.json()["outputs"][0]["data"] == counts_of(np.array([1])).tolist(), ok.text
    r = httpx.post(url, json={"inputs": [inp], "outputs": [{"name": "counts", "parameters": {"class_count": 3}}]})
    assert r.status_code == 400 and "class_count" in r.json()["error"]


def test_unknown_top_level_fields_are_ignored(live_server, moe):
    """As in Triton, JSON and binary; inside an input, and in /v2/execute's body, still 400."""
    url = f"{live_server.url}/v2/models/{moe}/infer"
    ids = np.array([[3, 3], [0, 15]], np.int64)
    inp = {"name": "topk_ids", "shape": [2, 2], "datatype": "INT64", "data": ids.ravel().tolist()}
    r = httpx.post(url, json={"inputs": [inp], "client_note": {"any": ["thing"]}, "request_tag": 7})
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == counts_of(ids).tolist(), r.text
    header = json.dumps({"inputs": [{**inp, "data": None, "parameters": {"binary_data_size": ids.nbytes}}],
                         "outputs": [{"name": "counts"}], "extra": True}).encode()
    r = httpx.post(url, content=header + ids.tobytes(), headers={"Inference-Header-Content-Length": str(len(header))})
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == counts_of(ids).tolist(), r.text
    r = httpx.post(url, json={"inputs": [{**inp, "note": 1}]})
    assert r.status_code == 400 and r.json()["details"][0]["loc"] == ["body", "inputs", 0, "note"], r.text
    g = {**MOE_PROBLEM_SIZES, "name": unique("executed")}
    r = httpx.post(live_server.url + "/v2/execute", json={"graph": g, "inputs": [inp], "note": 1})
    assert r.status_code == 400 and r.json()["details"][0]["loc"] == ["body", "note"], r.text


@pytest.mark.parametrize("binary", [True, False])
def test_invalid_requests_are_400_with_their_location(triton, moe, live_server, binary):
    """Wrong datatype, wrong shape, a missing or unknown input, an unknown output, data out of range:
    400 (Triton's status), with segfuse's message; a valid request after them still runs."""
    ids = np.array([[1, 2], [2, 15]], np.int64)

    def infer_input(name, shape, datatype, data):
        i = httpclient.InferInput(name, shape, datatype)
        i.set_data_from_numpy(data, binary_data=binary)
        return i

    cases = [([infer_input("topk_ids", [2, 2], "INT32", ids.astype(np.int32))], None, "int32"),
             ([infer_input("topk_ids", [4], "INT64", ids.ravel())], None, "rank 1"),
             ([], None, "missing input"),
             ([ids_input(ids, binary), infer_input("other", [2, 2], "INT64", ids)], None, "unknown input"),
             ([ids_input(ids, binary)], [httpclient.InferRequestedOutput("nope", binary_data=binary)], "not an output"),
             ([ids_input(np.array([[16, 0]], np.int64), binary)], None, "out of bounds")]
    for inputs, outputs, text in cases:
        assert text in refused("400", triton.infer, moe, inputs, outputs=outputs), text
    r = triton.infer(moe, [ids_input(ids, binary)])
    np.testing.assert_array_equal(r.as_numpy("counts"), counts_of(ids))


_Gate = GatedEngine  # holds the server's run worker until the test opens it


def test_timeout_honoured(live_server, moe):
    """A run that has not started on the (single) worker within parameters.timeout fails with 429;
    one that starts in time runs."""
    rt = live_server.runtime
    host = live_server.url.removeprefix("http://")
    ids = np.arange(8, dtype=np.int64).reshape(4, 2)
    assert httpclient.InferenceServerClient(host).infer(moe, [ids_input(ids)], timeout=30_000_000) \
        .as_numpy("counts").tolist() == counts_of(ids).tolist()
    before = rt.stats.model_stats(rt.fusions.resolve(moe), "1")["inference_stats"]["fail"]["count"]
    gate = rt.engine = _Gate(rt.engine)
    results: dict = {}

    def call(key, **kw):
        c = httpclient.InferenceServerClient(host, network_timeout=scaled(60))
        try:
            results[key] = c.infer(moe, [ids_input(ids)], **kw).as_numpy("counts")
        except InferenceServerException as e:
            results[key] = e
        finally:
            c.close()

    try:
        first = threading.Thread(target=call, args=("first",))
        first.start()
        assert gate.entered.wait(scaled(60))
        late = threading.Thread(target=call, args=("late",), kwargs={"timeout": 1000})  # 1 ms
        late.start()
        wait_until(lambda: rt.executor.admitted >= 2, 60, "the late call admitted", poll=0.005)
        time.sleep(0.05)
    finally:
        gate.release.set()
        first.join(scaled(120))
        late.join(scaled(120))
        rt.engine = gate.inner
    np.testing.assert_array_equal(results["first"], counts_of(ids))
    e = results["late"]
    assert isinstance(e, InferenceServerException), e
    assert e.status() == "429" and "parameters.timeout" in e.message()
    after = rt.stats.model_stats(rt.fusions.resolve(moe), "1")["inference_stats"]["fail"]["count"]
    assert after == before + 1


def test_auth_covers_the_protocol_routes_before_decompression(live_server_factory):
    server = live_server_factory(backend="numpy", token="t0k")
    c = httpclient.InferenceServerClient(server.url.removeprefix("http://"))
    try:
        assert c.is_server_live() and c.is_server_ready()  # health stays open
        for call in (c.get_model_repository_index, c.get_inference_statistics, c.get_trace_settings,
                     c.get_log_settings):
            refused("401", call)
        auth = {"Authorization": "Bearer t0k"}
        assert c.get_model_repository_index(headers=auth) == []
        assert c.get_log_settings(headers=auth)["log_format"] == "default"
    finally:
        c.close()
    r = httpx.post(server.url + "/v2/models/x/infer", content=b"{}", headers={"Content-Encoding": "br"})
    assert r.status_code == 401  # refused before the body is looked at
