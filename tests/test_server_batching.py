"""Coalesced runs on a live server: runs that wait while a worker is busy are launched as one batch
with one wait for the device, and each keeps its own outcome.

A gate holds the run worker inside its first batch, so the next requests pile up in the queue; when
it opens they run as one batch (the responses report `batch_size`). Results are checked against
NumPy's own bincount and arithmetic, written here independently of the server."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest
from helpers.service import RAW, GatedEngine, client, put, wait_event
from helpers.service import counts_json as counts_of
from segfuse.server import runs

pytestmark = pytest.mark.anyio

# out = x * 2 and y = x + 1: two stored outputs of one run (committed together or not at all)
TWO_OUTPUTS = {
    "format": "segfuse.fusion/1", "name": "two_outputs",
    "inputs": [{"name": "x", "dtype": "float32", "shape": ["N"]}],
    "ops": [{"op": "mul", "out": "doubled", "inputs": ["x", 2.0]},
            {"op": "add", "out": "plus_one", "inputs": ["x", 1.0]}],
    "outputs": ["doubled", "plus_one"],
}
# a float histogram whose bins are given: a bad index fails the run (and only that run)
WEIGHTED = {
    "format": "segfuse.fusion/1", "name": "weighted_hist",
    "inputs": [{"name": "idx", "dtype": "int64", "shape": ["N"]}, {"name": "w", "dtype": "float32", "shape": ["N"]}],
    "ops": [{"op": "full", "out": "z", "shape": [4], "value": 0.0, "dtype": "float32"},
            {"op": "scatter", "out": "h", "inputs": ["z", "idx", "w"], "dim": 0, "reduce": "add"}],
    "outputs": ["h"],
}


class FirstBatchGate(GatedEngine):
    """Holds the first batch a worker starts until the test opens the gate; later batches pass."""

    def __init__(self, inner):
        super().__init__(inner)
        self.batches: list[int] = []

    def run_batch(self, calls, **kw):
        self.batches.append(len(calls))
        if len(self.batches) == 1:
            return super().run_batch(calls, **kw)
        return self.inner.run_batch(calls, **kw)


@pytest.fixture
def gated(live_server_factory, server_backend):
    server = live_server_factory(backend=server_backend, max_batch=64)
    gate = FirstBatchGate(server.runtime.engine)
    server.runtime.engine = gate
    yield server, gate
    gate.release.set()


async def _queued(server, n: int) -> None:
    """Wait until n runs are admitted (the held one included)."""
    for _ in range(1000):
        if server.runtime.executor.admitted >= n:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"only {server.runtime.executor.admitted} runs admitted")


def _infer(c, model: str, body: dict):
    return asyncio.create_task(c.post(f"/v2/models/{model}/infer", json=body))


async def test_a_failing_run_fails_alone_inside_a_batch(gated, moe_graph):
    server, gate = gated
    async with client(server) as c:
        assert (await c.post("/v2/fusions", json=WEIGHTED)).status_code == 201
        rng = np.random.default_rng(1)
        first = _infer(c, "weighted_hist", {"inputs": [
            {"name": "idx", "shape": [1], "datatype": "INT64", "data": [0]},
            {"name": "w", "shape": [1], "datatype": "FP32", "data": [1.0]}]})
        await wait_event(gate.entered)
        cases = []
        for k in range(12):
            idx = rng.integers(0, 4, 16)
            if k in (3, 8):
                idx[5] = 4 + k  # out of range: this run alone fails
            w = rng.random(16).astype(np.float32)
            cases.append((idx, w, _infer(c, "weighted_hist", {"inputs": [
                {"name": "idx", "shape": [16], "datatype": "INT64", "data": idx.tolist()},
                {"name": "w", "shape": [16], "datatype": "FP32", "data": w.tolist()}]})))
        await _queued(server, 13)
        gate.release.set()
        assert (await first).status_code == 200
        sizes = []
        for k, (idx, w, task) in enumerate(cases):
            r = await task
            if k in (3, 8):
                assert r.status_code == 400, r.text
                assert f"index {4 + k} is out of bounds" in r.json()["error"]
                continue
            assert r.status_code == 200, r.text
            expect = np.zeros(4, np.float32)
            np.add.at(expect, idx, w)
            np.testing.assert_allclose(r.json()["outputs"][0]["data"], expect, rtol=1e-5)
            sizes.append(r.json()["parameters"]["batch_size"])
    assert max(sizes) > 1 and max(gate.batches) > 1  # they really ran as a batch
    assert sum(gate.batches) == 13


async def test_runs_on_a_shared_buffer_keep_their_order(gated, moe_graph):
    """A run writing a buffer and later runs reading it: the readers see the writer's result
    (they wait for its pins), whatever batch each lands in."""
    server, gate = gated
    async with client(server) as c:
        assert (await c.post("/v2/fusions", json=TWO_OUTPUTS)).status_code == 201
        x = np.arange(8, dtype=np.float32)
        await put(c, "o_x", x)
        hold = _infer(c, "two_outputs", {"inputs": [{"name": "x", "parameters": {"buffer": "o_x"}}]})
        await wait_event(gate.entered)
        # write o_y = x + 1, then read o_y three times, then overwrite o_y from o_y (2 * (x + 1))
        write = _infer(c, "two_outputs", {"inputs": [{"name": "x", "parameters": {"buffer": "o_x"}}],
                                          "outputs": [{"name": "plus_one", "parameters": {"buffer": "o_y"}}]})
        await _queued(server, 2)
        reads = []
        for _ in range(3):
            reads.append(_infer(c, "two_outputs", {"inputs": [{"name": "x", "parameters": {"buffer": "o_y"}}],
                                                   "outputs": [{"name": "doubled"}]}))
        await _queued(server, 5)  # the reads arrived (each on its own connection) before the overwrite is sent
        again = _infer(c, "two_outputs", {"inputs": [{"name": "x", "parameters": {"buffer": "o_y"}}],
                                          "outputs": [{"name": "doubled", "parameters": {"buffer": "o_y",
                                                                                         "overwrite": True}}]})
        await asyncio.sleep(0.2)
        gate.release.set()
        assert (await hold).status_code == 200
        assert (await write).status_code == 200
        for t in reads:
            r = await t
            assert r.status_code == 200, r.text
            np.testing.assert_allclose(r.json()["outputs"][0]["data"], (x + 1) * 2)
        assert (await again).status_code == 200
        got = (await c.get("/v2/buffers/o_y", headers={"accept": RAW})).content
        np.testing.assert_allclose(np.frombuffer(got, np.float32), (x + 1) * 2)


async def test_each_run_commits_all_its_outputs_or_none(gated):
    server, gate = gated
    async with client(server) as c:
        assert (await c.post("/v2/fusions", json=TWO_OUTPUTS)).status_code == 201
        assert (await c.post("/v2/fusions", json=WEIGHTED)).status_code == 201
        await put(c, "a_old", np.full(4, 7, np.float32))
        hold = _infer(c, "two_outputs", {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [0]}]})
        await wait_event(gate.entered)
        good = []
        for k in range(4):
            x = np.full(4, k, np.float32)
            good.append((x, _infer(c, "two_outputs", {
                "inputs": [{"name": "x", "shape": [4], "datatype": "FP32", "data": x.tolist()}],
                "outputs": [{"name": "doubled", "parameters": {"buffer": f"a_d{k}"}},
                            {"name": "plus_one", "parameters": {"buffer": f"a_p{k}"}}]})))
        bad = _infer(c, "weighted_hist", {
            "inputs": [{"name": "idx", "shape": [2], "datatype": "INT64", "data": [0, 9]},
                       {"name": "w", "shape": [2], "datatype": "FP32", "data": [1, 1]}],
            "outputs": [{"name": "h", "parameters": {"buffer": "a_old", "overwrite": True}}]})
        await _queued(server, 6)
        gate.release.set()
        assert (await hold).status_code == 200
        assert (await bad).status_code == 400
        for k, (x, t) in enumerate(good):
            assert (await t).status_code == 200
            d = (await c.get(f"/v2/buffers/a_d{k}", headers={"accept": RAW})).content
            p = (await c.get(f"/v2/buffers/a_p{k}", headers={"accept": RAW})).content
            np.testing.assert_allclose(np.frombuffer(d, np.float32), x * 2)
            np.testing.assert_allclose(np.frombuffer(p, np.float32), x + 1)
        old = (await c.get("/v2/buffers/a_old", headers={"accept": RAW})).content
        assert np.frombuffer(old, np.float32).tolist() == [7, 7, 7, 7]  # the failed run changed nothing
        text = (await c.get("/metrics")).text
        assert "segfuse_run_batch_size_count" in text and "segfuse_run_queue_seconds_count" in text


async def test_health_answers_while_a_worker_is_busy(gated, moe_graph):
    server, gate = gated
    async with client(server) as c:
        await c.post("/v2/fusions", json=moe_graph)
        hold = _infer(c, "moe_problem_sizes", {"inputs": [
            {"name": "topk_ids", "shape": [1, 1], "datatype": "INT64", "data": [3]}]})
        await wait_event(gate.entered)
        for _ in range(20):
            assert (await c.get("/v2/health/live")).status_code == 200
        gate.release.set()
        r = await hold
        assert r.json()["outputs"][0]["data"] == counts_of([3])


class WarmRecorder:
    """Says every run is warm (as a GPU engine does for prepared kernels on small inputs) and
    records the size and thread of each batch."""

    def __init__(self, inner):
        self.inner = inner
        self.batches: list[tuple[int, str]] = []

    def is_warm(self, fusion, inputs, bound=None):
        return True

    def run_batch(self, calls, **kw):
        self.batches.append((len(calls), threading.current_thread().name))
        return self.inner.run_batch(calls, **kw)

    def __getattr__(self, name):
        return getattr(self.inner, name)


async def test_warm_runs_run_on_the_event_loop_together(live_server_factory, server_backend, moe_graph):
    server = live_server_factory(backend=server_backend)
    rec = WarmRecorder(server.runtime.engine)
    server.runtime.engine = rec
    async with client(server) as c:
        await c.post("/v2/fusions", json=moe_graph)
        ids = np.random.default_rng(5).integers(0, 16, (64, 2))
        await put(c, "w_ids", ids)
        body = {"inputs": [{"name": "topk_ids", "parameters": {"buffer": "w_ids"}}]}
        r = await c.post("/v2/models/moe_problem_sizes/infer", json=body)
        assert r.json()["parameters"]["batch_size"] == 1 and r.json()["outputs"][0]["data"] == counts_of(ids)
        rs = await asyncio.gather(*(c.post("/v2/models/moe_problem_sizes/infer", json=body) for _ in range(24)))
        assert all(r.status_code == 200 and r.json()["outputs"][0]["data"] == counts_of(ids) for r in rs)
        # small inline data: on the host backend the run is its computation, inline on the loop too;
        # on the GPU it is an upload, which goes to a worker thread
        r = await c.post("/v2/models/moe_problem_sizes/infer", json={
            "inputs": [{"name": "topk_ids", "shape": [1, 1], "datatype": "INT64", "data": [3]}]})
        assert r.json()["outputs"][0]["data"] == counts_of([3])
        # large inline data goes to a worker on either
        big = np.random.default_rng(6).integers(0, 16, (runs.INLINE_REQUEST_DATA_BYTES // 8 + 1, 1))
        r = await c.post("/v2/models/moe_problem_sizes/infer", json={
            "inputs": [{"name": "topk_ids", "shape": list(big.shape), "datatype": "INT64", "data": big.ravel().tolist()}]})
        assert r.json()["outputs"][0]["data"] == counts_of(big)
    threads = [t for _n, t in rec.batches]
    assert sum(n for n, _t in rec.batches) == 27
    assert not any(t.startswith("segfuse-run") for t in threads[:-2])
    assert threads[-2].startswith("segfuse-run") == (server_backend != "numpy")
    assert threads[-1].startswith("segfuse-run")


class BrokenWarm(WarmRecorder):
    def run_batch(self, calls, **kw):
        raise RuntimeError("a bug in the engine")


async def test_a_failing_batch_on_the_loop_answers_and_releases(live_server_factory, server_backend, moe_graph):
    server = live_server_factory(backend=server_backend)
    server.runtime.engine = BrokenWarm(server.runtime.engine)
    async with client(server) as c:
        await c.post("/v2/fusions", json=moe_graph)
        await put(c, "b_ids", np.array([[1, 2]], np.int64))
        r = await c.post("/v2/models/moe_problem_sizes/infer", json={
            "inputs": [{"name": "topk_ids", "parameters": {"buffer": "b_ids"}}],
            "outputs": [{"name": "counts", "parameters": {"buffer": "b_out"}}]})
        assert r.status_code == 500 and "a bug in the engine" in r.json()["error"]
        assert server.runtime.executor.admitted == 0 and server.runtime.store.pinned("b_ids") == (0, False)
        assert (await c.get("/v2/buffers/b_out")).status_code == 404
        assert (await c.delete("/v2/buffers/b_ids")).status_code == 200  # no pin left behind


class BrokenBatches:
    """An engine whose batches fail as a whole (a bug), off the event loop: no run is warm."""

    def __init__(self, inner):
        self.inner = inner
        self.batches: list[int] = []

    def run_batch(self, calls, **kw):
        self.batches.append(len(calls))
        raise RuntimeError("a bug in the batch")

    def __getattr__(self, name):
        return getattr(self.inner, name)


async def test_a_failing_batch_on_a_worker_answers_every_run_and_releases(gated, moe_graph):
    server, gate = gated
    async with client(server) as c:
        await c.post("/v2/fusions", json=moe_graph)
        await put(c, "k_ids", np.array([[1, 2]], np.int64))
        hold = _infer(c, "moe_problem_sizes", {"inputs": [
            {"name": "topk_ids", "shape": [1, 1], "datatype": "INT64", "data": [3]}]})
        await wait_event(gate.entered)  # the worker is held: the next runs wait in the queue together
        server.runtime.engine = broken = BrokenBatches(gate)
        waiting = [_infer(c, "moe_problem_sizes", {
            "inputs": [{"name": "topk_ids", "parameters": {"buffer": "k_ids"}}],
            "outputs": [{"name": "counts", "parameters": {"buffer": f"k_out{k}"}}]}) for k in range(3)]
        await _queued(server, 4)
        gate.release.set()
        assert (await hold).json()["outputs"][0]["data"] == counts_of([3])
        for r in await asyncio.gather(*waiting):
            assert r.status_code == 500 and "a bug in the batch" in r.json()["error"]
        assert broken.batches == [3]  # the three waited in the queue and failed as one batch
        assert server.runtime.executor.admitted == 0 and server.runtime.store.pinned("k_ids") == (0, False)
        for k in range(3):
            assert (await c.get(f"/v2/buffers/k_out{k}")).status_code == 404
        assert (await c.delete("/v2/buffers/k_ids")).status_code == 200  # no pin left behind
