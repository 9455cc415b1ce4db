"""Large JSON buffer bodies go through the codec process (server/codec.py): the event loop keeps
answering other requests while one is parsed or written, the data round-trips exactly, and bad
large bodies get the same errors as small ones (nothing stored)."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from helpers.service import RAW, client

pytestmark = pytest.mark.anyio

N = 4_000_000  # int64 numbers: ~30 MB of JSON, parsed in a few hundred ms at least


async def test_health_answers_while_a_large_json_body_is_parsed(live_server_factory, server_backend):
    server = live_server_factory(backend=server_backend)
    ids = np.random.default_rng(0).integers(-(10 ** 12), 10 ** 12, N)
    body = json.dumps({"dtype": "int64", "shape": [N], "data": ids.tolist()}).encode()
    async with client(server) as c, client(server) as probe:
        put = asyncio.create_task(c.put("/v2/buffers/big", content=body, headers={"content-type": "application/json"}))
        answered = 0
        while not put.done():
            r = await probe.get("/v2/health/live")
            assert r.status_code == 200
            answered += 1 if not put.done() else 0
        r = await put
        assert r.status_code == 201, r.text
        assert answered >= 3  # health kept answering while the body was decoded
        raw = (await c.get("/v2/buffers/big", headers={"accept": RAW})).content  # (pinned memory on cupy)
        np.testing.assert_array_equal(np.frombuffer(raw, np.int64), ids)
        r = await c.put("/v2/buffers/big_raw", content=ids.tobytes(), headers={"content-type": RAW},
                        params={"dtype": "int64", "shape": str(N)})  # a large raw body, read chunk by chunk
        assert r.status_code == 201, r.text
        raw = (await c.get("/v2/buffers/big_raw", headers={"accept": RAW})).content
        np.testing.assert_array_equal(np.frombuffer(raw, np.int64), ids)
        get = asyncio.create_task(c.get("/v2/buffers/big", headers={"accept": "application/json"}))
        answered = 0
        while not get.done():
            assert (await probe.get("/v2/health/live")).status_code == 200
            answered += 1 if not get.done() else 0
        doc = (await get).json()
        assert doc["name"] == "big" and doc["dtype"] == "int64" and doc["shape"] == [N]
        np.testing.assert_array_equal(np.asarray(doc["data"], np.int64), ids)
        assert answered >= 1


@pytest.mark.parametrize("body,status,words", [
    (b'{"dtype": "int64", "shape": [3], "data": [1, 2,' + b" " * (1 << 20), 400, "not valid JSON"),
    (json.dumps({"dtype": "int8", "shape": [300000], "data": list(range(300000))}).encode(), 400, "out of range"),
    (json.dumps({"dtype": "int64", "shape": [5], "data": list(range(300000))}).encode(), 400, "elements"),
    (json.dumps({"dtype": "int64", "shape": [300000], "data": list(range(300000)), "x": 1}).encode(), 400, "x"),
], ids=["bad-json", "out-of-range", "wrong-count", "extra-field"])
async def test_bad_large_bodies_are_refused_and_store_nothing(live_server_factory, body, status, words):
    server = live_server_factory(backend="numpy")
    assert len(body) >= 1 << 20
    async with client(server) as c:
        r = await c.put("/v2/buffers/bad", content=body, headers={"content-type": "application/json"})
        assert r.status_code == status, r.text
        assert words in r.json()["error"]
        assert (await c.get("/v2/buffers/bad")).status_code == 404


async def test_large_segments_are_freed_off_the_event_loop(live_server_factory, monkeypatch):
    """Unmapping and unlinking a body's or a response's shared-memory segment frees tens of MiB
    (milliseconds): every such free runs where no event loop runs (a worker thread)."""
    from segfuse.server import codec

    freed = []
    real = codec._drop

    def recording_drop(seg):
        try:
            asyncio.get_running_loop()
            on_loop = True
        except RuntimeError:
            on_loop = False
        freed.append((seg.size, on_loop))
        real(seg)

    monkeypatch.setattr(codec, "_drop", recording_drop)
    monkeypatch.setattr(codec, "SPARE_SEGMENTS", 0)  # no body segment kept for reuse: each is freed
    server = live_server_factory(backend="numpy")
    ids = np.arange(300_000, dtype=np.int64) * 7
    body = json.dumps({"dtype": "int64", "shape": [ids.size], "data": ids.tolist()}).encode()
    async with client(server) as c:
        r = await c.put("/v2/buffers/big", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 201, r.text
        doc = (await c.get("/v2/buffers/big", headers={"accept": "application/json"})).json()
        np.testing.assert_array_equal(np.asarray(doc["data"], np.int64), ids)
    # PUT: the body's segment and the decoded array's; GET: the array's copy and the JSON text's
    assert len(freed) >= 4, freed
    assert not [f for f in freed if f[1]], freed
