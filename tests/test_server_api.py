"""The REST service in-process (httpx on the ASGI app, lifespan run): every endpoint, every error
status with its body, auth, limits, the binary extension, metrics, OpenAPI. Tests that run fusions
are parametrized over the backend (`server_backend`: NumPy; CuPy where a GPU is visible, marker gpu)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from helpers.graphs import counts_of
from helpers.service import NPY, RAW, assert_error, put_raw

pytestmark = pytest.mark.anyio

def npy_bytes(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


async def get_raw(c, name: str) -> np.ndarray:
    r = await c.get(f"/v2/buffers/{name}", headers={"accept": NPY})
    assert r.status_code == 200, r.text
    return np.load(io.BytesIO(r.content))


# ---- health and metadata ------------------------------------------------------------------
async def test_health_and_server_metadata(asgi_server):
    async with asgi_server() as c:
        assert (await c.get("/v2/health/live")).status_code == 200
        assert (await c.get("/v2/health/ready")).status_code == 200
        meta = (await c.get("/v2")).json()
        assert meta["name"] == "segfuse" and meta["backend"] == "numpy" and meta["device"] == "cpu"
        assert "binary_tensor_data" in meta["extensions"] and meta["version"]


async def test_not_ready_until_backend_initialised():
    """Without the lifespan the backend never starts: live, but 503 where the backend is needed."""
    import httpx
    from segfuse.server import create_app
    from segfuse.server.settings import Settings

    app = create_app(Settings(backend="numpy"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
        assert (await c.get("/v2/health/live")).status_code == 200
        assert_error(await c.get("/v2/health/ready"), 503, "not ready")
        assert_error(await c.get("/v2/buffers"), 503, "not ready")
        r = await c.post("/v2/models/x/infer", json={"inputs": []})
        assert_error(r, 503)


# ---- buffers ------------------------------------------------------------------------------
async def test_buffer_put_get_list_delete_in_every_format(asgi_server):
    a = np.arange(12, dtype=np.int64).reshape(3, 4)
    async with asgi_server() as c:
        r = await put_raw(c, "ids_0", a)
        assert r.status_code == 201 and r.json()["created"] is True
        assert r.json()["buffer"] == {"name": "ids_0", "dtype": "int64", "datatype": "INT64", "shape": [3, 4],
                                      "bytes": 96, "device": "cpu"}
        r = await c.put("/v2/buffers/f.1", content=npy_bytes(np.ones((2, 2), np.float32)),
                        headers={"content-type": NPY})
        assert r.status_code == 201
        r = await c.put("/v2/buffers/b-2", json={"dtype": "BOOL", "shape": [3], "data": [True, False, True]})
        assert r.status_code == 201 and r.json()["buffer"]["dtype"] == "bool"
        # replacing is 200 and created=false
        r = await c.put("/v2/buffers/b-2", json={"dtype": "bool", "shape": [2], "data": [False, True]})
        assert r.status_code == 200 and r.json()["created"] is False

        # GET: .npy by default, raw or JSON on request
        r = await c.get("/v2/buffers/ids_0")
        assert r.headers["content-type"] == NPY
        np.testing.assert_array_equal(np.load(io.BytesIO(r.content)), a)
        r = await c.get("/v2/buffers/ids_0", headers={"accept": RAW})
        assert r.headers["content-type"] == RAW and r.headers["x-segfuse-dtype"] == "int64"
        assert r.headers["x-segfuse-shape"] == "3,4" and r.content == a.tobytes()
        r = await c.get("/v2/buffers/ids_0", headers={"accept": "application/json"})
        assert r.json() == {"name": "ids_0", "dtype": "int64", "shape": [3, 4], "data": list(range(12))}
        r = await c.get("/v2/buffers/b-2", headers={"accept": f"{RAW}, {NPY};q=0.5"})
        assert r.content == b"\x00\x01"

        listing = (await c.get("/v2/buffers")).json()
        assert [b["name"] for b in listing["buffers"]] == ["b-2", "f.1", "ids_0"]
        assert listing["total_bytes"] == 96 + 16 + 2

        assert (await c.delete("/v2/buffers/ids_0")).json() == {"deleted": "ids_0"}
        assert_error(await c.get("/v2/buffers/ids_0"), 404, "ids_0")
        assert_error(await c.delete("/v2/buffers/ids_0"), 404, "ids_0")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "uint8", "int8", "int16", "int32", "float64"])
async def test_buffer_raw_round_trip_dtypes(asgi_server, dtype):
    from segfuse.compiler.dtypes import DType

    a = (np.arange(6) - 2).astype(DType(dtype).np).reshape(2, 3) if dtype != "uint8" else np.arange(6, dtype=np.uint8)
    async with asgi_server() as c:
        r = await c.put("/v2/buffers/x", content=a.tobytes(), headers={"content-type": RAW},
                        params={"dtype": dtype, "shape": ",".join(map(str, a.shape))})
        assert r.status_code == 201, r.text
        r = await c.get("/v2/buffers/x", headers={"accept": RAW})
        assert r.content == a.tobytes() and r.headers["x-segfuse-dtype"] == dtype


async def test_buffer_errors(asgi_server):
    async with asgi_server() as c:
        assert_error(await c.put("/v2/buffers/bad name!", content=b"", headers={"content-type": RAW}), 400)
        assert_error(await c.put("/v2/buffers/" + "x" * 129, content=b"", headers={"content-type": RAW}), 400)
        assert_error(await c.put("/v2/buffers/x", content=b"1234", headers={"content-type": RAW}), 400, "dtype")
        r = await c.put("/v2/buffers/x", content=b"123", headers={"content-type": RAW},
                        params={"dtype": "int64", "shape": "1"})
        assert_error(r, 400, "3 bytes given", "needs 8")
        r = await c.put("/v2/buffers/x", content=b"12345678", headers={"content-type": RAW},
                        params={"dtype": "complex64", "shape": "1"})
        assert_error(r, 400, "unknown datatype")
        r = await c.put("/v2/buffers/x", content=b"12345678", headers={"content-type": RAW},
                        params={"dtype": "int64", "shape": "a,b"})
        assert_error(r, 400, "shape")
        assert_error(await c.put("/v2/buffers/x", content=b"not npy", headers={"content-type": NPY}), 400, ".npy")
        assert_error(await c.put("/v2/buffers/x", content=b"x", headers={"content-type": "text/plain"}), 400,
                     "Content-Type")
        assert_error(await c.put("/v2/buffers/x", content=b"{", headers={"content-type": "application/json"}),
                     400, "JSON")
        r = await c.put("/v2/buffers/x", json={"dtype": "int64", "shape": [2], "data": [1, 2, 3]})
        assert_error(r, 400, "3 elements")
        r = await c.put("/v2/buffers/x", json={"dtype": "int64", "shape": "2", "data": [1, 2]})
        assert_error(r, 400, "shape")
        r = await c.put("/v2/buffers/x", json={"dtype": "int8", "shape": [1], "data": [300]})
        assert_error(r, 400, "INT8")
        r = await c.put("/v2/buffers/x", json={"dtype": "int64", "shape": [1], "data": [1.5]})
        assert_error(r, 400, "non-integer")
        assert_error(await c.put("/v2/buffers/x", content=npy_bytes(np.array(["a"])),
                                 headers={"content-type": NPY}), 400, "unsupported dtype")
        assert (await c.get("/v2/buffers")).json()["buffers"] == []


# ---- fusions ------------------------------------------------------------------------------
async def test_fusion_register_idempotent_conflict_replace(asgi_server, moe_graph):
    async with asgi_server() as c:
        r = await c.post("/v2/fusions", json=moe_graph)
        assert r.status_code == 201
        first = r.json()
        assert first["name"] == "moe_problem_sizes" and len(first["id"]) == 20 and first["created"] is True
        assert first["inputs"] == [{"name": "topk_ids", "datatype": "INT64", "shape": [-1, -1]}]
        assert first["outputs"] == [{"name": "counts", "datatype": "INT64", "shape": [16]}]
        assert first["symbols"] == ["K", "T"]

        r = await c.post("/v2/fusions", json=moe_graph)
        assert r.status_code == 200 and r.json()["id"] == first["id"] and r.json()["created"] is False
        # curl -d sends form-encoded content type: the body is JSON all the same
        r = await c.post("/v2/fusions", content=json.dumps(moe_graph),
                         headers={"content-type": "application/x-www-form-urlencoded"})
        assert r.status_code == 200 and r.json()["id"] == first["id"]

        other = json.loads(json.dumps(moe_graph))
        other["ops"][1]["shape"] = [32]
        assert_error(await c.post("/v2/fusions", json=other), 409, "moe_problem_sizes", "replace=true")
        r = await c.post("/v2/fusions", json=other, params={"replace": "true"})
        assert r.status_code == 201 and r.json()["replaced"] == first["id"] and r.json()["id"] != first["id"]
        assert_error(await c.get(f"/v2/fusions/{first['id']}"), 404)

        listing = (await c.get("/v2/fusions")).json()["fusions"]
        assert [f["id"] for f in listing] == [r.json()["id"]]
        detail = (await c.get("/v2/fusions/moe_problem_sizes")).json()
        assert detail["graph"]["ops"][1]["shape"] == [32]
        assert (await c.get(f"/v2/fusions/{detail['id']}")).json()["name"] == "moe_problem_sizes"
        assert (await c.delete(f"/v2/fusions/{detail['id']}")).json() == {"deleted": detail["id"]}
        assert_error(await c.get("/v2/fusions/moe_problem_sizes"), 404, "moe_problem_sizes")
        assert_error(await c.delete(f"/v2/fusions/{detail['id']}"), 404)


async def test_fusion_invalid_graph_errors(asgi_server, moe_graph):
    async with asgi_server(max_ops=3, max_rank=2) as c:
        bad = json.loads(json.dumps(moe_graph))
        bad["ops"] = bad["ops"][:3]
        bad["ops"][0]["inputs"] = ["nope"]
        body = assert_error(await c.post("/v2/fusions", json=bad), 400, "unknown tensor 'nope'")
        assert body["details"][0]["loc"] == ["ops", 0, "inputs", 0]
        assert_error(await c.post("/v2/fusions", json={"ops": []}), 400, "outputs")
        assert_error(await c.post("/v2/fusions", json=moe_graph), 413, "4 ops exceed the limit of 3")
        deep = {"name": "deep", "inputs": [{"name": "x", "dtype": "int64", "shape": [1, 1, 1]}],
                "ops": [], "outputs": ["x"]}
        assert_error(await c.post("/v2/fusions", json=deep), 413, "rank 3")
        assert_error(await c.post("/v2/fusions", content=b"{not json", headers={"content-type": "application/json"}),
                     400)
        assert_error(await c.post("/v2/fusions", json=[1, 2]), 400)


async def test_plan_endpoint(asgi_server, moe_graph):
    from segfuse.compiler import Engine

    async with asgi_server() as c:
        fid = (await c.post("/v2/fusions", json=moe_graph)).json()["id"]
        assert_error(await c.get("/v2/fusions/nope/plan", params={"shape": "T=4,K=2"}), 404)
        assert_error(await c.get(f"/v2/fusions/{fid}/plan", params={"shape": "T"}), 400, "T=4096")
        assert_error(await c.get(f"/v2/fusions/{fid}/plan", params={"shape": "T=4"}), 400, "K")
        assert_error(await c.get(f"/v2/fusions/{fid}/plan", params={"shape": "T=4,K=2,Q=1"}), 400, "Q")
        r = await c.get(f"/v2/fusions/{fid}/plan", params={"shape": "T=4096,K=8"})
        if hasattr(Engine, "plan"):
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["symbols"] == {"T": 4096, "K": 8} and body["shapes"] == {"topk_ids": [4096, 8]}
            assert body["plan"]["segments"] and all("reason" in s for s in body["plan"]["segments"])
            kernels = body["kernels"]
            assert len(kernels) == len(body["plan"]["segments"])
            assert all(k["source"] or k["unavailable"] for k in kernels)
            assert any("__global__" in (k["source"] or "") and k["kernels"] for k in kernels)
            r = await c.get(f"/v2/fusions/{fid}/plan", params={"shape": "T=4096,K=8", "source": "false"})
            assert r.json()["kernels"] == [] and r.json()["plan"] == body["plan"]
        else:
            assert_error(r, 501, "no planner")


# ---- inference ----------------------------------------------------------------------------
async def test_infer_inline_buffers_and_both(asgi_server, server_backend, moe_graph):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 16, (64, 4))
    async with asgi_server(backend=server_backend) as c:
        await c.post("/v2/fusions", json=moe_graph)
        r = await c.post("/v2/models/moe_problem_sizes/infer", json={
            "id": "req-1", "inputs": [{"name": "topk_ids", "shape": [64, 4], "datatype": "INT64",
                                       "data": ids.tolist()}]})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["model_name"] == "moe_problem_sizes" and body["id"] == "req-1"
        (out,) = body["outputs"]
        assert out["name"] == "counts" and out["shape"] == [16] and out["datatype"] == "INT64"
        assert out["data"] == counts_of(ids).tolist()
        p = body["parameters"]
        assert set(p["timings_us"]) >= {"plan", "compile", "run", "queue", "total"}
        assert p["cache_hits"] >= 0 and p["cache_misses"] >= 0 and len(p["fusion_id"]) == 20

        # buffer in, buffer out: stays on the server, no data in the response
        assert (await put_raw(c, "ids_0", ids)).status_code == 201
        r = await c.post(f"/v2/models/{p['fusion_id']}/infer", json={
            "inputs": [{"name": "topk_ids", "parameters": {"buffer": "ids_0"}}],
            "outputs": [{"name": "counts", "parameters": {"buffer": "counts_0"}}]})
        assert r.status_code == 200, r.text
        (out,) = r.json()["outputs"]
        assert out == {"name": "counts", "shape": [16], "datatype": "INT64", "parameters": {"buffer": "counts_0"}}
        np.testing.assert_array_equal(await get_raw(c, "counts_0"), counts_of(ids))

        # both: stored and returned; an existing buffer is replaced only with overwrite
        req = {"inputs": [{"name": "topk_ids", "shape": [2, 2], "datatype": "INT64", "data": [1, 1, 2, 3]}],
               "outputs": [{"name": "counts", "parameters": {"buffer": "counts_0", "return_data": True}}]}
        assert_error(await c.post("/v2/models/moe_problem_sizes/infer", json=req), 409, "counts_0", "overwrite")
        np.testing.assert_array_equal(await get_raw(c, "counts_0"), counts_of(ids))
        req["outputs"][0]["parameters"]["overwrite"] = True
        r = await c.post("/v2/models/moe_problem_sizes/infer", json=req)
        assert r.status_code == 200 and r.json()["outputs"][0]["data"][:4] == [0, 2, 1, 1]
        np.testing.assert_array_equal(await get_raw(c, "counts_0"), counts_of(np.array([1, 1, 2, 3])))

        # declared shape/datatype of a buffer input must agree with the buffer
        r = await c.post("/v2/models/moe_problem_sizes/infer", json={
            "inputs": [{"name": "topk_ids", "datatype": "INT32", "parameters": {"buffer": "ids_0"}}]})
        assert_error(r, 400, "INT32", "ids_0")

        meta = (await c.get("/v2/models/moe_problem_sizes")).json()
        assert meta["inputs"] == [{"name": "topk_ids", "datatype": "INT64", "shape": [-1, -1]}]
        assert meta["outputs"] == [{"name": "counts", "datatype": "INT64", "shape": [16]}]
        assert meta["platform"] == "segfuse" and meta["id"] == p["fusion_id"]
        assert (await c.get("/v2/models/moe_problem_sizes/ready")).status_code == 200
        assert_error(await c.get("/v2/models/nope"), 404)


async def test_infer_errors(asgi_server, server_backend, moe_graph):
    async with asgi_server(backend=server_backend, max_rank=3) as c:
        await c.post("/v2/fusions", json=moe_graph)
        url = "/v2/models/moe_problem_sizes/infer"

        def inline(**kw):
            t = {"name": "topk_ids", "shape": [2, 2], "datatype": "INT64", "data": [1, 2, 3, 4]}
            t.update(kw)
            return {"inputs": [t]}

        assert_error(await c.post("/v2/models/nope/infer", json=inline()), 404, "nope")
        body = assert_error(await c.post(url, json=inline(data=[1, 2, 3, 99])), 400, "index 99", "out of bounds")
        assert body["details"][0]["loc"][:2] == ["ops", 3]
        assert_error(await c.post(url, json=inline(datatype="INT32")), 400, "int32", "int64")
        assert_error(await c.post(url, json=inline(shape=[4], data=[1, 2, 3, 4])), 400, "rank 1")
        assert_error(await c.post(url, json=inline(shape=[1, 1, 1, 4])), 413, "rank 4")
        assert_error(await c.post(url, json=inline(data=[1, 2, 3])), 400, "3 elements")
        assert_error(await c.post(url, json=inline(datatype="STRING")), 400, "unknown datatype")
        assert_error(await c.post(url, json=inline(datatype=None)), 400, "datatype")
        assert_error(await c.post(url, json={"inputs": []}), 400, "missing input")
        two = inline()
        two["inputs"].append(dict(two["inputs"][0]))
        assert_error(await c.post(url, json=two), 400, "twice")
        assert_error(await c.post(url, json=inline(name="other")), 400, "unknown input")
        assert_error(await c.post(url, json=inline(parameters={"buffer": "ids"})), 400, "buffer")
        assert_error(await c.post(url, json={"inputs": [{"name": "topk_ids", "parameters": {"buffer": "nope"}}]}),
                     404, "buffer 'nope'")
        assert_error(await c.post(url, json={"inputs": [{"name": "topk_ids", "parameters": {"buffer": "a b"}}]}),
                     400)
        r = await c.post(url, json={**inline(), "outputs": [{"name": "nope"}]})
        assert_error(r, 400, "not an output")
        r = await c.post(url, json={**inline(), "outputs": [{"name": "counts"}, {"name": "counts"}]})
        assert_error(r, 400, "twice")
        assert_error(await c.post(url, content=b"{oops", headers={"content-type": "application/json"}), 400, "JSON")
        assert_error(await c.post(url, json={"inputs": 3}), 400, "inputs")
        # an unknown top-level field is ignored (as Triton does); inside an input it is refused
        r = await c.post(url, json={**inline(), "bogus": 1})
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == counts_of([1, 2, 3, 4]).tolist(), r.text
        body = assert_error(await c.post(url, json=inline(bogus=1)), 400, "bogus")
        assert body["details"][0]["loc"] == ["body", "inputs", 0, "bogus"]
        assert_error(await c.post(url, json=[1]), 400)


async def test_inplace_alias_updates_the_buffer(asgi_server, server_backend, scatter_add_graph):
    dst = np.arange(8, dtype=np.float32)
    index = np.array([0, 0, 7], dtype=np.int64)
    src = np.array([1, 2, 3], dtype=np.float32)
    async with asgi_server(backend=server_backend) as c:
        await c.post("/v2/fusions", json=scatter_add_graph)
        await put_raw(c, "dst", dst)
        tensors = [{"name": "index", "shape": [3], "datatype": "INT64", "data": index.tolist()},
                   {"name": "src", "shape": [3], "datatype": "FP32", "data": src.tolist()}]
        r = await c.post("/v2/models/scatter_add/infer", json={
            "inputs": [{"name": "dst", "parameters": {"buffer": "dst"}}, *tensors],
            "outputs": [{"name": "dst_updated", "parameters": {"buffer": "dst"}}]})
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["parameters"] == {"buffer": "dst"}
        expect = dst.copy()
        np.add.at(expect, index, src)
        np.testing.assert_array_equal(await get_raw(c, "dst"), expect)
        # outputs omitted: the in-place update happens and the result comes back inline too
        r = await c.post("/v2/models/scatter_add/infer", json={
            "inputs": [{"name": "dst", "parameters": {"buffer": "dst"}}, *tensors]})
        np.add.at(expect, index, src)
        assert r.json()["outputs"][0]["data"] == expect.tolist()
        np.testing.assert_array_equal(await get_raw(c, "dst"), expect)
        # in-place input given inline: refused, the graph's in-place update needs a buffer
        r = await c.post("/v2/models/scatter_add/infer", json={
            "inputs": [{"name": "dst", "shape": [8], "datatype": "FP32", "data": dst.tolist()}, *tensors]})
        assert_error(r, 400, "alias_of", "buffer")
        # an aliased output stored under another name is a copy, not the same memory
        r = await c.post("/v2/models/scatter_add/infer", json={
            "inputs": [{"name": "dst", "parameters": {"buffer": "dst"}}, *tensors],
            "outputs": [{"name": "dst_updated", "parameters": {"buffer": "snapshot"}}]})
        assert r.status_code == 200, r.text
        np.add.at(expect, index, src)
        np.testing.assert_array_equal(await get_raw(c, "snapshot"), expect)
        rt = c.app.state.server_state
        assert not rt.arrays.may_share(rt.store.get("snapshot").array, rt.store.get("dst").array)


async def test_inplace_input_also_read_through_another_input(asgi_server, server_backend, scatter_add_graph):
    """dst and src name the same buffer: src reads the contents from before the update."""
    x = np.array([1, 2, 3, 4], np.float32)
    async with asgi_server(backend=server_backend) as c:
        await c.post("/v2/fusions", json=scatter_add_graph)
        await put_raw(c, "x", x)
        r = await c.post("/v2/models/scatter_add/infer", json={
            "inputs": [{"name": "dst", "parameters": {"buffer": "x"}},
                       {"name": "index", "shape": [4], "datatype": "INT64", "data": [3, 2, 1, 0]},
                       {"name": "src", "parameters": {"buffer": "x"}}],
            "outputs": [{"name": "dst_updated", "parameters": {"buffer": "x"}}]})
        assert r.status_code == 200, r.text
        np.testing.assert_array_equal(await get_raw(c, "x"), x + x[::-1])


async def test_tensors_over_the_buffer_limit_are_refused_before_running(asgi_server):
    huge = {"name": "huge", "inputs": [{"name": "n", "dtype": "int64", "shape": [1]}],
            "ops": [{"op": "full", "out": "big", "shape": [1 << 20], "value": 0, "dtype": "int64"},
                    {"op": "sum", "out": "s", "inputs": ["big"]}],
            "outputs": ["s"]}
    async with asgi_server(max_buffer_bytes=1 << 20) as c:
        r = await c.post("/v2/execute", json={"graph": huge, "inputs": [
            {"name": "n", "shape": [1], "datatype": "INT64", "data": [1]}]})
        assert_error(r, 413, "tensor 'big'", "per tensor")


async def test_execute_registers_and_runs(asgi_server, server_backend, chain_graph):
    a = np.array([1, -1, 2, -3], np.float32)
    b = np.array([2, 2, 2, 2], np.float32)
    cc = np.array([0.5, 0, 1, -1], np.float32)
    async with asgi_server(backend=server_backend) as c:
        tensors = [{"name": n, "shape": [4], "datatype": "FP32", "data": v.tolist()} for n, v in
                   (("a", a), ("b", b), ("c", cc))]
        r = await c.post("/v2/execute", json={"graph": chain_graph, "inputs": tensors})
        assert r.status_code == 200, r.text
        expect = np.where(a > 0, a * b + cc, np.exp(cc) * np.float32(0.5)).astype(np.float32)
        np.testing.assert_allclose(r.json()["outputs"][0]["data"], expect, rtol=1e-6)
        assert [f["name"] for f in (await c.get("/v2/fusions")).json()["fusions"]] == ["elementwise_chain"]
        bad = dict(chain_graph, ops=[{"op": "nope", "out": "x", "inputs": []}])
        body = assert_error(await c.post("/v2/execute", json={"graph": bad, "inputs": tensors}), 400, "unknown op")
        assert body["details"][0]["loc"] == ["graph", "ops", 0, "op"]
        assert_error(await c.post("/v2/execute", json={"inputs": tensors}), 400, "graph")


# ---- binary tensor data extension ---------------------------------------------------------
async def test_binary_extension_both_ways(asgi_server, server_backend, moe_graph, chain_graph):
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 16, (128, 8))
    async with asgi_server(backend=server_backend) as c:
        await c.post("/v2/fusions", json=moe_graph)
        header = json.dumps({"inputs": [{"name": "topk_ids", "shape": [128, 8], "datatype": "INT64",
                                         "parameters": {"binary_data_size": ids.nbytes}}],
                             "parameters": {"binary_data_output": True}}).encode()
        r = await c.post("/v2/models/moe_problem_sizes/infer", content=header + ids.tobytes(),
                         headers={"content-type": RAW, "inference-header-content-length": str(len(header))})
        assert r.status_code == 200, r.text
        n = int(r.headers["inference-header-content-length"])
        head = json.loads(r.content[:n])
        (out,) = head["outputs"]
        assert out["parameters"]["binary_data_size"] == 128 and "data" not in out
        np.testing.assert_array_equal(np.frombuffer(r.content[n:], np.int64), counts_of(ids))

        # per-output binary_data; two binary inputs in order; JSON inputs mixed with binary
        await c.post("/v2/fusions", json=chain_graph)
        a, b = rng.standard_normal(5).astype(np.float32), rng.standard_normal(5).astype(np.float32)
        header = json.dumps({"inputs": [
            {"name": "a", "shape": [5], "datatype": "FP32", "parameters": {"binary_data_size": 20}},
            {"name": "c", "shape": [5], "datatype": "FP32", "data": [0.0] * 5},
            {"name": "b", "shape": [5], "datatype": "FP32", "parameters": {"binary_data_size": 20}}],
            "outputs": [{"name": "out", "parameters": {"binary_data": True}}]}).encode()
        r = await c.post("/v2/models/elementwise_chain/infer", content=header + a.tobytes() + b.tobytes(),
                         headers={"inference-header-content-length": str(len(header))})
        n = int(r.headers["inference-header-content-length"])
        got = np.frombuffer(r.content[n:], np.float32)
        np.testing.assert_allclose(got, np.where(a > 0, a * b, np.float32(0.5)), rtol=1e-6)

        # malformed framing is 400
        url = "/v2/models/moe_problem_sizes/infer"
        assert_error(await c.post(url, content=header, headers={"inference-header-content-length": "x"}), 400)
        assert_error(await c.post(url, content=header, headers={"inference-header-content-length": "99999"}), 400)
        short = json.dumps({"inputs": [{"name": "topk_ids", "shape": [2, 2], "datatype": "INT64",
                                        "parameters": {"binary_data_size": 32}}]}).encode()
        r = await c.post(url, content=short + b"\0" * 16, headers={"inference-header-content-length": str(len(short))})
        assert_error(r, 400, "past the end")
        r = await c.post(url, content=short + b"\0" * 40, headers={"inference-header-content-length": str(len(short))})
        assert_error(r, 400, "after the last tensor")
        r = await c.post(url, content=short + b"\0" * 32)  # no header: the body is not JSON
        assert_error(r, 400, "JSON")


# ---- auth ---------------------------------------------------------------------------------
async def test_auth_on(asgi_server, moe_graph):
    async with asgi_server(token="s3cret") as c:
        assert (await c.get("/v2/health/live")).status_code == 200
        assert (await c.get("/v2/health/ready")).status_code == 200
        for method, path in [("GET", "/v2"), ("GET", "/v2/buffers"), ("GET", "/v2/fusions"), ("GET", "/metrics"),
                             ("POST", "/v2/models/x/infer"), ("GET", "/openapi.json"), ("GET", "/nowhere")]:
            r = await c.request(method, path)
            assert_error(r, 401, "missing bearer token")
            assert r.headers["www-authenticate"] == "Bearer"
        assert_error(await c.get("/v2", headers={"authorization": "Bearer wrong"}), 401, "invalid bearer token")
        assert_error(await c.get("/v2", headers={"authorization": "Basic s3cret"}), 401)
        ok = {"authorization": "Bearer s3cret"}
        assert (await c.get("/v2", headers=ok)).status_code == 200
        assert (await c.post("/v2/fusions", json=moe_graph, headers=ok)).status_code == 201
        assert (await c.get("/metrics", headers=ok)).status_code == 200
        schema = (await c.get("/openapi.json", headers=ok)).json()
        assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"


async def test_auth_off(asgi_server):
    async with asgi_server(token=None) as c:
        assert (await c.get("/v2")).status_code == 200
        assert (await c.get("/v2", headers={"authorization": "Bearer anything"})).status_code == 200


# ---- limits -------------------------------------------------------------------------------
async def test_body_size_limit(asgi_server, moe_graph):
    async with asgi_server(max_body_bytes=1024) as c:
        r = await c.put("/v2/buffers/x", content=b"\0" * 2048, headers={"content-type": RAW},
                        params={"dtype": "uint8", "shape": "2048"})
        assert_error(r, 413, "1024")

        async def chunks():  # no Content-Length: counted while read
            for _ in range(4):
                yield b"\0" * 512

        r = await c.put("/v2/buffers/x", content=chunks(), headers={"content-type": RAW},
                        params={"dtype": "uint8", "shape": "2048"})
        assert_error(r, 413, "1024")
        assert (await c.put("/v2/buffers/x", content=b"\0" * 1024, headers={"content-type": RAW},
                            params={"dtype": "uint8", "shape": "1024"})).status_code == 201
        assert (await c.post("/v2/fusions", json=moe_graph)).status_code == 201


async def test_buffer_byte_limits(asgi_server, moe_graph):
    async with asgi_server(max_buffer_bytes=256, max_total_bytes=512, max_rank=2) as c:
        big = np.zeros(33, np.int64)  # 264 bytes
        assert_error(await put_raw(c, "big", big), 413, "256 bytes per buffer")
        assert (await put_raw(c, "a", np.zeros(32, np.int64))).status_code == 201
        assert (await put_raw(c, "b", np.zeros(24, np.int64))).status_code == 201
        assert_error(await put_raw(c, "c", np.zeros(16, np.int64)), 413, "512 bytes for all buffers")
        assert_error(await put_raw(c, "r", np.zeros((1, 1, 1), np.int64)), 413, "rank 3")
        r = await c.put("/v2/buffers/j", json={"dtype": "int64", "shape": [64], "data": [0] * 64})
        assert_error(r, 413, "per buffer")
        # a run whose stored output would exceed the total is refused before running
        await c.post("/v2/fusions", json=moe_graph)
        r = await c.post("/v2/models/moe_problem_sizes/infer", json={
            "inputs": [{"name": "topk_ids", "shape": [1, 1], "datatype": "INT64", "data": [1]}],
            "outputs": [{"name": "counts", "parameters": {"buffer": "counts"}}]})
        assert_error(r, 413, "all buffers")
        assert "counts" not in [b["name"] for b in (await c.get("/v2/buffers")).json()["buffers"]]
        assert (await c.delete("/v2/buffers/b")).status_code == 200
        r = await c.post("/v2/models/moe_problem_sizes/infer", json={
            "inputs": [{"name": "topk_ids", "shape": [1, 1], "datatype": "INT64", "data": [1]}],
            "outputs": [{"name": "counts", "parameters": {"buffer": "counts"}}]})
        assert r.status_code == 200, r.text


# ---- metrics and OpenAPI ------------------------------------------------------------------
async def test_metrics(asgi_server, server_backend, moe_graph):
    async with asgi_server(backend=server_backend) as c:
        await c.post("/v2/fusions", json=moe_graph)
        await put_raw(c, "ids", np.ones((4, 2), np.int64))
        for _ in range(3):
            r = await c.post("/v2/models/moe_problem_sizes/infer", json={
                "inputs": [{"name": "topk_ids", "parameters": {"buffer": "ids"}}]})
            assert r.status_code == 200
        await c.post("/v2/models/moe_problem_sizes/infer", json={
            "inputs": [{"name": "topk_ids", "shape": [1, 1], "datatype": "INT64", "data": [99]}]})
        r = await c.get("/metrics")
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
        text = r.text
        assert 'segfuse_requests_total{endpoint="/v2/models/{model}/infer",method="POST",status="200"} 3.0' in text
        assert 'segfuse_requests_total{endpoint="/v2/models/{model}/infer",method="POST",status="400"} 1.0' in text
        assert "segfuse_run_seconds_count 3.0" in text
        assert 'segfuse_runs_total{outcome="error"} 1.0' in text
        for name in ("segfuse_kernel_cache_hits_total", "segfuse_kernel_cache_misses_total",
                     "segfuse_compiles_total", "segfuse_compile_seconds_total"):
            assert name in text
        assert "segfuse_buffer_bytes 64.0" in text


async def test_engine_extra_timings_and_compile_counts(asgi_server, moe_graph):
    """Backends add their own entries to timings_us (numbers, counts, lists): numbers pass through,
    the compile count goes to kernels_compiled and the metrics, the rest is dropped."""
    from segfuse.compiler import RunResult

    class ReportingEngine:
        def __init__(self, inner):
            self.inner = inner

        def run_batch(self, calls, **kw):  # what the server's run workers call (copies after the batch)
            return [self.run(f, i) for f, i in calls]

        def run(self, fusion, inputs):
            r = self.inner.run(fusion, inputs)
            return RunResult(r.outputs, {**r.timings_us, "compile": 1500.0, "kernel_cache_misses": 2,
                                         "fallbacks": ["x"]}, r.cache_hits, r.cache_misses)

    async with asgi_server() as c:
        rt = c.app.state.server_state
        rt.engine = ReportingEngine(rt.engine)
        await c.post("/v2/fusions", json=moe_graph)
        r = await c.post("/v2/models/moe_problem_sizes/infer", json={
            "inputs": [{"name": "topk_ids", "shape": [1, 1], "datatype": "INT64", "data": [3]}]})
        assert r.status_code == 200, r.text
        p = r.json()["parameters"]
        assert p["kernels_compiled"] == 2 and p["timings_us"]["compile"] == 1500.0
        assert "fallbacks" not in p["timings_us"] and "kernel_cache_misses" not in p["timings_us"]
        text = (await c.get("/metrics")).text
        assert "segfuse_compiles_total 2.0" in text and "segfuse_compile_seconds_total 0.0015" in text

        class WarmEngine(ReportingEngine):  # a cache hit that still reports the old compile time
            def run(self, fusion, inputs):
                r = self.inner.run(fusion, inputs)
                return RunResult(r.outputs, {**r.timings_us, "compile": 1500.0, "kernel_cache_misses": 0}, 1, 0)

        rt.engine = WarmEngine(rt.engine.inner)
        r = await c.post("/v2/models/moe_problem_sizes/infer", json={
            "inputs": [{"name": "topk_ids", "shape": [1, 1], "datatype": "INT64", "data": [3]}]})
        assert r.json()["parameters"]["timings_us"]["compile"] == 0.0
        assert "segfuse_compile_seconds_total 0.0015" in (await c.get("/metrics")).text


async def test_two_apps_in_one_process_have_separate_metrics(asgi_server):
    async with asgi_server() as c1, asgi_server() as c2:
        await c1.get("/v2")
        assert 'endpoint="/v2"' in (await c1.get("/metrics")).text
        assert 'endpoint="/v2"' not in (await c2.get("/metrics")).text


async def test_openapi_is_complete(asgi_server):
    async with asgi_server() as c:
        schema = (await c.get("/openapi.json")).json()
        paths = schema["paths"]
        for path in ["/v2/health/live", "/v2/health/ready", "/v2", "/v2/buffers", "/v2/buffers/{name}",
                     "/v2/fusions", "/v2/fusions/{key}", "/v2/fusions/{key}/plan", "/v2/models/{model}/infer",
                     "/v2/models/{model}", "/v2/execute", "/metrics"]:
            assert path in paths, path
        comps = schema["components"]["schemas"]
        for model in ["InferRequest", "InferResponse", "ExecuteRequest", "InferInput", "ErrorBody", "GraphSpec",
                      "BufferList", "BufferJson", "FusionRegistered", "PlanResponse", "ModelMetadata"]:
            assert model in comps, model
        infer = paths["/v2/models/{model}/infer"]["post"]
        assert infer["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/InferRequest")
        assert infer["responses"]["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorBody")
        assert paths["/v2/fusions"]["post"]["requestBody"]["content"]["application/json"]["schema"][
            "$ref"].endswith("/GraphSpec")
        text = json.dumps(schema)
        for ref in set(__import__("re").findall(r'"#/components/schemas/([^"]+)"', text)):
            assert ref in comps, ref
        assert (await c.get("/docs")).status_code == 200
