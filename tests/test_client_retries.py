"""The client's retries (429/503 and broken connections; client/_retry.py) and its cache of
registered graph files (client/_builder.py `GraphPaths`): against a live uvicorn server, and
against httpx mock transports where a failure must be made on purpose."""

from __future__ import annotations

import asyncio
import json
import os
import threading

import httpx
import numpy as np
import pytest
from helpers.graphs import MOE
from helpers.service import GatedEngine, wait_event
from segfuse.client import AsyncClient, Client, ClientError
from segfuse.client import _client as client_module
from segfuse.client._retry import RetryPolicy, parse_retry_after


def counts_of(ids: np.ndarray) -> np.ndarray:
    return np.bincount(ids.ravel(), minlength=16).astype(np.int64)


class Recording:
    """Wraps a transport (sync and async) and records (method, path, status or error name)."""

    def __init__(self, inner):
        self.inner, self.seen, self.lock = inner, [], threading.Lock()

    def _note(self, request, what) -> None:
        with self.lock:
            self.seen.append((request.method, request.url.path, what))

    def handle_request(self, request):
        try:
            response = self.inner.handle_request(request)
        except httpx.TransportError as e:
            self._note(request, type(e).__name__)
            raise
        self._note(request, response.status_code)
        return response

    async def handle_async_request(self, request):
        response = await self.inner.handle_async_request(request)
        self._note(request, response.status_code)
        return response

    def count(self, method: str, path_end: str, what=None) -> int:
        return sum(1 for m, p, w in self.seen if m == method and p.endswith(path_end) and (what is None or w == what))

    def close(self):
        self.inner.close()

    async def aclose(self):
        await self.inner.aclose()


class AsyncRecording(Recording, httpx.AsyncBaseTransport):
    pass


class SyncRecording(Recording, httpx.BaseTransport):
    pass


@pytest.fixture
def sleeps(monkeypatch):
    """The waits the sync client asks for, without waiting."""
    waited: list[float] = []
    monkeypatch.setattr(client_module.time, "sleep", waited.append)
    return waited


# ---- a full run queue, live -------------------------------------------------------------------
def test_concurrent_runs_succeed_with_retries_and_fail_fast_without(live_server_factory, server_backend):
    server = live_server_factory(backend=server_backend, max_queued_runs=1)
    gate = GatedEngine(server.runtime.engine)
    server.runtime.engine = gate
    batches = [np.random.default_rng(i).integers(0, 16, (8, 4)) for i in range(8)]

    async def main():
        seen = AsyncRecording(httpx.AsyncHTTPTransport())
        async with AsyncClient(server.url, retries=0) as once, \
                AsyncClient(server.url, retries=30, backoff=0.05, max_backoff=0.1, transport=seen) as c:
            ref = await once.register(MOE)
            held = asyncio.create_task(once.run(ref, inputs={"topk_ids": batches[0]}))
            await wait_event(gate.entered)
            with pytest.raises(ClientError) as refused:  # retries=0: the 429 is the answer, at once
                await once.run(ref, inputs={"topk_ids": batches[0]})
            runs = [asyncio.create_task(c.run(ref, inputs={"topk_ids": b})) for b in batches]
            while seen.count("POST", "/infer", 429) < 2 * len(batches):  # every run refused, and retried
                await asyncio.sleep(0.02)
            gate.release.set()
            return refused.value, await held, await asyncio.gather(*runs), seen

    try:
        refused, held, results, seen = asyncio.run(main())
    finally:
        gate.release.set()
    assert refused.status == 429 and "too many runs" in refused.message
    assert np.array_equal(held["counts"], counts_of(batches[0]))
    for b, r in zip(batches, results):
        assert np.array_equal(r["counts"], counts_of(b))
    assert seen.count("POST", "/infer", 200) == len(batches)  # each run ran once
    assert seen.count("POST", "/infer", 429) >= 2 * len(batches)
    # issue 17, item 9, on a live server: every 429 the clients saw is a failed run in the metrics
    text = httpx.get(server.url + "/metrics").text
    assert f'segfuse_runs_total{{outcome="error"}} {float(seen.count("POST", "/infer", 429) + 1)}' in text
    assert f'segfuse_runs_total{{outcome="ok"}} {float(len(batches) + 1)}' in text


