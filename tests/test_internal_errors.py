"""No input answers 5xx: numbers too large for the server are 400s naming the field, running out of
memory is a 413, and a real bug's 500 is the JSON error body on a connection that stays open."""

from __future__ import annotations

import http.client
import json

import pytest
from helpers.graphs import MOE_PROBLEM_SIZES
from helpers.waiting import scaled

pytestmark = pytest.mark.anyio

INFER = "/v2/models/moe_problem_sizes/infer"


def infer_body(**parameters) -> bytes:
    return json.dumps({"inputs": [{"name": "topk_ids", "datatype": "INT64", "shape": [1, 2], "data": [1, 2]}],
                       "parameters": parameters}).encode()


@pytest.mark.parametrize("digits", [20, 400, 5000])
async def test_a_huge_size_in_a_plan_query_is_400(asgi_server, moe_graph, digits):
    async with asgi_server() as c:
        await c.post("/v2/fusions", json=moe_graph)
        r = await c.get("/v2/fusions/moe_problem_sizes/plan", params={"shape": "T=" + "9" * digits + ",K=2"})
        assert r.status_code == 400, r.text
        assert "shape binding T=" in r.json()["error"] and "over the largest size" in r.json()["error"]
        assert r.json()["details"][0]["loc"] == ["query", "shape"]
        ok = await c.get("/v2/fusions/moe_problem_sizes/plan", params={"shape": f"T={2 ** 63 - 1},K=2"})
        assert ok.status_code == 200 and ok.json()["symbols"]["T"] == 2 ** 63 - 1


@pytest.mark.parametrize("fast_lane", [True, False])
async def test_a_timeout_too_large_for_the_server_is_400(asgi_server, moe_graph, fast_lane):
    async with asgi_server() as c:
        c.app.state.fast_lane = fast_lane
        await c.post("/v2/fusions", json=moe_graph)
        for timeout in (10 ** 400, 2 ** 64):
            r = await c.post(INFER, content=infer_body(timeout=timeout))
            assert r.status_code == 400, r.text
            assert r.json()["details"][0]["loc"] == ["parameters", "timeout"]
        r = await c.post(INFER, content=infer_body(timeout=2 ** 64 - 1))  # Triton's largest: no deadline to speak of
        assert r.status_code == 200 and r.json()["outputs"][0]["data"][1:3] == [1, 1]


def keep_alive_requests(server, requests) -> list[tuple[int, dict]]:
    """Each (method, path, body) on one keep-alive connection; asserts it stays open throughout."""
    host, port = server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=scaled(30))
    out, sock = [], None
    for method, path, body in requests:
        conn.request(method, path, body=body, headers={"content-type": "application/json"})
        r = conn.getresponse()
        out.append((r.status, json.loads(r.read())))
        assert not r.will_close and (sock is None or conn.sock is sock), f"{method} {path}: connection closed"
        sock = conn.sock
    conn.close()
    return out


@pytest.fixture
def failing(live_server_factory, monkeypatch):
    """A live server, and `fail(exc)`: listing fusions (a FastAPI route) and planning an infer
    request (the fast lane) raise `exc` from then on."""
    import httpx
    from segfuse.server.routers import infer

    server = live_server_factory(backend="numpy")
    assert httpx.post(server.url + "/v2/fusions", json=MOE_PROBLEM_SIZES).status_code == 201

    def fail(exc: BaseException):
        def raising(*a, **k):
            raise exc

        monkeypatch.setattr(server.runtime.fusions, "all", raising)
        monkeypatch.setattr(infer, "parse_request", raising)

    return server, fail


def test_running_out_of_memory_is_413_on_every_route(failing):
    server, fail = failing
    fail(MemoryError())
    answers = keep_alive_requests(server, [("GET", "/v2/fusions", None), ("POST", INFER, infer_body()),
                                           ("GET", "/v2/health/live", None)])
    for status, doc in answers[:2]:
        assert status == 413 and "not enough memory for this request" in doc["error"]
        assert set(doc) == {"error", "details"}
    assert answers[2] == (200, {"live": True})


def test_an_unexpected_error_is_a_json_500_that_keeps_the_connection(failing):
    """A bug (here a RuntimeError) on a FastAPI route and on the fast lane: the error body, and the
    client's connection stays open (a 500 used to make uvicorn close it)."""
    server, fail = failing
    fail(RuntimeError("boom"))
    answers = keep_alive_requests(server, [("GET", "/v2/fusions", None), ("POST", INFER, infer_body()),
                                           ("GET", "/v2/health/live", None)])
    for status, doc in answers[:2]:
        assert status == 500 and doc["error"] == "internal error: RuntimeError: boom" and doc["details"] == []
    assert answers[2] == (200, {"live": True})
