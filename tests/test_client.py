"""The sync and async clients against a live uvicorn server (NumPy backend) on a free port."""

from __future__ import annotations

import asyncio
import json

import httpx
import ml_dtypes
import numpy as np
import pytest
from helpers.graphs import MOE, counts_of
from helpers.processes import free_port, server_process
from segfuse.client import AsyncClient, Buffer, Client, ClientError, FusionRef, RunResult
from segfuse.client._builder import infer_body, normalize_url
from segfuse.compiler import FusionDefinition


@pytest.fixture
def client(server):  # server: conftest's server process
    with Client(server) as c:
        yield c


def moe_definition() -> FusionDefinition:
    with FusionDefinition("moe_problem_sizes") as fd:
        ids = fd.define_tensor("topk_ids", shape=["T", "K"], dtype="int64")
        flat = fd.ops.reshape(ids, [-1])
        counts = fd.ops.scatter(fd.ops.full([16], 0, "int64"), 0, flat, fd.ops.full_like(flat, 1, "int64"),
                                reduce="add")
        fd.add_output(counts, "counts")
    return fd


# ---- no server needed --------------------------------------------------------------------------
@pytest.mark.parametrize("given,expected", [
    ("localhost:8000", "http://localhost:8000"), ("127.0.0.1:9/", "http://127.0.0.1:9"),
    ("https://gpu.example:443/segfuse/", "https://gpu.example:443/segfuse"), (" http://h:1 ", "http://h:1")])
def test_url_forms(given, expected):
    assert normalize_url(given) == expected
    assert Client(given).url == expected


def test_infer_body_binary_layout():
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    b = np.ones(4, dtype=np.float16)
    body, blobs = infer_body({"a": a, "buf": Buffer("x"), "b": b}, {"y": Buffer("out", overwrite=True), "z": None})
    assert body["inputs"] == [
        {"name": "a", "shape": [2, 3], "datatype": "INT32", "parameters": {"binary_data_size": 24}},
        {"name": "buf", "parameters": {"buffer": "x"}},
        {"name": "b", "shape": [4], "datatype": "FP16", "parameters": {"binary_data_size": 8}}]
    assert body["outputs"] == [{"name": "y", "parameters": {"buffer": "out", "overwrite": True}},
                               {"name": "z", "parameters": {"binary_data": True}}]
    assert blobs == [a.tobytes(), b.tobytes()]
    body, _ = infer_body({}, None)
    assert body["parameters"] == {"binary_data_output": True}


def test_error_mapping_without_a_server():
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(409, json={"error": "name taken", "details": [{"loc": ["graph", "name"], "msg": "x"}]})

    with Client("h:1", transport=httpx.MockTransport(handler)) as c:
        with pytest.raises(ClientError) as e:
            c.register({"ops": []})
    assert (e.value.status, e.value.message) == (409, "name taken")
    assert e.value.details == [{"loc": ["graph", "name"], "msg": "x"}]
    assert e.value.url.startswith("http://h:1/v2/fusions")


def test_connection_error_names_the_url():
    port = free_port()  # nothing listens there
    with Client(f"127.0.0.1:{port}", timeout=2) as c:
        with pytest.raises(ClientError) as e:
            c.metadata()
    assert e.value.status is None
    assert f"127.0.0.1:{port}" in str(e.value)


def test_torch_tensor_goes_through_dlpack():
    torch = pytest.importorskip("torch")
    from segfuse.client._arrays import to_host

    t = torch.arange(12, dtype=torch.int64).reshape(3, 4)
    assert np.array_equal(to_host(t), t.numpy())
    g = torch.ones(3, requires_grad=True)
    assert np.array_equal(to_host(g), np.ones(3, np.float32))
    assert to_host(t.t()).flags.c_contiguous
    bf = to_host(torch.tensor([1.5, -2.0, 3.0], dtype=torch.bfloat16))  # NumPy has no bfloat16 of its own
    assert bf.dtype == ml_dtypes.bfloat16 and bf.astype(np.float32).tolist() == [1.5, -2.0, 3.0]


# ---- sync client, live server -------------------------------------------------------------------
def test_health_and_metadata(client):
    assert client.is_live() and client.is_ready()
    meta = client.metadata()
    assert meta["name"] == "segfuse" and meta["backend"] == "numpy"
    assert "binary_tensor_data" in meta["extensions"]


@pytest.mark.parametrize("array", [
    np.arange(12, dtype=np.int64).reshape(3, 4), np.array([True, False, True]),
    np.linspace(-1, 1, 7, dtype=np.float16), np.arange(6, dtype=np.float32).reshape(2, 1, 3)[..., ::-1],
    np.arange(5).astype(ml_dtypes.bfloat16), np.array(3.5, dtype=np.float64), np.zeros((0, 4), np.int32),
    np.array([1, 2, 255], dtype=np.uint8)], ids=lambda a: f"{a.dtype}{list(a.shape)}")
def test_buffer_round_trip(client, array):
    name = f"rt_{array.dtype}_{array.ndim}"
    client.put(name, array)
    back = client.get(name)
    assert back.dtype == array.dtype and back.shape == array.shape
    assert np.array_equal(back.astype(np.float64), array.astype(np.float64))
    assert any(b["name"] == name for b in client.buffers())
    client.delete(name)
    assert all(b["name"] != name for b in client.buffers())
    with pytest.raises(ClientError) as e:
        client.get(name)
    assert e.value.status == 404 and name in e.value.message