# ---- the policy, with mock transports -----------------------------------------------------------
def scripted(*answers):
    """A mock transport answering requests in turn from `answers` (a status, a (status, headers)
    pair, or an exception to raise), the last one for ever; `.calls` counts requests."""
    def handler(request: httpx.Request) -> httpx.Response:
        answer = answers[min(handler.calls, len(answers) - 1)]
        handler.calls += 1
        if isinstance(answer, Exception):
            raise answer
        status, headers = answer if isinstance(answer, tuple) else (answer, {})
        body = {"backend": "numpy"} if status == 200 else {"error": "busy", "details": []}
        return httpx.Response(status, json=body, headers=headers)

    handler.calls = 0
    return handler


def test_retry_after_is_honoured_and_capped(sleeps):
    handler = scripted((429, {"Retry-After": "2"}), (503, {"Retry-After": "3"}), 200)
    with Client("segfuse.test", transport=httpx.MockTransport(handler)) as c:
        assert c.metadata()["backend"] == "numpy"
    assert handler.calls == 3 and len(sleeps) == 2  # it waited, twice, then the answer came
    assert 2 <= sleeps[0] <= 4 and 3 <= sleeps[1] <= 6

    sleeps.clear()
    handler = scripted((429, {"Retry-After": "120"}))
    with Client("segfuse.test", retries=2, max_backoff=0.5, transport=httpx.MockTransport(handler)) as c:
        with pytest.raises(ClientError) as e:
            c.metadata()
    assert e.value.status == 429 and handler.calls == 3 and sleeps == [0.5, 0.5]  # capped, bounded


def test_without_retry_after_the_backoff_doubles(sleeps):
    handler = scripted(503)
    with Client("segfuse.test", retries=3, backoff=0.1, transport=httpx.MockTransport(handler)) as c:
        with pytest.raises(ClientError) as e:
            c.buffers()
    assert e.value.status == 503 and handler.calls == 4
    for n, wait in enumerate(sleeps):
        assert 0.1 * 2 ** n <= wait <= 0.2 * 2 ** n


def test_retries_zero_sends_once(sleeps):
    handler = scripted((429, {"Retry-After": "1"}), 200)
    with Client("segfuse.test", retries=0, transport=httpx.MockTransport(handler)) as c:
        with pytest.raises(ClientError) as e:
            c.run("moe_problem_sizes", inputs={})
    assert e.value.status == 429 and handler.calls == 1 and sleeps == []


def test_a_refused_run_is_retried_but_not_one_whose_connection_broke(sleeps):
    handler = scripted((429, {"Retry-After": "1"}), 200)
    with Client("segfuse.test", transport=httpx.MockTransport(handler)) as c:
        c.run("moe_problem_sizes", inputs={})  # refused before it ran: sent again
    assert handler.calls == 2 and len(sleeps) == 1

    for error in (httpx.ReadError("connection reset"), httpx.RemoteProtocolError("server disconnected")):
        sleeps.clear()
        handler = scripted(error, error, error, 200)
        with Client("segfuse.test", transport=httpx.MockTransport(handler)) as c:
            with pytest.raises(ClientError, match="cannot reach the segfuse server") as e:
                c.run("moe_problem_sizes", inputs={})  # it may have run: not repeated
            assert e.value.status is None and handler.calls == 1 and sleeps == []
            with pytest.raises(ClientError):
                c.register({"name": "g"})  # nor is any other POST
            assert handler.calls == 2 and sleeps == []
            assert c.metadata()["backend"] == "numpy"  # a GET is: sent again
            assert handler.calls == 4 and len(sleeps) == 1


def test_idempotent_requests_retry_a_broken_connection_boundedly(sleeps):
    handler = scripted(httpx.ReadError("connection reset"))
    with Client("segfuse.test", retries=2, transport=httpx.MockTransport(handler)) as c:
        with pytest.raises(ClientError, match="cannot reach"):
            c.delete("x")
    assert handler.calls == 3 and len(sleeps) == 2
    # A timeout is not retried (the request may still be running); connect failures are the
    # transport's (httpx.HTTPTransport(retries=...)), so the loop does not multiply them.
    for error in (httpx.ReadTimeout("slow"), httpx.ConnectError("refused")):
        handler = scripted(error)
        with Client("segfuse.test", transport=httpx.MockTransport(handler)) as c:
            with pytest.raises(ClientError):
                c.buffers()
        assert handler.calls == 1


def test_health_probes_answer_at_once(sleeps):
    handler = scripted((503, {"Retry-After": "1"}))
    with Client("segfuse.test", transport=httpx.MockTransport(handler)) as c:
        assert c.is_ready() is False
    assert handler.calls == 1 and sleeps == []


