"""The REST service on a real uvicorn server (loopback, free port): concurrency, pins, and a failed
run leaving buffers alone. Parametrized over the backend: NumPy here, CuPy where a GPU is visible
(marker `gpu`)."""

from __future__ import annotations

import asyncio
import io
import json

import numpy as np
import pytest
from helpers.service import RAW, GatedEngine, client, put, wait_event

pytestmark = pytest.mark.anyio

@pytest.fixture
def gate(live_server):
    rt = live_server.runtime
    g = GatedEngine(rt.engine)
    rt.engine = g
    yield g
    g.release.set()
    rt.engine = g.inner


async def get(c, name) -> np.ndarray:
    r = await c.get(f"/v2/buffers/{name}")
    assert r.status_code == 200, r.text
    return np.load(io.BytesIO(r.content))


async def snapshot(c) -> dict[str, bytes]:
    names = [b["name"] for b in (await c.get("/v2/buffers")).json()["buffers"]]
    out = {}
    for n in names:
        r = await c.get(f"/v2/buffers/{n}", headers={"accept": RAW})
        out[n] = (r.headers["x-segfuse-dtype"], r.headers["x-segfuse-shape"], r.content)
    return out


def counts_of(ids) -> list[int]:
    return np.bincount(np.asarray(ids).reshape(-1), minlength=16).tolist()


async def test_32_concurrent_clients_run_and_rerun(live_server, moe_graph, chain_graph):
    """Each client keeps its own buffers, runs two fusions many times, buffered and inline, and
    checks every result against NumPy."""
    n_clients, rounds = 32, 3

    async def one_client(k: int) -> int:
        rng = np.random.default_rng(k)
        checked = 0
        async with client(live_server) as c:
            for graph in (moe_graph, chain_graph):
                r = await c.post("/v2/fusions", json=graph)
                assert r.status_code in (200, 201), r.text
            for rnd in range(rounds):
                ids = rng.integers(0, 16, (int(rng.integers(1, 300)), 8))
                await put(c, f"ids_{k}", ids)
                r = await c.post("/v2/models/moe_problem_sizes/infer", json={
                    "id": f"{k}-{rnd}",
                    "inputs": [{"name": "topk_ids", "parameters": {"buffer": f"ids_{k}"}}],
                    "outputs": [{"name": "counts", "parameters": {"buffer": f"counts_{k}", "overwrite": True}}]})
                assert r.status_code == 200, r.text
                assert r.json()["id"] == f"{k}-{rnd}"
                assert (await get(c, f"counts_{k}")).tolist() == counts_of(ids)
                # the same fusion inline, binary both ways
                ids2 = rng.integers(0, 16, (64, 2))
                head = json.dumps({"inputs": [{"name": "topk_ids", "shape": [64, 2], "datatype": "INT64",
                                               "parameters": {"binary_data_size": ids2.nbytes}}],
                                   "parameters": {"binary_data_output": True}}).encode()
                r = await c.post("/v2/models/moe_problem_sizes/infer", content=head + ids2.tobytes(),
                                 headers={"inference-header-content-length": str(len(head))})
                n = int(r.headers["inference-header-content-length"])
                assert np.frombuffer(r.content[n:], np.int64).tolist() == counts_of(ids2)
                # a float fusion on buffers
                a, b, cc = (rng.standard_normal(100).astype(np.float32) for _ in range(3))
                for name, v in (("a", a), ("b", b), ("c", cc)):
                    await put(c, f"{name}_{k}", v)
                r = await c.post("/v2/models/elementwise_chain/infer", json={
                    "inputs": [{"name": n, "parameters": {"buffer": f"{n}_{k}"}} for n in "abc"]})
                expect = np.where(a > 0, a * b + cc, np.exp(cc) * np.float32(0.5))
                np.testing.assert_allclose(r.json()["outputs"][0]["data"], expect, rtol=2e-6, atol=1e-6)
                checked += 3
        return checked

    results = await asyncio.gather(*(one_client(k) for k in range(n_clients)))
    assert sum(results) == n_clients * rounds * 3
    async with client(live_server) as c:
        names = {b["name"] for b in (await c.get("/v2/buffers")).json()["buffers"]}
        assert {f"counts_{k}" for k in range(n_clients)} <= names
        for k in range(n_clients):
            for n in ("ids", "counts", "a", "b", "c"):
                assert (await c.delete(f"/v2/buffers/{n}_{k}")).status_code == 200


