"""Registered fusions are bounded (issue 17, item 6: count and bytes, 413, and their bytes in the
metrics), and plan requests are admitted like runs (item 5: 429 when the queue is full)."""

from __future__ import annotations

import asyncio
import copy

import pytest
from helpers.service import GatedEngine, client, wait_event

pytestmark = pytest.mark.anyio


def _graph(base: dict, k: int) -> dict:
    g = copy.deepcopy(base)
    g["name"] = f"g{k}"
    g["ops"][1]["shape"] = [4 + k]  # another graph (another content hash) per k
    return g


async def test_fusion_count_limit(asgi_server, moe_graph):
    async with asgi_server(max_fusions=3) as c:
        for k in range(3):
            assert (await c.post("/v2/fusions", json=_graph(moe_graph, k))).status_code == 201
        r = await c.post("/v2/fusions", json=_graph(moe_graph, 3))
        assert r.status_code == 413 and "the limit is 3" in r.json()["error"]
        assert r.json()["details"][0]["loc"] == ["graph"]
        assert (await c.post("/v2/fusions", json=_graph(moe_graph, 1))).status_code == 200  # the same graph again
        assert (await c.post("/v2/fusions", json={**_graph(moe_graph, 4), "name": "g0"},
                             params={"replace": "true"})).status_code == 201  # a replacement takes no room
        assert (await c.delete("/v2/fusions/g2")).status_code == 200
        assert (await c.post("/v2/fusions", json=_graph(moe_graph, 5))).status_code == 201
        assert len((await c.get("/v2/fusions")).json()["fusions"]) == 3


async def test_fusion_bytes_limit_and_metric(asgi_server, moe_graph):
    from segfuse.compiler import Fusion
    from segfuse.server.fusions import graph_bytes

    one = graph_bytes(Fusion.from_json(_graph(moe_graph, 0)))
    async with asgi_server(max_fusion_bytes=2 * one + one // 2) as c:
        assert (await c.post("/v2/fusions", json=_graph(moe_graph, 0))).status_code == 201
        assert (await c.post("/v2/fusions", json=_graph(moe_graph, 1))).status_code == 201
        r = await c.post("/v2/fusions", json=_graph(moe_graph, 2))
        assert r.status_code == 413 and "bytes" in r.json()["error"]
        text = (await c.get("/metrics")).text
        held = sum(graph_bytes(Fusion.from_json(_graph(moe_graph, k))) for k in range(2))
        assert f"segfuse_fusion_bytes {float(held)}" in text


async def test_plan_requests_are_admitted_like_runs(live_server_factory, moe_graph):
    server = live_server_factory(backend="numpy", max_queued_runs=1)
    gate = GatedEngine(server.runtime.engine)
    server.runtime.engine = gate
    async with client(server) as c:
        await c.post("/v2/fusions", json=moe_graph)
        run = asyncio.create_task(c.post("/v2/models/moe_problem_sizes/infer", json={
            "inputs": [{"name": "topk_ids", "shape": [1, 1], "datatype": "INT64", "data": [3]}]}))
        await wait_event(gate.entered)
        r = await c.get("/v2/fusions/moe_problem_sizes/plan", params={"shape": "T=8,K=2"})
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        gate.release.set()
        assert (await run).status_code == 200
        r = await c.get("/v2/fusions/moe_problem_sizes/plan", params={"shape": "T=8,K=2"})
        assert r.status_code == 200, r.text
        assert server.runtime.executor.admitted == 0
