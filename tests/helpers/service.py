"""Talking to the service over HTTP in tests: the error body check, buffer uploads, a gate that
holds runs, and waiting for it."""

from __future__ import annotations

import asyncio
import json
import threading

import httpx
import numpy as np

from helpers.waiting import scaled

RAW = "application/octet-stream"
NPY = "application/x-npy"


def assert_error(r, status: int, *fragments: str) -> dict:
    """An error response: the status, the one error body shape, and text that explains it."""
    assert r.status_code == status, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error", "details"}, body
    assert isinstance(body["error"], str) and body["error"]
    assert isinstance(body["details"], list)
    for d in body["details"]:
        assert set(d) == {"loc", "msg"} and isinstance(d["loc"], list), d
    text = json.dumps(body)
    for f in fragments:
        assert f in text, (f, body)
    return body


def client(server, **kw) -> httpx.AsyncClient:
    """An async client on a LiveServer (generous timeout: a loaded machine answers slowly)."""
    return httpx.AsyncClient(base_url=server.url, timeout=scaled(60), **kw)


async def put_raw(c, name: str, a: np.ndarray, **params):
    """PUT `a` as buffer `name` in the raw binary form; the response."""
    return await c.put(f"/v2/buffers/{name}", content=a.tobytes(), headers={"content-type": RAW},
                       params={"dtype": a.dtype.name, "shape": ",".join(map(str, a.shape)), **params})


async def put(c, name, a):
    """PUT `a` as buffer `name`; asserts it was stored."""
    r = await put_raw(c, name, a)
    assert r.status_code in (200, 201), r.text


def counts_json(ids) -> list[int]:
    """The MoE graph's counts as the JSON body lists them."""
    return np.bincount(np.asarray(ids).reshape(-1), minlength=16).tolist()


class GatedEngine:
    """Wraps the server's engine so a test decides when a run may proceed."""

    def __init__(self, inner):
        self.inner = inner
        self.entered = threading.Event()
        self.release = threading.Event()

    def is_warm(self, fusion, inputs, bound=None):
        return False  # gated runs go to a run worker (a warm GPU run would run on the event loop)

    def run_batch(self, calls, **kw):  # what the server's run workers call
        self.entered.set()
        if not self.release.wait(scaled(120)):
            raise AssertionError("gate never opened")
        return self.inner.run_batch(calls, **kw)

    def __getattr__(self, name):
        return getattr(self.inner, name)


async def wait_event(event: threading.Event, seconds: float = 60) -> None:
    """Until `event` is set; a (scaled) hang guard only."""
    assert await asyncio.to_thread(event.wait, scaled(seconds)), "timed out"


def count_runs(rt, monkeypatch) -> list:
    """Every batch the engine is asked to run, recorded."""
    calls, real = [], rt.engine.run_batch

    def run_batch(batch, **kw):
        calls.append(len(batch))
        return real(batch, **kw)

    monkeypatch.setattr(rt.engine, "run_batch", run_batch)
    return calls