async def test_failed_runs_leave_every_buffer_byte_identical(live_server, moe_graph, scatter_add_graph):
    async with client(live_server) as c:
        await c.post("/v2/fusions", json=moe_graph)
        await c.post("/v2/fusions", json=scatter_add_graph)
        await put(c, "f_ids", np.array([[1, 2], [3, 99]], np.int64))  # 99: out of range for 16 experts
        await put(c, "f_ids32", np.array([[1, 2], [3, 4]], np.int32))
        await put(c, "f_counts", np.arange(16, dtype=np.int64))
        await put(c, "f_dst", np.arange(8, dtype=np.float32))
        await put(c, "f_index", np.array([0, 3, 8], np.int64))  # 8: out of range
        await put(c, "f_src", np.array([1, 2, 3], np.float32))
        before = await snapshot(c)

        moe = "/v2/models/moe_problem_sizes/infer"
        out = [{"name": "counts", "parameters": {"buffer": "f_counts", "overwrite": True}}]
        r = await c.post(moe, json={"inputs": [{"name": "topk_ids", "parameters": {"buffer": "f_ids"}}],
                                    "outputs": out})
        assert r.status_code == 400 and "out of bounds" in r.json()["error"]
        r = await c.post(moe, json={"inputs": [{"name": "topk_ids", "parameters": {"buffer": "f_ids32"}}],
                                    "outputs": out})
        assert r.status_code == 400 and "int32" in r.json()["error"]
        r = await c.post(moe, json={"inputs": [{"name": "topk_ids", "parameters": {"buffer": "f_ids"}}],
                                    "outputs": [{"name": "counts", "parameters": {"buffer": "new_counts"}}]})
        assert r.status_code == 400
        # in place: the scatter fails on index 8, dst must not be touched
        r = await c.post("/v2/models/scatter_add/infer", json={
            "inputs": [{"name": "dst", "parameters": {"buffer": "f_dst"}},
                       {"name": "index", "parameters": {"buffer": "f_index"}},
                       {"name": "src", "parameters": {"buffer": "f_src"}}]})
        assert r.status_code == 400 and "out of bounds" in r.json()["error"]
        # in place with a wrong-dtype src
        r = await c.post("/v2/models/scatter_add/infer", json={
            "inputs": [{"name": "dst", "parameters": {"buffer": "f_dst"}},
                       {"name": "index", "shape": [1], "datatype": "INT64", "data": [0]},
                       {"name": "src", "shape": [1], "datatype": "FP64", "data": [1.0]}]})
        assert r.status_code == 400
        assert await snapshot(c) == before
        for n in before:
            await c.delete(f"/v2/buffers/{n}")


