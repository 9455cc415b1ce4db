"""Request rules through a real uvicorn server (the app-level tests are in test_hardening.py,
test_special_floats.py and test_server_fusion_limits.py): what the HTTP server adds -- its path
decoding, its chunked transfer encoding, methods it parses itself -- must not undo buffer-name
rules, integer range checks, the fusion count limit, method labels, special floats or the body limit."""

from __future__ import annotations

import copy
import http.client
import json
import math

import httpx
import numpy as np
import pytest
from helpers.service import assert_error
from helpers.waiting import scaled

INFER = "/v2/models/moe_problem_sizes/infer"
OCTETS = {"content-type": "application/octet-stream"}


@pytest.fixture
def live(live_server_factory, moe_graph):
    def start(**settings):
        server = live_server_factory(backend="numpy", **settings)
        token = settings.get("token")
        c = httpx.Client(base_url=server.url, timeout=scaled(60),
                         headers={"authorization": f"Bearer {token}"} if token else {})
        assert c.post("/v2/fusions", json=moe_graph).status_code == 201
        return c

    return start


def buffer_names(c) -> list[str]:
    return [b["name"] for b in c.get("/v2/buffers").json()["buffers"]]


def test_buffer_names_are_checked_after_uvicorns_path_decoding(live):
    """uvicorn decodes %0A and %2E before routing: such names are refused by the one rule, in a
    path and as a run output, and nothing is stored that could not be read back."""
    c = live()
    body = np.zeros(2, np.int64).tobytes()
    for path in ("/v2/buffers/x%0A", "/v2/buffers/%2E%2E", "/v2/buffers/%2E"):
        r = c.put(path, content=body, params={"dtype": "int64", "shape": "2"}, headers=OCTETS)
        assert_error(r, 400, "buffer name", "not '.' or '..'", '"path", "name"')
        assert_error(c.get(path), 400, "buffer name")
    run = {"inputs": [{"name": "topk_ids", "shape": [1, 1], "datatype": "INT64", "data": [1]}],
           "outputs": [{"name": "counts", "parameters": {"buffer": "x\n"}}]}
    assert_error(c.post(INFER, json=run), 400, "buffer name", '"outputs", 0, "parameters", "buffer"')
    assert buffer_names(c) == []


def test_out_of_range_integers_are_refused(live):
    c = live()
    for datatype, value in (("INT64", 2**63), ("INT64", 2**64), ("UINT8", 256)):
        r = c.put("/v2/buffers/b", json={"dtype": datatype, "shape": [1], "data": [value]})
        assert_error(r, 400, f"data value {value} is out of range for {datatype}", '"body", "data"')
    run = {"inputs": [{"name": "topk_ids", "shape": [1, 1], "datatype": "INT64", "data": [2**63]}]}
    assert_error(c.post(INFER, json=run), 400, f"data value {2**63} is out of range for INT64")
    assert buffer_names(c) == []


def test_the_fusion_count_limit_holds(live, moe_graph):
    c = live(max_fusions=2)
    g = copy.deepcopy(moe_graph)
    g["name"], g["ops"][1]["shape"] = "second", [8]
    assert c.post("/v2/fusions", json=g).status_code == 201
    g["name"], g["ops"][1]["shape"] = "third", [9]
    assert_error(c.post("/v2/fusions", json=g), 413, "the limit is 2")
    assert sorted(f["name"] for f in c.get("/v2/fusions").json()["fusions"]) == ["moe_problem_sizes", "second"]


# Methods uvicorn's parser knows (WebDAV and others) reach the app; made-up ones it answers 400 itself.
EXOTIC = ["PROPFIND", "PROPPATCH", "MKCOL", "COPY", "MOVE", "LOCK", "UNLOCK", "SEARCH", "REPORT", "PURGE"]


def test_methods_uvicorn_parses_are_labelled_other(live):
    c = live(token="tok")
    host, port = str(c.base_url).removeprefix("http://").rstrip("/").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=scaled(60))
    for method in EXOTIC:
        conn.request(method, "/v2/buffers")
        r = conn.getresponse()
        r.read()
        assert r.status == 401, method
    conn.close()
    text = c.get("/metrics").text
    methods = {ln.split('method="')[1].split('"')[0] for ln in text.splitlines()
               if ln.startswith("segfuse_requests_total{")}
    assert "other" in methods and not methods & set(EXOTIC), methods
    assert f'endpoint="unmatched",method="other",status="401"}} {float(len(EXOTIC))}' in text


def test_special_floats_round_trip(live):
    c = live()
    sent = [1.5, "NaN", "Infinity", "-Infinity"]
    assert c.put("/v2/buffers/f", json={"dtype": "float32", "shape": [4], "data": sent}).status_code == 201
    raw = np.frombuffer(c.get("/v2/buffers/f", headers={"accept": "application/octet-stream"}).content, np.float32)
    assert raw[0] == 1.5 and math.isnan(raw[1]) and raw[2] == math.inf and raw[3] == -math.inf
    assert c.get("/v2/buffers/f", headers={"accept": "application/json"}).json()["data"] == sent
    assert_error(c.put("/v2/buffers/g", json={"dtype": "float32", "shape": [1], "data": ["nan"]}), 400, "'nan'")


def test_a_chunked_body_over_the_limit_is_refused_while_read(live):
    """Transfer-Encoding: chunked through uvicorn: no Content-Length to refuse early, the 413
    comes while the body is read, located at body, and nothing is stored."""
    c = live(max_body_bytes=4096)

    def chunks():
        for _ in range(8):
            yield b"0" * 1024

    for method, path in [("PUT", "/v2/buffers/b?dtype=uint8&shape=8192"), ("POST", INFER), ("POST", "/v2/fusions")]:
        r = c.request(method, path, content=chunks(), headers=OCTETS)
        assert r.request.headers.get("transfer-encoding") == "chunked"
        body = assert_error(r, 413, "exceeds the limit of 4096 bytes")
        assert body["details"] == [{"loc": ["body"], "msg": body["error"]}], (path, body)
    assert buffer_names(c) == []
    assert json.loads(c.get("/v2/health/ready").text) == {"ready": True}