def test_async_client_sleeps_with_asyncio(monkeypatch):
    waited = []

    async def fake_sleep(seconds):
        waited.append(seconds)

    monkeypatch.setattr(client_module.asyncio, "sleep", fake_sleep)
    handler = scripted((429, {"Retry-After": "1"}), 200)

    async def main():
        async with AsyncClient("segfuse.test", transport=httpx.MockTransport(handler)) as c:
            return await c.metadata()

    assert asyncio.run(main())["backend"] == "numpy"
    assert handler.calls == 2 and len(waited) == 1 and 1 <= waited[0] <= 2


def test_default_transport_retries_connects_and_the_policy_is_checked():
    with Client("127.0.0.1:1", retries=0) as c:  # nothing listens on port 1
        with pytest.raises(ClientError, match="cannot reach the segfuse server at http://127.0.0.1:1/v2"):
            c.metadata()
    with pytest.raises(ValueError, match="retries"):
        Client("x", retries=-1)
    assert parse_retry_after("7") == 7 and parse_retry_after("soon") is None
    assert parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") == 0  # a date in the past: now
    assert RetryPolicy(backoff=1, max_backoff=3).delay(5) == 3


# ---- graph files: registered once ---------------------------------------------------------------
def test_a_graph_file_is_registered_once_for_many_runs(live_server, tmp_path):
    path = tmp_path / "moe.json"
    graph = json.loads(MOE.read_text())
    path.write_text(json.dumps(graph))
    ids = np.random.default_rng(3).integers(0, 16, (16, 4))
    seen = SyncRecording(httpx.HTTPTransport())
    with Client(live_server.url, transport=seen) as c:
        for _ in range(5):
            assert np.array_equal(c.run(path, inputs={"topk_ids": ids})["counts"], counts_of(ids))
        c.run(str(path), inputs={"topk_ids": ids})  # a str names the same file
        assert seen.count("POST", "/v2/fusions") == 1 and seen.count("POST", "/v2/execute") == 0
        assert seen.count("POST", f"/v2/models/{c.register(path).id}/infer") == 6

        # The file changes: registered again, and the new graph runs.
        graph["name"], graph["ops"][1]["shape"] = "moe_wide", [32]
        path.write_text(json.dumps(graph))
        res = c.run(path, inputs={"topk_ids": ids})
        assert res.model_name == "moe_wide" and res["counts"].shape == (32,)
        assert seen.count("POST", "/v2/fusions") == 3  # the explicit register above, and this one
        c.run(path, inputs={"topk_ids": ids})
        assert seen.count("POST", "/v2/fusions") == 3

        # The server forgets it (unregistered, or restarted): a 404, registered again, run.
        c.unregister(res.fusion_id)
        assert np.array_equal(c.run(path, inputs={"topk_ids": ids})["counts"][:16], counts_of(ids))
        assert seen.count("POST", "/v2/fusions") == 4 and seen.count("POST", "/infer", 404) == 1

        # A missing buffer is still a 404 for the user (after one more registration).
        from segfuse.client import Buffer
        with pytest.raises(ClientError) as e:
            c.run(path, inputs={"topk_ids": Buffer("no_such_buffer")})
        assert e.value.status == 404 and "no_such_buffer" in e.value.message
        c.unregister(res.fusion_id)


def test_async_runs_of_a_path_register_once(live_server, tmp_path):
    path = tmp_path / "moe.json"
    path.write_bytes(MOE.read_bytes())
    batches = [np.random.default_rng(i).integers(0, 16, (8, 4)) for i in range(6)]

    async def main():
        seen = AsyncRecording(httpx.AsyncHTTPTransport())
        async with AsyncClient(live_server.url, transport=seen) as c:
            first = await c.run(path, inputs={"topk_ids": batches[0]})
            rest = await asyncio.gather(*(c.run(path, inputs={"topk_ids": b}) for b in batches[1:]))
            plan_or_error = None
            try:
                await c.plan(path, {"T": 8, "K": 4})
            except ClientError as e:  # an engine without a planner says so
                plan_or_error = e.status
            return [first, *rest], seen, plan_or_error

    results, seen, plan_status = asyncio.run(main())
    for b, r in zip(batches, results):
        assert np.array_equal(r["counts"], counts_of(b))
    assert seen.count("POST", "/v2/fusions") == 1 and plan_status in (None, 501)
    assert os.path.exists(path)
