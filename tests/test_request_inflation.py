"""Compressed request bodies (server/compression.py) inflate off the event loop, are held to the
body limit while they inflate (413 as soon as it is passed), and a large inflated body goes on to
where large bodies go. Oracles: zlib's own inflate, NumPy, and /v2/health/live's latency."""

from __future__ import annotations

import gzip
import json
import threading
import zlib

import numpy as np
import pytest
from helpers.health import assert_health_stayed_free, slowest_health_while
from helpers.processes import SEGFUSE, server_process
from helpers.waiting import scaled
from segfuse.server.compression import InflateError, inflate, inflate_chunks

pytestmark = pytest.mark.anyio

SPACES = b" " * (1 << 20)
MOE = "/v2/models/moe_problem_sizes/infer"


def gzip_of(*pieces: bytes, repeat: int = 1) -> bytes:
    """gzip of pieces[0] + pieces[1] * repeat + pieces[2:], without building the inflated body."""
    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    out = [c.compress(pieces[0])]
    out += [c.compress(pieces[1]) for _ in range(repeat)] if len(pieces) > 1 else []
    out += [c.compress(p) for p in pieces[2:]]
    return b"".join(out) + c.flush()


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "raw-deflate", "two-gzip-members"])
def test_inflate_matches_zlib_and_stops_at_the_limit(encoding):
    data = np.random.default_rng(0).bytes(3 << 20) + bytes(5 << 20)
    if encoding == "gzip":
        packed = gzip.compress(data, 1)
    elif encoding == "two-gzip-members":
        packed = gzip.compress(data[:1000], 1) + gzip.compress(data[1000:], 1)
    else:
        c = zlib.compressobj(1, zlib.DEFLATED, -zlib.MAX_WBITS if encoding == "raw-deflate" else zlib.MAX_WBITS)
        packed = c.compress(data) + c.flush()
    coding = "gzip" if "gzip" in encoding else "deflate"
    chunks = inflate_chunks(packed, coding, len(data))
    assert b"".join(chunks) == data and max(map(len, chunks)) <= 1 << 20
    with pytest.raises(InflateError) as e:
        inflate(packed, coding, len(data) - 1)
    assert e.value.status == 413 and "inflates past the limit" in e.value.message


def test_a_bomb_stops_inflating_once_past_the_limit(monkeypatch):
    """A 1 GiB bomb with an 8 MiB limit: zlib is asked for at most limit + 1 bytes in all."""
    from segfuse.server import compression

    asked = []
    real = zlib.decompressobj

    class Counting:
        def __init__(self, *a):
            self.d = real(*a)

        def decompress(self, data, max_length=0):
            out = self.d.decompress(data, max_length)
            asked.append(len(out))
            return out

        def __getattr__(self, name):
            return getattr(self.d, name)

    monkeypatch.setattr(compression.zlib, "decompressobj", Counting)
    bomb = gzip_of(b"", SPACES, repeat=1024)
    with pytest.raises(InflateError) as e:
        inflate_chunks(bomb, "gzip", 8 << 20)
    assert e.value.status == 413 and sum(asked) == (8 << 20) + 1


async def test_bodies_inflate_on_a_worker_thread(asgi_server, moe_graph, monkeypatch):
    """Every body but a tiny one inflates where the event loop is not; the inflated body reaches
    the route whole (a large JSON one through the codec process)."""
    from segfuse.server import compression

    where = []
    real = compression.inflate_chunks

    def recording(data, encoding, limit):
        where.append(threading.current_thread() is threading.main_thread())
        return real(data, encoding, limit)

    monkeypatch.setattr(compression, "inflate_chunks", recording)
    ids = np.random.default_rng(3).integers(0, 16, (200_000, 2))
    doc = json.dumps({"inputs": [{"name": "topk_ids", "datatype": "INT64", "shape": list(ids.shape),
                                  "data": ids.tolist()}]}).encode()
    async with asgi_server() as c:
        assert (await c.post("/v2/fusions", json=moe_graph)).status_code == 201
        r = await c.post(MOE, content=gzip.compress(doc), headers={"content-encoding": "gzip"})
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == np.bincount(ids.reshape(-1), minlength=16).tolist()
        small = gzip.compress(json.dumps({"inputs": [{"name": "topk_ids", "datatype": "INT64", "shape": [1, 2],
                                                      "data": [3, 3]}]}).encode())
        r = await c.post(MOE, content=small, headers={"content-encoding": "gzip"})
        assert r.status_code == 200 and r.json()["outputs"][0]["data"][3] == 2
        assert where[0] is False  # (the tiny one may inflate on the loop: at most a few hundred KiB)
        # past the limit: 413, nothing else
        bomb = gzip_of(b"", SPACES, repeat=300)
        r = await c.post(MOE, content=bomb, headers={"content-encoding": "gzip"})
        assert r.status_code == 413 and "inflates past the limit" in r.json()["error"]


async def test_health_answers_while_gzip_bodies_inflate(moe_graph):
    """A 250 KB body inflating to 250 MiB (valid JSON, then spaces) and one inflating past the
    256 MiB limit: before, each held every request for about 2 s."""
    head = json.dumps({"inputs": [{"name": "topk_ids", "datatype": "INT64", "shape": [2, 2],
                                   "data": [1, 2, 3, 3]}]}).encode()
    fits = gzip_of(head, SPACES, repeat=250)
    bomb = gzip_of(b"", SPACES, repeat=1024)
    assert len(fits) < 1 << 20 and len(bomb) < 2 << 20
    with server_process([*SEGFUSE, "serve"]) as url:  # its own process: the client never shares its GIL
        import httpx

        async with httpx.AsyncClient(base_url=url, timeout=scaled(120)) as c:
            assert (await c.post("/v2/fusions", json=moe_graph)).status_code == 201
            gz = {"content-encoding": "gzip"}
            slowest, answered, r, took = await slowest_health_while(url, c.post(MOE, content=bomb, headers=gz))
            assert r.status_code == 413 and "inflates past the limit" in r.json()["error"]
            assert_health_stayed_free(slowest, answered, took, at_least=3)
            slowest, answered, r, took = await slowest_health_while(url, c.post(MOE, content=fits, headers=gz))
            assert r.status_code == 200, r.text
            assert r.json()["outputs"][0]["data"][:4] == [0, 1, 1, 2]
            assert_health_stayed_free(slowest, answered, took, at_least=3)
