"""Repeated small infer bodies reuse their parsed plan (server/parsed_requests.py): the results stay
those of the buffers' contents at each run, a re-registered fusion is used at once, and bodies that
carry data, regions or a timeout are parsed every time. Oracle: np.bincount / NumPy arithmetic."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers.graphs import counts_of
from helpers.service import assert_error, put_raw

pytestmark = pytest.mark.anyio
URL = "/v2/models/moe_problem_sizes/infer"
BODY = json.dumps({"inputs": [{"name": "topk_ids", "parameters": {"buffer": "ids"}}]}).encode()


async def post(c, body: bytes, url: str = URL):
    return await c.post(url, content=body, headers={"content-type": "application/json"})


async def test_a_repeated_body_is_parsed_once_and_reads_the_buffer_of_each_run(asgi_server, server_backend,
                                                                              moe_graph):
    rng = np.random.default_rng(1)
    async with asgi_server(backend=server_backend) as c:
        cache = c.app.state.server_state.parsed_requests
        await c.post("/v2/fusions", json=moe_graph)
        for step in range(4):
            ids = rng.integers(0, 16, (8 * (step + 1), 4))  # new contents and a new shape each step
            assert (await put_raw(c, "ids", ids, overwrite="true")).status_code in (200, 201)
            r = await post(c, BODY)
            assert r.status_code == 200, r.text
            assert r.json()["outputs"][0]["data"] == counts_of(ids).tolist()
        assert (cache.misses, cache.hits) == (1, 3)

        # the buffer gone: the cached plan still fails the run as a fresh parse would
        assert (await c.delete("/v2/buffers/ids")).status_code in (200, 204)
        assert_error(await post(c, BODY), 404, "ids")
        # the same name with another dtype: refused at the run, not served from the cache
        assert (await put_raw(c, "ids", np.zeros((2, 2), np.float32))).status_code == 201
        r = await post(c, BODY)
        assert 400 <= r.status_code < 500, r.text


async def test_a_replaced_fusion_is_not_served_from_the_cache(asgi_server, server_backend, moe_graph):
    ids = np.arange(12).reshape(3, 4) % 16
    async with asgi_server(backend=server_backend) as c:
        await c.post("/v2/fusions", json=moe_graph)
        assert (await put_raw(c, "ids", ids)).status_code == 201
        assert (await post(c, BODY)).json()["outputs"][0]["data"] == counts_of(ids).tolist()
        doubled = json.loads(json.dumps(moe_graph))  # same name and input, counts of 2 per id
        doubled["ops"] = [({**op, "value": 2} if op.get("value") == 1 else op) for op in doubled["ops"]]
        assert any(op.get("value") == 2 for op in doubled["ops"]), doubled
        r = await c.post("/v2/fusions", json=doubled, params={"replace": "true"})
        assert r.status_code in (200, 201), r.text
        r = await post(c, BODY)
        assert r.json()["outputs"][0]["data"] == (2 * counts_of(ids)).tolist()
        # unloaded: 404, although the body was cached for the old fusion
        assert (await c.post("/v2/repository/models/moe_problem_sizes/unload")).status_code == 200
        assert_error(await post(c, BODY), 404)


async def test_bodies_with_data_or_a_timeout_are_parsed_every_time(asgi_server, moe_graph):
    async with asgi_server() as c:
        cache = c.app.state.server_state.parsed_requests
        await c.post("/v2/fusions", json=moe_graph)
        inline = json.dumps({"inputs": [{"name": "topk_ids", "shape": [2, 2], "datatype": "INT64",
                                         "data": [1, 1, 2, 3]}]}).encode()
        for _ in range(2):
            r = await post(c, inline)
            assert r.json()["outputs"][0]["data"] == counts_of(np.array([1, 1, 2, 3])).tolist()
        assert (await put_raw(c, "ids", np.ones((2, 2), np.int64))).status_code == 201
        timed = json.dumps({"inputs": [{"name": "topk_ids", "parameters": {"buffer": "ids"}}],
                            "parameters": {"timeout": 10_000_000}}).encode()
        for _ in range(2):
            assert (await post(c, timed)).json()["outputs"][0]["data"] == counts_of(np.ones((2, 2), int)).tolist()
        assert len(cache) == 0 and cache.hits == 0


async def test_a_bad_body_is_refused_every_time(asgi_server, moe_graph):
    async with asgi_server() as c:
        cache = c.app.state.server_state.parsed_requests
        await c.post("/v2/fusions", json=moe_graph)
        bad = json.dumps({"inputs": [{"name": "topk_ids", "parameters": {"buffer": "../x"}}]}).encode()
        for _ in range(2):
            assert_error(await post(c, bad), 400, "inputs", "buffer")
        assert len(cache) == 0


async def test_a_repeated_body_that_would_overwrite_a_buffer_gets_409(asgi_server, moe_graph):
    """The first run creates its output buffer; the same body again (now a cache hit) must not
    replace it without overwrite, exactly as a freshly parsed body would not."""
    ids = np.arange(8).reshape(2, 4) % 16
    body = json.dumps({"inputs": [{"name": "topk_ids", "parameters": {"buffer": "ids"}}],
                       "outputs": [{"name": "counts", "parameters": {"buffer": "out"}}]}).encode()
    async with asgi_server() as c:
        cache = c.app.state.server_state.parsed_requests
        await c.post("/v2/fusions", json=moe_graph)
        assert (await put_raw(c, "ids", ids)).status_code == 201
        assert (await post(c, body)).status_code == 200
        assert (await put_raw(c, "ids", np.zeros((2, 4), np.int64), overwrite="true")).status_code == 200
        assert_error(await post(c, body), 409, "out", "overwrite")
        assert cache.hits == 1
        r = await c.get("/v2/buffers/out", headers={"accept": "application/json"})
        assert r.json()["data"] == counts_of(ids).tolist()  # the first run's result, untouched


def binary_body(ids: np.ndarray, header: dict | None = None) -> tuple[bytes, dict]:
    """A binary-extension infer body of int64 ids (the tail), and its headers."""
    head = json.dumps(header or {"inputs": [{"name": "topk_ids", "shape": list(ids.shape), "datatype": "INT64",
                                             "parameters": {"binary_data_size": ids.nbytes}}]}).encode()
    return head + ids.astype("<i8").tobytes(), {"content-type": "application/octet-stream",
                                               "inference-header-content-length": str(len(head))}


async def test_a_repeated_binary_header_is_parsed_once_and_each_body_gives_its_own_tensors(asgi_server, moe_graph):
    rng = np.random.default_rng(3)
    async with asgi_server() as c:
        cache = c.app.state.server_state.parsed_requests
        await c.post("/v2/fusions", json=moe_graph)
        for _ in range(4):
            ids = rng.integers(0, 16, (6, 4))  # the same header, new bytes every time
            body, headers = binary_body(ids)
            r = await c.post(URL, content=body, headers=headers)
            assert r.status_code == 200, r.text
            assert r.json()["outputs"][0]["data"] == counts_of(ids).tolist()
        assert (cache.misses, cache.hits) == (1, 3)
        # the same header with a tail one element short or long: refused as a fresh parse would
        short, headers = binary_body(ids)
        assert_error(await c.post(URL, content=short[:-8], headers=headers), 400, "binary_data_size")
        assert_error(await c.post(URL, content=short + bytes(8), headers=headers), 400, "binary bytes after")
        # a header with its data in the JSON is parsed every time
        inline = {"inputs": [{"name": "topk_ids", "shape": [1, 2], "datatype": "INT64", "data": [5, 5]}],
                  "outputs": [{"name": "counts", "parameters": {"binary_data": True}}]}
        hits = cache.hits
        for _ in range(2):
            body, headers = binary_body(np.zeros(0, np.int64), inline)
            r = await c.post(URL, content=body, headers=headers)
            assert r.status_code == 200, r.text
            n = int(r.headers["inference-header-content-length"])
            assert np.frombuffer(r.content[n:], np.int64).tolist() == counts_of(np.array([5, 5])).tolist()
        assert cache.hits == hits