async def test_delete_during_run_waits_then_succeeds(live_server, moe_graph, gate):
    async with client(live_server) as c:
        await c.post("/v2/fusions", json=moe_graph)
        ids = np.array([[1, 1], [2, 5]], np.int64)
        await put(c, "d_ids", ids)
        run = asyncio.create_task(c.post("/v2/models/moe_problem_sizes/infer", json={
            "inputs": [{"name": "topk_ids", "parameters": {"buffer": "d_ids"}}],
            "outputs": [{"name": "counts", "parameters": {"buffer": "d_counts", "return_data": True}}]}))
        await wait_event(gate.entered)
        delete = asyncio.create_task(c.delete("/v2/buffers/d_ids"))
        overwrite = asyncio.create_task(c.put("/v2/buffers/d_counts", content=b"\0" * 8,
                                              headers={"content-type": RAW}, params={"dtype": "int64", "shape": "1"}))
        reader = asyncio.create_task(c.get("/v2/buffers/d_ids", headers={"accept": RAW}))
        await asyncio.sleep(0.3)
        assert not delete.done() and not overwrite.done()  # both wait for the run's pins
        readers, writer = live_server.runtime.store.pinned("d_ids")
        assert readers >= 1 and not writer
        gate.release.set()
        r = await run
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == counts_of(ids)
        assert (await delete).status_code == 200
        assert (await overwrite).status_code == 200  # replaced the run's output, after the run
        rr = await reader
        # the reader ran before the DELETE (it is older) or after it; never a partial buffer
        assert rr.status_code == 404 or rr.content == ids.tobytes()
        assert (await c.get("/v2/buffers/d_ids")).status_code == 404
        assert (await c.get("/v2/buffers/d_counts", headers={"accept": RAW})).content == b"\0" * 8
        await c.delete("/v2/buffers/d_counts")


async def test_reader_waits_for_inplace_run(live_server, scatter_add_graph, gate):
    async with client(live_server) as c:
        await c.post("/v2/fusions", json=scatter_add_graph)
        dst = np.zeros(4, np.float32)
        await put(c, "g_dst", dst)
        run = asyncio.create_task(c.post("/v2/models/scatter_add/infer", json={
            "inputs": [{"name": "dst", "parameters": {"buffer": "g_dst"}},
                       {"name": "index", "shape": [2], "datatype": "INT64", "data": [1, 1]},
                       {"name": "src", "shape": [2], "datatype": "FP32", "data": [2.0, 3.0]}],
            "outputs": [{"name": "dst_updated", "parameters": {"buffer": "g_dst"}}]}))
        await wait_event(gate.entered)
        reader = asyncio.create_task(get(c, "g_dst"))
        await asyncio.sleep(0.2)
        assert not reader.done()
        gate.release.set()
        assert (await run).status_code == 200
        assert (await reader).tolist() == [0, 5, 0, 0]
        await c.delete("/v2/buffers/g_dst")


async def test_run_queue_full_is_429(live_server_factory, moe_graph, server_backend):
    server = live_server_factory(backend=server_backend, max_queued_runs=2)
    g = GatedEngine(server.runtime.engine)
    server.runtime.engine = g
    body = {"inputs": [{"name": "topk_ids", "shape": [1, 1], "datatype": "INT64", "data": [3]}]}
    try:
        async with client(server) as c:
            await c.post("/v2/fusions", json=moe_graph)
            first = [asyncio.create_task(c.post("/v2/models/moe_problem_sizes/infer", json=body)) for _ in range(2)]
            await wait_event(g.entered)
            while server.runtime.executor.admitted < 2:
                await asyncio.sleep(0.01)
            r = await c.post("/v2/models/moe_problem_sizes/infer", json=body)
            assert r.status_code == 429 and r.headers["retry-after"] == "1"
            assert set(r.json()) == {"error", "details"} and "too many runs" in r.json()["error"]
            g.release.set()
            assert [(await t).status_code for t in first] == [200, 200]
            assert (await c.post("/v2/models/moe_problem_sizes/infer", json=body)).status_code == 200
    finally:
        g.release.set()


async def test_auth_on_live_server(live_server_factory, server_backend):
    server = live_server_factory(backend=server_backend, token="tok")
    async with client(server) as c:
        assert (await c.get("/v2/health/ready")).status_code == 200
        assert (await c.get("/v2")).status_code == 401
        assert (await c.get("/v2", headers={"authorization": "Bearer tok"})).json()["backend"] == server_backend


async def test_metadata_names_backend(live_server, server_backend):
    async with client(live_server) as c:
        meta = (await c.get("/v2")).json()
        assert meta["backend"] == server_backend
        assert meta["device"] == ("cpu" if server_backend == "numpy" else "cuda:0")