def test_register_forms_share_one_id(client):
    from_file = client.register(str(MOE))
    from_dict = client.register(json.loads(MOE.read_text()))
    from_definition = client.register(moe_definition())
    assert isinstance(from_file, FusionRef) and from_file.name == "moe_problem_sizes"
    assert from_file.id == from_dict.id == from_definition.id
    assert any(f["id"] == from_file.id for f in client.fusions())
    assert client.fusion(from_file)["graph"]["name"] == "moe_problem_sizes"


def test_run_arrays_buffers_and_names(client):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 16, (64, 8))
    ref = client.register(MOE)

    res = client.run(ref, inputs={"topk_ids": ids})  # every output, binary
    assert isinstance(res, RunResult) and res.model_name == "moe_problem_sizes" and res.fusion_id == ref.id
    assert np.array_equal(res["counts"], counts_of(ids)) and res.buffers == {}
    assert {"run", "total"} <= set(res.timings_us) and res.cache_hits >= 0 and res.cache_misses >= 0

    client.put("ids_run", ids)
    res = client.run("moe_problem_sizes", inputs={"topk_ids": Buffer("ids_run")},
                     outputs={"counts": Buffer("counts_run", overwrite=True)})
    assert res.outputs == {} and res.buffers == {"counts": "counts_run"}
    with pytest.raises(KeyError, match="stored in buffer 'counts_run'"):
        res["counts"]
    assert np.array_equal(client.get("counts_run"), counts_of(ids))

    res = client.run(moe_definition(), inputs={"topk_ids": ids[:3]}, outputs=["counts"])  # inline graph
    assert np.array_equal(res["counts"], counts_of(ids[:3]))
    for name in ("ids_run", "counts_run"):
        client.delete(name)


def test_run_errors_carry_status_and_details(client):
    with pytest.raises(ClientError) as e:
        client.run(MOE, inputs={"topk_ids": np.zeros((2, 2), np.float32)})
    assert e.value.status == 400 and e.value.details[0]["loc"] == ["inputs", "topk_ids"]
    with pytest.raises(ClientError) as e:
        client.run("no_such_fusion", inputs={})
    assert e.value.status == 404
    with pytest.raises(ClientError) as e:
        client.run(MOE, inputs={"topk_ids": Buffer("missing_buffer")})
    assert e.value.status == 404 and "missing_buffer" in e.value.message
    with pytest.raises(ClientError, match="input 'topk_ids': unsupported dtype complex64") as e:
        client.run(MOE, inputs={"topk_ids": np.zeros((2, 2), np.complex64)})  # checked before sending
    assert e.value.status is None
    with pytest.raises(ClientError, match="buffer 'c': unsupported dtype complex64"):
        client.put("c", np.zeros(2, np.complex64))


def test_plan_answers_or_says_why(client):
    try:
        plan = client.plan(MOE, {"T": 4096, "K": 8})
    except ClientError as e:  # an engine without a planner says so
        assert e.status == 501 and "planner" in e.message
    else:
        assert plan["symbols"] == {"T": 4096, "K": 8} and plan["shapes"] == {"topk_ids": [4096, 8]}
    with pytest.raises(ClientError) as e:
        client.plan(MOE, "T=4")  # K missing
    assert e.value.status == 400


def test_bearer_token():
    with server_process(token="s3cret") as url:
        with Client(url) as anonymous:
            assert anonymous.is_live()  # health needs no token
            with pytest.raises(ClientError) as e:
                anonymous.buffers()
            assert e.value.status == 401
        with Client(url, token="s3cret") as c:
            c.put("x", np.ones(3))
            assert c.buffers()[0]["name"] == "x"


# ---- async client -------------------------------------------------------------------------------
def test_async_client(server):
    rng = np.random.default_rng(1)
    batches = [rng.integers(0, 16, (n, 4)) for n in (1, 7, 32, 100)]

    async def main():
        async with AsyncClient(server) as c:
            assert await c.is_live() and await c.is_ready()
            assert (await c.metadata())["backend"] == "numpy"
            ref = await c.register(MOE)
            results = await asyncio.gather(*(c.run(ref, inputs={"topk_ids": b}) for b in batches))
            await c.put("async_ids", batches[-1])
            res = await c.run(ref, inputs={"topk_ids": Buffer("async_ids")},
                              outputs={"counts": Buffer("async_counts", overwrite=True)})
            stored = await c.get("async_counts")
            names = {b["name"] for b in await c.buffers()}
            for n in ("async_ids", "async_counts"):
                await c.delete(n)
            with pytest.raises(ClientError) as e:
                await c.get("async_ids")
            return results, res, stored, names, e.value

    results, res, stored, names, err = asyncio.run(main())
    for b, r in zip(batches, results):
        assert np.array_equal(r["counts"], counts_of(b))
    assert res.buffers == {"counts": "async_counts"} and np.array_equal(stored, counts_of(batches[-1]))
    assert {"async_ids", "async_counts"} <= names
    assert err.status == 404


def test_async_connection_error():
    async def main():
        async with AsyncClient(f"127.0.0.1:{free_port()}", timeout=2) as c:
            await c.is_live()

    with pytest.raises(ClientError, match="cannot reach"):
        asyncio.run(main())


@pytest.mark.parametrize("namespace, expected", [("team-a", "team-a"), (None, None)])
def test_namespace_is_sent_as_a_header(namespace, expected):
    seen = []

    def handler(request):
        seen.append(request.headers.get("Segfuse-Namespace"))
        return httpx.Response(200, json={"live": True})

    with Client("h:1", namespace=namespace, transport=httpx.MockTransport(handler)) as c:
        assert c.is_live()

    async def run_async():
        async with AsyncClient("h:1", namespace=namespace, transport=httpx.MockTransport(handler)) as c:
            return await c.is_live()

    assert asyncio.run(run_async())
    assert seen == [expected, expected]
