"""Logs and request ids (issue 17, item 17): every response carries an X-Request-ID (the
client's own, or a new one); a failed request is logged with its status, message and id;
`segfuse serve` shows segfuse's own INFO lines (the backend chosen) next to uvicorn's, and
uvicorn's line per request only when asked (--access-log or SEGFUSE_ACCESS_LOG), as in Triton."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from datetime import datetime

import httpx
import pytest
from helpers.processes import serve_logged
from helpers.waiting import scaled

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
        assert r.status_code == 400
        r2 = await c.get("/v2/buffers/nope", headers={"x-request-id": "req-8"})
        assert r2.status_code == 404
    lines = [rec.getMessage() for rec in caplog.records if rec.name == "segfuse.server"]
    assert any("[req-7]" in m and "400" in m and "out of bounds" in m for m in lines), lines
    assert any("[req-8]" in m and "404" in m and "not found" in m for m in lines), lines


ACCESS_LINE = '"GET /v2/buffers/missing HTTP/1.1" 404'  # uvicorn's access line for _serve_and_ask's request


def _serve_and_ask(*flags: str) -> str:
    """Start `segfuse serve` (the console script) with flags, ask for a missing buffer with
    X-Request-ID r-42, stop it; its stdout and stderr together."""
    with serve_logged(*flags) as served:
        httpx.get(served.url + "/v2/buffers/missing", headers={"x-request-id": "r-42"})
    return served.output


def test_segfuse_serve_logs_segfuse_info():
    out = _serve_and_ask("--log-level", "info")
    assert "segfuse ready: backend numpy on cpu" in out, out
    assert "[r-42] -> 404" in out, out


def test_segfuse_serve_writes_no_access_line_by_default(monkeypatch):
    """As Triton: no line per request unless asked; the failure line and uvicorn's start lines stay."""
    monkeypatch.delenv("SEGFUSE_ACCESS_LOG", raising=False)
    out = _serve_and_ask("--log-level", "info")
    assert "[r-42] -> 404" in out and "Uvicorn running on" in out, out
    assert 'HTTP/1.1"' not in out, out  # neither this request's line nor the readiness checks'


@pytest.mark.parametrize(("flags", "env"), [(("--access-log",), None), ((), "1"), (("--access-log",), "0")],
                         ids=["flag", "variable", "flag-over-variable"])
def test_segfuse_serve_access_log_writes_each_request(monkeypatch, flags, env):
    monkeypatch.delenv("SEGFUSE_ACCESS_LOG", raising=False)
    if env is not None:
        monkeypatch.setenv("SEGFUSE_ACCESS_LOG", env)
    out = _serve_and_ask("--log-level", "info", *flags)
    access = [line for line in out.splitlines() if ACCESS_LINE in line]
    assert len(access) == 1 and access[0].startswith("INFO:"), out
    assert '"GET /v2/health/ready HTTP/1.1" 200' in out, out


def test_no_access_log_flag_overrides_the_variable(monkeypatch):
    monkeypatch.setenv("SEGFUSE_ACCESS_LOG", "true")
    out = _serve_and_ask("--log-level", "info", "--no-access-log")
    assert "[r-42] -> 404" in out and 'HTTP/1.1"' not in out, out


def test_access_log_setting_parses_and_reaches_every_process_of_a_group():
    from segfuse.cli.serve_group import child_env
    from segfuse.server.settings import Settings

    assert Settings().access_log is False
    for raw, value in (("1", True), ("TRUE", True), ("yes", True), ("on", True), ("0", False), ("false", False),
                       ("off", False), ("", False)):
        assert Settings.from_env({"SEGFUSE_ACCESS_LOG": raw}).access_log is value, raw
    with pytest.raises(ValueError, match="SEGFUSE_ACCESS_LOG='maybe' is not a boolean"):
        Settings.from_env({"SEGFUSE_ACCESS_LOG": "maybe"})
    for on in (True, False):  # `--processes N` hands its settings to each child as SEGFUSE_* variables
        assert Settings.from_env(child_env(Settings(access_log=on), 8001, {})).access_log is on


def test_segfuse_serve_json_logs():
    """--log-format json: every line, uvicorn's and segfuse's, is one JSON object with time,
    level, logger and message; the request's lines (segfuse's failure line and uvicorn's access
    line) carry its request_id."""
    lines = [json.loads(line) for line in _serve_and_ask("--log-format", "json", "--access-log").splitlines()
             if line.strip()]
    for line in lines:
        assert {"time", "level", "logger", "message"} <= set(line), line
        assert datetime.fromisoformat(line["time"].replace("Z", "+00:00")).tzinfo is not None
    by_logger = {}
    for line in lines:
        by_logger.setdefault(line["logger"], []).append(line)
    assert any(m["message"] == "segfuse ready: backend numpy on cpu" and m["level"] == "INFO"
               for m in by_logger["segfuse.server"]), lines
    failed = [m for m in by_logger["segfuse.server"] if m.get("request_id") == "r-42"]
    assert len(failed) == 1 and "-> 404" in failed[0]["message"], lines
    access = [m for m in by_logger["uvicorn.access"] if m.get("request_id") == "r-42"]
    assert len(access) == 1 and "/v2/buffers/missing" in access[0]["message"] and "404" in access[0]["message"]
    assert any(m["logger"] == "uvicorn.error" for m in lines), lines  # uvicorn's own start lines


def test_a_bad_log_format_is_a_clear_error():
    script = os.path.join(os.path.dirname(sys.executable), "segfuse")
    r = subprocess.run([script, "serve", "--log-format", "xml"], capture_output=True, text=True, timeout=scaled(60))
    assert r.returncode == 2 and "--log-format" in r.stderr and "Traceback" not in r.stderr
    r = subprocess.run([script, "serve", "--port", "1"], capture_output=True, text=True, timeout=scaled(60),
                       env={**os.environ, "SEGFUSE_LOG_FORMAT": "xml"})
    assert r.returncode == 2 and "log_format must be text or json" in r.stderr and "Traceback" not in r.stderr
