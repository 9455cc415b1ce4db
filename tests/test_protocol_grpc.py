"""The KServe v2 gRPC protocol (`inference.GRPCInferenceService`, `--grpc-port`) checked with the real
tritonclient[grpc], unchanged, against a live server that serves HTTP and gRPC from one runtime: health,
metadata, config, infer (raw and typed contents, requested outputs, parameters; sync, aio, streaming),
statistics, repository index/load/unload, system and CUDA shared memory, trace and log settings, the
status codes of errors, auth, limits and metrics. Oracle: NumPy; the same run over HTTP is the other."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import subprocess
import threading
import uuid

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
import tritonclient.http as httpclient
from helpers.graphs import ELEMENTWISE_CHAIN, MOE_PROBLEM_SIZES, counts_of
from helpers.processes import SEGFUSE
from helpers.service import GatedEngine
from helpers.waiting import scaled, wait_until
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

# Two outputs of two inputs: requested outputs pick among them.
SUM_AND_PRODUCT = {
    "format": "segfuse.fusion/1", "name": "sum_and_product",
    "inputs": [{"name": "a", "dtype": "float32", "shape": ["N"]}, {"name": "b", "dtype": "float32", "shape": ["N"]}],
    "ops": [{"op": "add", "out": "sum", "inputs": ["a", "b"]}, {"op": "mul", "out": "product", "inputs": ["a", "b"]}],
    "outputs": ["sum", "product"],
}


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


class Served:
    """A live server (tests/helpers/servers.py) with its gRPC port: `grpc_address`, `url` (HTTP)."""

    def __init__(self, server):
        self.server, self.url, self.runtime = server, server.url, server.runtime
        self.grpc_address = f"127.0.0.1:{server.app.state.grpc_port}"

    def register(self, graph: dict, prefix: str, headers: dict | None = None) -> str:
        g = copy.deepcopy(graph)
        g["name"] = unique(prefix)
        r = httpx.post(self.url + "/v2/fusions", json=g, headers=headers or {}, timeout=scaled(30))
        assert r.status_code in (200, 201), r.text
        return g["name"]


@pytest.fixture(scope="module")
def served(server_backend):
    from helpers.servers import LiveServer

    server = LiveServer(backend=server_backend, max_queued_runs=1024, grpc_port=0).start()
    yield Served(server)
    server.stop()


@pytest.fixture
def client(served):
    c = grpcclient.InferenceServerClient(served.grpc_address)
    yield c
    c.close()


@pytest.fixture
def stub(served):
    """The generated stub on a plain channel: requests tritonclient does not build (typed contents)."""
    with grpc.insecure_channel(served.grpc_address) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


@pytest.fixture
def moe(served) -> str:
    return served.register(MOE_PROBLEM_SIZES, "moe")


def ids_input(ids: np.ndarray) -> grpcclient.InferInput:
    i = grpcclient.InferInput("topk_ids", list(ids.shape), "INT64")
    i.set_data_from_numpy(ids)
    return i


def random_ids(seed: int, tokens: int = 64) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 16, (tokens, 2), dtype=np.int64)


def refused(code: grpc.StatusCode, fn, *args, **kwargs) -> str:
    with pytest.raises(InferenceServerException) as e:
        fn(*args, **kwargs)
    assert e.value.status() == str(code), (e.value.status(), e.value.message())
    return e.value.message()


# ---- health and metadata ---------------------------------------------------------------------
def test_health_and_server_metadata_answer_as_over_http(served, client):
    assert client.is_server_live() and client.is_server_ready()
    meta = client.get_server_metadata(as_json=True)
    http = httpx.get(served.url + "/v2").json()
    assert meta["name"] == http["name"] == "segfuse"
    assert meta["version"] == http["version"] and meta["extensions"] == http["extensions"]


def test_model_ready_is_true_for_a_fusion_and_false_for_an_unknown_model_or_version(client, moe):
    assert client.is_model_ready(moe) and client.is_model_ready(moe, "1")
    assert not client.is_model_ready("no_such_fusion")  # as Triton: ready false, not an error
    assert not client.is_model_ready(moe, "7")


def test_model_metadata_and_config_are_the_http_documents(served, client, moe):
    meta = client.get_model_metadata(moe, as_json=True)
    http = httpx.get(f"{served.url}/v2/models/{moe}").json()
    assert meta["name"] == http["name"] and meta["versions"] == ["1"] and meta["platform"] == "segfuse"
    assert [(t["name"], t["datatype"], [int(d) for d in t["shape"]]) for t in meta["inputs"]] == \
        [(t["name"], t["datatype"], t["shape"]) for t in http["inputs"]] == [("topk_ids", "INT64", [-1, -1])]
    assert client.get_model_metadata(moe, "1", as_json=True) == meta
    config = client.get_model_config(moe, as_json=True)["config"]
    http_config = httpx.get(f"{served.url}/v2/models/{moe}/config").json()
    assert config["name"] == moe and config["input"][0]["data_type"] == http_config["input"][0]["data_type"]
    assert [int(d) for d in config["input"][0]["dims"]] == http_config["input"][0]["dims"]
    assert config["parameters"]["segfuse_id"]["string_value"] == http_config["parameters"]["segfuse_id"]["string_value"]


# ---- inference ---------------------------------------------------------------------------
def test_infer_with_raw_inputs_matches_numpy(client, moe):
    ids = random_ids(1)
    result = client.infer(moe, [ids_input(ids)], request_id="r1")
    np.testing.assert_array_equal(result.as_numpy("counts"), counts_of(ids))
    response = result.get_response()
    assert response.model_name == moe and response.model_version == "1" and response.id == "r1"
    assert response.parameters["cache_hits"].int64_param + response.parameters["cache_misses"].int64_param >= 1
    assert response.parameters["timings_us.total"].double_param > 0


def test_infer_with_typed_contents_matches_numpy(served, stub, moe):
    ids = random_ids(2)
    request = pb.ModelInferRequest(model_name=moe)
    t = request.inputs.add(name="topk_ids", datatype="INT64", shape=list(ids.shape))
    t.contents.int64_contents.extend(ids.ravel().tolist())
    response = stub.ModelInfer(request, timeout=scaled(60))
    out = response.outputs[0]
    assert (out.name, out.datatype, list(out.shape)) == ("counts", "INT64", [16])
    np.testing.assert_array_equal(np.frombuffer(response.raw_output_contents[0], "<i8"), counts_of(ids))

    chain = served.register(ELEMENTWISE_CHAIN, "chain")
    rng = np.random.default_rng(3)
    a, b, c = (rng.standard_normal(32).astype(np.float32) for _ in range(3))
    request = pb.ModelInferRequest(model_name=chain)
    for name, array in zip("abc", (a, b, c)):
        request.inputs.add(name=name, datatype="FP32", shape=[32]).contents.fp32_contents.extend(array.tolist())
    response = stub.ModelInfer(request, timeout=scaled(60))
    expected = np.where(a > 0, a * b + c, np.exp(c) * np.float32(0.5)).astype(np.float32)
    np.testing.assert_allclose(np.frombuffer(response.raw_output_contents[0], "<f4"), expected, rtol=1e-6)


def test_typed_contents_of_another_datatype_or_with_raw_inputs_are_invalid(stub, moe):
    ids = random_ids(4, tokens=4)
    request = pb.ModelInferRequest(model_name=moe)
    request.inputs.add(name="topk_ids", datatype="INT64", shape=[4, 2]).contents.fp32_contents.extend([1.0] * 8)
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(request, timeout=scaled(60))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "int64_contents" in e.value.details()
    request = pb.ModelInferRequest(model_name=moe, raw_input_contents=[ids.tobytes()])
    request.inputs.add(name="topk_ids", datatype="INT64", shape=[4, 2]).contents.int64_contents.extend(ids.ravel())
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(request, timeout=scaled(60))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "raw_input_contents" in e.value.details()


def test_requested_outputs_and_request_parameters(served, client):
    name = served.register(SUM_AND_PRODUCT, "sum_product")
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal(16).astype(np.float32), rng.standard_normal(16).astype(np.float32)
    inputs = []
    for n, array in (("a", a), ("b", b)):
        inputs.append(grpcclient.InferInput(n, [16], "FP32"))
        inputs[-1].set_data_from_numpy(array)
    both = client.infer(name, inputs)
    np.testing.assert_array_equal(both.as_numpy("sum"), a + b)
    np.testing.assert_array_equal(both.as_numpy("product"), a * b)
    # one requested output; priority, a custom parameter and a sequence id are accepted (as Triton)
    only = client.infer(name, inputs, outputs=[grpcclient.InferRequestedOutput("product")], priority=3,
                        sequence_id=42, parameters={"my_tag": "x", "my_count": 2})
    assert [o.name for o in only.get_response().outputs] == ["product"]
    np.testing.assert_array_equal(only.as_numpy("product"), a * b)
    assert only.as_numpy("sum") is None


def test_the_same_run_over_http_and_grpc_gives_equal_results(served, client):
    chain = served.register(ELEMENTWISE_CHAIN, "chain")
    rng = np.random.default_rng(6)
    arrays = {k: rng.standard_normal(1000).astype(np.float32) for k in "abc"}
    http = httpclient.InferenceServerClient(served.url.removeprefix("http://"), network_timeout=scaled(60))
    try:
        http_inputs, grpc_inputs = [], []
        for k, v in arrays.items():
            http_inputs.append(httpclient.InferInput(k, [1000], "FP32"))
            http_inputs[-1].set_data_from_numpy(v)
            grpc_inputs.append(grpcclient.InferInput(k, [1000], "FP32"))
            grpc_inputs[-1].set_data_from_numpy(v)
        over_http = http.infer(chain, http_inputs).as_numpy("out")
    finally:
        http.close()
    over_grpc = client.infer(chain, grpc_inputs).as_numpy("out")
    assert over_grpc.dtype == over_http.dtype == np.float32
    np.testing.assert_array_equal(over_grpc, over_http)
    a, b, c = arrays.values()
    # (atol: on a GPU a * b + c is one fused multiply-add, a result near 0 differs from NumPy's in its last bits)
    np.testing.assert_allclose(over_grpc, np.where(a > 0, a * b + c, np.exp(c) * np.float32(0.5)), rtol=1e-6,
                               atol=1e-7)


def test_aio_client_runs_concurrent_inferences(served, moe):
    async def main():
        async with grpcaio.InferenceServerClient(served.grpc_address) as c:
            assert await c.is_server_ready() and await c.is_model_ready(moe)
            batches = [random_ids(10 + k) for k in range(8)]
            results = await asyncio.gather(*(c.infer(moe, [ids_input(ids)]) for ids in batches))
            for ids, r in zip(batches, results):
                np.testing.assert_array_equal(r.as_numpy("counts"), counts_of(ids))
            stats = await c.get_inference_statistics(moe, as_json=True)
            return int(stats["model_stats"][0]["inference_count"])

    assert asyncio.run(main()) == 8


def test_aio_stream_answers_each_request_with_its_result_or_error(served, moe):
    batches = {f"req{k}": random_ids(20 + k) for k in range(5)}

    async def requests():
        for rid, ids in batches.items():
            yield {"model_name": moe, "inputs": [ids_input(ids)], "request_id": rid}
        yield {"model_name": "no_such_fusion", "inputs": [ids_input(batches["req0"])], "request_id": "bad"}

    async def main():
        async with grpcaio.InferenceServerClient(served.grpc_address) as c:
            return [pair async for pair in c.stream_infer(requests())]

    answers = asyncio.run(main())
    results = {r.get_response().id: r for r, e in answers if e is None}
    errors = [e for r, e in answers if e is not None]
    assert set(results) == set(batches)
    for rid, ids in batches.items():
        np.testing.assert_array_equal(results[rid].as_numpy("counts"), counts_of(ids))
    assert len(errors) == 1 and "no_such_fusion" in errors[0].message()


def test_sync_stream_with_a_callback(served, client, moe):
    done = threading.Event()
    answers: list = []
    batches = {f"s{k}": random_ids(30 + k) for k in range(4)}

    def callback(result, error):
        answers.append((result, error))
        if len(answers) == len(batches) + 1:
            done.set()

    client.start_stream(callback)
    try:
        for rid, ids in batches.items():
            client.async_stream_infer(moe, [ids_input(ids)], request_id=rid)
        bad = grpcclient.InferInput("topk_ids", [2, 2], "FP32")
        bad.set_data_from_numpy(np.zeros((2, 2), np.float32))
        client.async_stream_infer(moe, [bad], request_id="bad")
        assert done.wait(scaled(60))
    finally:
        client.stop_stream()
    results = {r.get_response().id: r.as_numpy("counts") for r, e in answers if e is None}
    assert results.keys() == batches.keys()
    for rid, ids in batches.items():
        np.testing.assert_array_equal(results[rid], counts_of(ids))
    (error,) = [e for r, e in answers if e is not None]
    assert "float32" in error.message() and "int64" in error.message()


# ---- statistics, repository, settings ------------------------------------------------------
def test_statistics_count_grpc_runs_as_http_shows_them(served, client, moe):
    for k in range(3):
        client.infer(moe, [ids_input(random_ids(40 + k))])
    stats = client.get_inference_statistics(moe, as_json=True)["model_stats"][0]
    http = httpx.get(f"{served.url}/v2/models/{moe}/stats").json()["model_stats"][0]
    assert int(stats["inference_count"]) == http["inference_count"] == 3
    assert int(stats["inference_stats"]["success"]["count"]) == http["inference_stats"]["success"]["count"] == 3
    assert client.get_inference_statistics(moe, "1", as_json=True)["model_stats"][0]["name"] == moe
    names = [m["name"] for m in client.get_inference_statistics(as_json=True)["model_stats"]]
    assert moe in names


def test_requests_refused_before_running_are_not_counted_as_failed_runs(served, client, stub, moe):
    """As over HTTP (and in Triton): a request refused before its run is neither a success nor a `fail`;
    it counts in segfuse_infer_rejected."""
    def rejected() -> float:
        text = httpx.get(served.url + "/metrics").text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("segfuse_infer_rejected_total{") and f'model="{moe}"' in line)

    ids = random_ids(45, tokens=4)
    wrong = grpcclient.InferInput("topk_ids", [4, 2], "FP32")
    wrong.set_data_from_numpy(ids.astype(np.float32))
    refused(grpc.StatusCode.INVALID_ARGUMENT, client.infer, moe, [wrong])
    refused(grpc.StatusCode.INVALID_ARGUMENT, client.infer, moe, [ids_input(ids)],
            outputs=[grpcclient.InferRequestedOutput("nope")])
    both = pb.ModelInferRequest(model_name=moe, raw_input_contents=[ids.tobytes()])
    both.inputs.add(name="topk_ids", datatype="INT64", shape=[4, 2]).contents.int64_contents.extend(ids.ravel())
    with pytest.raises(grpc.RpcError):
        stub.ModelInfer(both, timeout=scaled(60))
    client.infer(moe, [ids_input(ids)])
    stats = client.get_inference_statistics(moe, as_json=True)["model_stats"][0]
    assert int(stats["inference_count"]) == 1
    assert int(stats["inference_stats"]["success"]["count"]) == 1
    assert int(stats["inference_stats"]["fail"].get("count", 0)) == 0
    assert rejected() == 3


def test_repository_load_index_and_unload(served, client, stub):
    name = unique("loaded")
    graph = {**copy.deepcopy(MOE_PROBLEM_SIZES), "name": name}
    client.load_model(name, config=json.dumps(graph))
    assert client.is_model_ready(name)
    ids = random_ids(50)
    np.testing.assert_array_equal(client.infer(name, [ids_input(ids)]).as_numpy("counts"), counts_of(ids))
    index = {m["name"]: m for m in client.get_model_repository_index(as_json=True)["models"]}
    assert index[name]["state"] == "READY" and index[name]["version"] == "1"
    client.unload_model(name)
    assert not client.is_model_ready(name)
    index = {m["name"]: m for m in client.get_model_repository_index(as_json=True)["models"]}
    assert (index[name]["state"], index[name]["reason"]) == ("UNAVAILABLE", "unloaded")
    other = unique("ready")  # one READY fusion whatever ran before (the test alone, or first on a worker)
    client.load_model(other, config=json.dumps({**graph, "name": other}))
    ready_only = stub.RepositoryIndex(pb.RepositoryIndexRequest(ready=True), timeout=scaled(30))
    assert other in {m.name for m in ready_only.models} and name not in {m.name for m in ready_only.models}
    assert {m.state for m in ready_only.models} == {"READY"}
    client.load_model(name)  # the unloaded fusion, again
    assert client.is_model_ready(name)
    refused(grpc.StatusCode.NOT_FOUND, client.unload_model, "no_such_fusion")
    assert "model files" in refused(grpc.StatusCode.INVALID_ARGUMENT, client.load_model, name, config=json.dumps(graph),
                                    files={"file:1/model.py": b"x"})


def test_trace_and_log_settings(client, stub):
    trace = client.get_trace_settings(as_json=True)["settings"]
    assert trace["trace_level"]["value"] == ["OFF"] and trace["trace_rate"]["value"] == ["1000"]
    assert "tracing is not implemented" in refused(grpc.StatusCode.INVALID_ARGUMENT, client.update_trace_settings,
                                                   settings={"trace_level": ["TIMESTAMPS"]})
    kept = client.update_trace_settings(settings={"trace_level": ["OFF"], "trace_rate": None}, as_json=True)
    assert kept["settings"]["trace_level"]["value"] == ["OFF"]
    refused(grpc.StatusCode.NOT_FOUND, client.get_trace_settings, model_name="no_such_fusion")
    logger = logging.getLogger("segfuse")
    level = logger.level
    try:
        logs = client.update_log_settings({"log_verbose_level": 1}, as_json=True)["settings"]
        assert logs["log_verbose_level"]["uint32_param"] == 1 and logger.getEffectiveLevel() == logging.DEBUG
        assert client.get_log_settings(as_json=True)["settings"]["log_info"]["bool_param"] is True
        wrong_type = pb.LogSettingsRequest()
        wrong_type.settings["log_info"].uint32_param = 3  # (tritonclient sends a bool for log_info)
        with pytest.raises(grpc.RpcError) as e:
            stub.LogSettings(wrong_type, timeout=scaled(30))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "true or false" in e.value.details()
        # silencing warnings needs a server with a token (as over HTTP: 403)
        refused(grpc.StatusCode.PERMISSION_DENIED, client.update_log_settings, {"log_warning": False})
    finally:
        logger.setLevel(level)


# ---- shared memory ---------------------------------------------------------------------------
def test_system_shared_memory_inputs_and_outputs(client, moe, shm):
    ids = random_ids(60, tokens=8)
    region_in, region_out = shm(ids.nbytes), shm(16 * 8)
    np.ndarray(ids.shape, np.int64, buffer=region_in.buf)[:] = ids
    client.register_system_shared_memory("in_region", "/" + region_in.name, ids.nbytes)
    client.register_system_shared_memory("out_region", "/" + region_out.name, 16 * 8)
    try:
        status = client.get_system_shared_memory_status(as_json=True)["regions"]
        assert {"in_region", "out_region"} <= set(status)
        assert int(status["in_region"]["byte_size"]) == ids.nbytes
        i = grpcclient.InferInput("topk_ids", list(ids.shape), "INT64")
        i.set_shared_memory("in_region", ids.nbytes)
        o = grpcclient.InferRequestedOutput("counts")
        o.set_shared_memory("out_region", 16 * 8)
        result = client.infer(moe, [i], outputs=[o])
        out = result.get_output("counts")
        assert out.parameters["shared_memory_region"].string_param == "out_region"
        np.testing.assert_array_equal(np.ndarray((16,), np.int64, buffer=region_out.buf), counts_of(ids))
        refused(grpc.StatusCode.NOT_FOUND, client.get_system_shared_memory_status, "no_such_region")
    finally:
        client.unregister_system_shared_memory("in_region")
        client.unregister_system_shared_memory()
    assert client.get_system_shared_memory_status(as_json=True) == {}
    refused(grpc.StatusCode.NOT_FOUND, client.unregister_system_shared_memory, "in_region")


def test_cuda_shared_memory_is_unimplemented_without_a_gpu(served, client):
    if served.runtime.backend_name != "numpy":
        pytest.skip("the cupy backend registers CUDA regions (tests/gpu/)")
    assert client.get_cuda_shared_memory_status(as_json=True) == {}
    import base64

    message = refused(grpc.StatusCode.UNIMPLEMENTED, client.register_cuda_shared_memory, "gpu_region",
                      base64.b64encode(bytes(64)), 0, 64)
    r = httpx.post(f"{served.url}/v2/cudasharedmemory/region/gpu_region/register",
                   json={"raw_handle": {"b64": base64.b64encode(bytes(64)).decode()}, "device_id": 0, "byte_size": 64})
    assert r.status_code == 501 and r.json()["error"] == message


# ---- errors, auth, limits -----------------------------------------------------------------
def test_errors_have_triton_status_codes_and_segfuse_messages(served, client, stub, moe):
    ids = random_ids(70, tokens=4)
    message = refused(grpc.StatusCode.NOT_FOUND, client.infer, "no_such_fusion", [ids_input(ids)])
    assert message == "fusion 'no_such_fusion' not found"
    refused(grpc.StatusCode.NOT_FOUND, client.get_model_metadata, "no_such_fusion")
    refused(grpc.StatusCode.NOT_FOUND, client.get_model_config, moe, "7")
    refused(grpc.StatusCode.NOT_FOUND, client.infer, moe, [ids_input(ids)], model_version="7")
    wrong = grpcclient.InferInput("topk_ids", [4, 2], "FP32")
    wrong.set_data_from_numpy(ids.astype(np.float32))
    message = refused(grpc.StatusCode.INVALID_ARGUMENT, client.infer, moe, [wrong])
    http = httpx.post(f"{served.url}/v2/models/{moe}/infer", json={"inputs": [
        {"name": "topk_ids", "datatype": "FP32", "shape": [4, 2], "data": ids.astype(np.float32).ravel().tolist()}]})
    assert http.status_code == 400 and http.json()["error"] == message
    assert "not an output" in refused(grpc.StatusCode.INVALID_ARGUMENT, client.infer, moe, [ids_input(ids)],
                                      outputs=[grpcclient.InferRequestedOutput("nope")])
    short = pb.ModelInferRequest(model_name=moe, raw_input_contents=[ids.tobytes()[:-8]])
    short.inputs.add(name="topk_ids", datatype="INT64", shape=[4, 2])
    with pytest.raises(grpc.RpcError) as e:
        stub.ModelInfer(short, timeout=scaled(60))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    body = json.loads(dict(e.value.trailing_metadata())["segfuse-error"])
    assert body["error"] == e.value.details() and body["details"][0]["loc"][:2] == ["inputs", 0]


def test_an_error_of_many_details_reaches_the_client_cut_to_fit_its_metadata(served, stub):
    """A client takes 8-16 KiB of status and trailing metadata: a longer message would end the call with
    RESOURCE_EXHAUSTED instead of the error."""
    graph = {"format": "segfuse.fusion/1", "name": unique("bad"), "inputs": [{"name": "x", "dtype": "float32",
                                                                             "shape": ["N"]}],
             "ops": [{"op": "add", "out": f"y{i}", "inputs": [f"missing_tensor_{i}", "x"]} for i in range(400)],
             "outputs": ["y0"]}
    request = pb.RepositoryModelLoadRequest(model_name=graph["name"])
    request.parameters["config"].string_param = json.dumps(graph)
    with pytest.raises(grpc.RpcError) as e:
        stub.RepositoryModelLoad(request, timeout=scaled(60))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details().startswith("invalid graph: ") and "missing_tensor_0" in e.value.details()
    body = json.loads(dict(e.value.trailing_metadata())["segfuse-error"])
    assert body["error"] == e.value.details() and 0 < len(body["details"]) < 400
    assert body["details"][0]["loc"] == ["parameters", "config", "ops", 0, "inputs", 0]


def test_a_token_guards_every_rpc_but_health(live_server_factory):
    server = Served(live_server_factory(backend="numpy", token="s3cret", grpc_port=0))
    name = server.register(MOE_PROBLEM_SIZES, "moe", headers={"Authorization": "Bearer s3cret"})
    c = grpcclient.InferenceServerClient(server.grpc_address)
    try:
        assert c.is_server_live() and c.is_server_ready()
        ids = random_ids(80)
        for call, args in ((c.get_server_metadata, ()), (c.is_model_ready, (name,)), (c.get_model_config, (name,)),
                           (c.infer, (name, [ids_input(ids)])), (c.get_model_repository_index, ()),
                           (c.get_system_shared_memory_status, ()), (c.get_log_settings, ())):
            assert refused(grpc.StatusCode.UNAUTHENTICATED, call, *args) == "missing bearer token"
        assert refused(grpc.StatusCode.UNAUTHENTICATED, c.get_server_metadata,
                       headers={"authorization": "Bearer wrong"}) == "invalid bearer token"
        good = {"authorization": "Bearer s3cret"}
        assert c.get_server_metadata(headers=good).name == "segfuse"
        np.testing.assert_array_equal(c.infer(name, [ids_input(ids)], headers=good).as_numpy("counts"),
                                      counts_of(ids))
        errors: list = []
        c.start_stream(lambda result, error: errors.append(error), headers={"authorization": "Bearer wrong"})
        try:
            try:
                c.async_stream_infer(name, [ids_input(ids)])
            except InferenceServerException:
                pass  # the stream ended already: the server refuses it at its start (reported to the callback)
            wait_until(lambda: errors, 60, "the stream's error")
        finally:
            c.stop_stream()
        assert errors[0] is not None and errors[0].status() == str(grpc.StatusCode.UNAUTHENTICATED)
    finally:
        c.close()


def test_a_full_run_queue_is_unavailable(live_server_factory):
    server = Served(live_server_factory(backend="numpy", grpc_port=0, max_queued_runs=1))
    name = server.register(MOE_PROBLEM_SIZES, "moe")
    rt = server.runtime
    gate = rt.engine = GatedEngine(rt.engine)
    first: dict = {}
    ids = random_ids(90)
    c = grpcclient.InferenceServerClient(server.grpc_address)

    def run_first():
        first["counts"] = c.infer(name, [ids_input(ids)]).as_numpy("counts")

    holder = threading.Thread(target=run_first)
    try:
        holder.start()
        assert gate.entered.wait(scaled(60))
        message = refused(grpc.StatusCode.UNAVAILABLE, c.infer, name, [ids_input(ids)])
        assert "queue" in message
        with grpc.insecure_channel(server.grpc_address) as channel:
            request = pb.ModelInferRequest(model_name=name, raw_input_contents=[ids.tobytes()])
            request.inputs.add(name="topk_ids", datatype="INT64", shape=list(ids.shape))
            with pytest.raises(grpc.RpcError) as e:
                pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=scaled(60))
        assert e.value.code() == grpc.StatusCode.UNAVAILABLE
        assert dict(e.value.trailing_metadata())["retry-after"] == "1"  # HTTP's Retry-After of a 429
    finally:
        gate.release.set()
        holder.join(scaled(120))
        rt.engine = gate.inner
        c.close()
    np.testing.assert_array_equal(first["counts"], counts_of(ids))


def test_a_message_over_the_body_limit_is_refused(live_server_factory):
    server = Served(live_server_factory(backend="numpy", grpc_port=0, max_body_bytes=64 * 1024))
    name = server.register(MOE_PROBLEM_SIZES, "moe")
    c = grpcclient.InferenceServerClient(server.grpc_address)
    try:
        small = random_ids(100, tokens=64)
        np.testing.assert_array_equal(c.infer(name, [ids_input(small)]).as_numpy("counts"), counts_of(small))
        refused(grpc.StatusCode.RESOURCE_EXHAUSTED, c.infer, name, [ids_input(random_ids(101, tokens=8192))])
    finally:
        c.close()


def test_grpc_calls_and_runs_are_counted_in_the_metrics(served, client, moe):
    def sample(text: str, line_start: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start))

    endpoint = 'segfuse_requests_total{endpoint="/inference.GRPCInferenceService/ModelInfer",method="POST",status="200"}'
    before = httpx.get(served.url + "/metrics").text
    client.infer(moe, [ids_input(random_ids(110))])
    refused(grpc.StatusCode.NOT_FOUND, client.infer, "no_such_fusion", [ids_input(random_ids(111))])
    after = httpx.get(served.url + "/metrics").text
    assert sample(after, endpoint) == sample(before, endpoint) + 1
    not_found = endpoint.replace('status="200"', 'status="404"')
    assert sample(after, not_found) == sample(before, not_found) + 1
    ok_runs = 'segfuse_runs_total{outcome="ok"}'
    assert sample(after, ok_runs) == sample(before, ok_runs) + 1


def test_grpc_port_serves_one_process_only():
    r = subprocess.run([*SEGFUSE, "serve", "--backend", "numpy", "--grpc-port", "0", "--processes", "2"],
                       capture_output=True, text=True, timeout=scaled(60))
    assert r.returncode == 2 and "--grpc-port (SEGFUSE_GRPC_PORT) serves one process" in r.stderr, r.stderr


def test_grpc_is_off_unless_a_port_is_given(live_server_factory):
    from segfuse.server.settings import Settings

    assert Settings.from_env({}).grpc_port is None
    assert Settings.from_env({"SEGFUSE_GRPC_PORT": "8001"}).grpc_port == 8001
    with pytest.raises(ValueError, match="grpc_port"):
        Settings.from_env({"SEGFUSE_GRPC_PORT": "70000"})
    with pytest.raises(ValueError, match="grpc_port must differ from port"):
        Settings.from_env({"SEGFUSE_PORT": "9000", "SEGFUSE_GRPC_PORT": "9000"})
    server = live_server_factory(backend="numpy")
    assert server.app.state.grpc_port is None
