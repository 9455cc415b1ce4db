"""Logs and request ids (issue 17, item 17, in part): every response carries an X-Request-ID (the
client's own, or a new one); a failed request is logged with its status, message and id;
`segfuse serve` shows segfuse's own INFO lines (the backend chosen) next to uvicorn's."""

from __future__ import annotations

import logging
import subprocess
import sys
import time

import httpx
import pytest
from test_client import free_port

pytestmark = pytest.mark.anyio


async def test_request_ids_are_echoed_or_made(asgi_server):
    async with asgi_server() as c:
        r = await c.get("/v2/health/live", headers={"x-request-id": "abc-123"})
        assert r.headers["x-request-id"] == "abc-123"
        ids = {(await c.get("/v2/health/live")).headers["x-request-id"] for _ in range(5)}
        ids.add((await c.get("/v2")).headers["x-request-id"])  # FastAPI's routes too
        assert len(ids) == 6
        bad = await c.get("/v2/health/live", headers={"x-request-id": "x" * 200})
        assert bad.headers["x-request-id"] != "x" * 200


async def test_a_failed_request_is_logged_with_its_id(asgi_server, caplog, moe_graph):
    caplog.set_level(logging.INFO, logger="segfuse.server")
    async with asgi_server() as c:
        await c.post("/v2/fusions", json=moe_graph)
        r = await c.post("/v2/models/moe_problem_sizes/infer", headers={"x-request-id": "req-7"}, json={
            "inputs": [{"name": "topk_ids", "shape": [1, 1], "datatype": "INT64", "data": [99]}]})
        assert r.status_code == 422
        r2 = await c.get("/v2/buffers/nope", headers={"x-request-id": "req-8"})
        assert r2.status_code == 404
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "segfuse.server"]
    assert any("[req-7]" in m and "422" in m and "out of bounds" in m for m in lines), lines
    assert any("[req-8]" in m and "404" in m and "not found" in m for m in lines), lines


def test_segfuse_serve_logs_segfuse_info():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-c", "import sys; from segfuse.compiler.cli import main; sys.exit(main())",
                             "serve", "--backend", "numpy", "--port", str(port), "--log-level", "info"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        httpx.get(f"http://127.0.0.1:{port}/v2/buffers/missing", headers={"x-request-id": "r-42"})
    finally:
        proc.terminate()
        out = proc.communicate(timeout=30)[0]
    assert "segfuse ready: backend numpy on cpu" in out, out
    assert "[r-42] -> 404" in out, out
