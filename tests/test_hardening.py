"""Issue 17's hardening items 1, 2, 3, 7, 9 and 11, each through the app (and a live server where the
connection matters): one buffer-name rule; integers out of range refused, never wrapped; malformed
bodies answered with a 4xx, the connection kept; closed metric labels; refused runs counted;
strict binary framing, big-endian .npy, a located 413 for chunked bodies."""

from __future__ import annotations

import http.client
import io
import json
import urllib.parse

import numpy as np
import pytest
from helpers.service import assert_error

pytestmark = pytest.mark.anyio

INFER = "/v2/models/moe_problem_sizes/infer"
NPY = "application/x-npy"


def ids_input(data, **kw) -> dict:
    return {"name": "topk_ids", "shape": [len(data), 1], "datatype": "INT64", "data": data, **kw}


async def buffer_names(c) -> list[str]:
    return [b["name"] for b in (await c.get("/v2/buffers")).json()["buffers"]]


# ---- 1: one buffer-name rule ----------------------------------------------------------------
BAD_NAMES = ["x\n", ".", "..", "a" * 129, "", "a/b", "x\ny"]


@pytest.mark.parametrize("name", BAD_NAMES)
async def test_run_output_buffer_name_is_checked_whole(asgi_server, moe_graph, name):
    async with asgi_server() as c:
        await c.post("/v2/fusions", json=moe_graph)
        body = {"inputs": [ids_input([1, 2])],
                "outputs": [{"name": "counts", "parameters": {"buffer": name}}]}
        assert_error(await c.post(INFER, json=body), 400, "buffer name", "not '.' or '..'",
                     '"outputs", 0, "parameters", "buffer"')
        body = {"inputs": [{"name": "topk_ids", "parameters": {"buffer": name}}]}
        assert_error(await c.post(INFER, json=body), 400, "buffer name", '"inputs", 0, "parameters", "buffer"')
        assert await buffer_names(c) == []


@pytest.mark.parametrize("name", ["x\n", ".", "..", "a" * 129])
async def test_buffer_path_names_follow_the_same_rule(asgi_server, name):
    """PUT, GET and DELETE refuse what a run output refuses, with the same message."""
    async with asgi_server() as c:
        path = "/v2/buffers/" + urllib.parse.quote(name, safe="").replace(".", "%2E")
        expect = repr(name) if not name.isprintable() else f"'{name}'"
        r = await c.put(path, content=np.zeros(2, np.int64).tobytes(),
                        params={"dtype": "int64", "shape": "2"}, headers={"content-type": "application/octet-stream"})
        assert f"buffer name {expect} must be" in assert_error(r, 400, '"path", "name"')["error"]
        assert_error(await c.get(path), 400, "buffer name", "not '.' or '..'")
        assert_error(await c.delete(path), 400, "buffer name", "not '.' or '..'")
        assert await buffer_names(c) == []


async def test_region_names_follow_the_same_rule(asgi_server):
    async with asgi_server() as c:
        r = await c.post("/v2/systemsharedmemory/region/x%0A/register", json={"key": "/k", "offset": 0, "byte_size": 8})
        assert "shared memory region name 'x\\n' must be" in assert_error(r, 400, "not '.' or '..'")["error"]
        assert_error(await c.get("/v2/systemsharedmemory/region/%2E%2E/status"), 400, "region name '..'")
        r = await c.post("/v2/systemsharedmemory/region/ok/register", json={"key": "/k\n", "offset": 0, "byte_size": 8})
        assert_error(r, 400, "shared memory key")


def test_the_name_rule():
    from segfuse.server.names import is_valid_name

    assert all(is_valid_name(n) for n in ["a", "ids_0", "x.y-z", "...", ".a", "a" * 128])
    assert not any(is_valid_name(n) for n in BAD_NAMES)


async def test_good_names_still_round_trip(asgi_server, moe_graph):
    async with asgi_server() as c:
        await c.post("/v2/fusions", json=moe_graph)
        body = {"inputs": [ids_input([1, 1, 3])], "outputs": [{"name": "counts", "parameters": {"buffer": ".c-1_"}}]}
        assert (await c.post(INFER, json=body)).status_code == 200
        r = await c.get("/v2/buffers/.c-1_", headers={"accept": NPY})
        assert np.load(io.BytesIO(r.content)).tolist() == np.bincount([1, 1, 3], minlength=16).tolist()
        assert (await c.delete("/v2/buffers/.c-1_")).status_code == 200


# ---- 2: integers out of range -----------------------------------------------------------------
BIG = "10000000000000000000...(401 digits)"  # how the error shows a long value
OUT_OF_RANGE = [("INT64", [2**63], 2**63), ("INT64", [2**64 - 1], 2**64 - 1), ("INT64", [2**64], 2**64),
                ("INT64", [-(2**63) - 1], -(2**63) - 1), ("INT64", [-1, 2**63], 2**63),
                ("INT64", [[1, 2**70], [3, 4]], 2**70), ("INT32", [2**31], 2**31), ("INT16", [-(2**15) - 1], -(2**15) - 1),
                ("INT8", [1, 128], 128), ("UINT8", [-1], -1), ("UINT8", [256], 256), ("FP32", [10**400], BIG),
                ("FP64", [1.5, 10**400], BIG)]


@pytest.mark.parametrize("datatype,data,shown", OUT_OF_RANGE)
async def test_out_of_range_json_integers_are_400_in_buffers(asgi_server, datatype, data, shown):
    async with asgi_server() as c:
        shape = list(np.asarray(data, dtype=object).shape)
        r = await c.put("/v2/buffers/b", json={"dtype": datatype, "shape": shape, "data": data})
        assert_error(r, 400, f"data value {shown} is out of range for {datatype}", '"body", "data"')
        assert await buffer_names(c) == []


async def test_out_of_range_integers_are_400_in_inline_run_data(asgi_server, moe_graph):
    async with asgi_server() as c:
        await c.post("/v2/fusions", json=moe_graph)
        for v in (2**63, 2**64, 2**100):
            r = await c.post(INFER, json={"inputs": [ids_input([1, v])]})
            assert_error(r, 400, f"data value {v} is out of range for INT64", '"inputs", 0, "data"')


async def test_out_of_range_integer_in_a_large_json_buffer(asgi_server):
    """Bodies from 1 MiB go through the codec process: the same check, the same answer."""
    async with asgi_server() as c:
        data = [1] * 300_000 + [2**63]
        r = await c.put("/v2/buffers/big", json={"dtype": "int64", "shape": [len(data)], "data": data})
        assert_error(r, 400, f"data value {2**63} is out of range for INT64", '"body", "data"')
        assert await buffer_names(c) == []


async def test_integer_limits_themselves_round_trip(asgi_server):
    async with asgi_server() as c:
        for datatype, data in [("INT64", [-(2**63), 2**63 - 1]), ("UINT8", [0, 255]), ("INT8", [-128, 127])]:
            r = await c.put("/v2/buffers/b", json={"dtype": datatype, "shape": [2], "data": data})
            assert r.status_code in (200, 201), r.text
            got = (await c.get("/v2/buffers/b", headers={"accept": "application/json"})).json()["data"]
            assert got == data


# ---- 3: malformed bodies are 4xx, the connection stays open -----------------------------------
DEEP = b"[" * 100_000 + b"]" * 100_000
DIGITS = b"1" * 5000


def _graph_with_size(expr: str, moe_graph: dict) -> bytes:
    g = json.loads(json.dumps(moe_graph))
    g["ops"][0]["shape"] = [expr]
    return json.dumps(g).encode()


def malformed_requests(moe_graph) -> list[tuple[str, str, dict, bytes, int, str]]:
    """(method, path, headers, body, status, text in the error)."""
    js = {"content-type": "application/json"}
    return [
        ("PUT", "/v2/buffers/b", js, b'{"dtype":"int64","shape":[1],"data":' + DEEP + b"}", 400, "nest at most 200"),
        ("POST", "/v2/fusions", js, DEEP, 400, "nest at most 200"),
        ("POST", INFER, js, b'{"inputs":' + DEEP + b"}", 400, "nest at most 200"),
        ("POST", "/v2/repository/models/g/load", js,
         json.dumps({"parameters": {"config": DEEP.decode()}}).encode(), 400, "parameters.config is not valid JSON"),
        ("PUT", "/v2/buffers/b", js, b'{"dtype":"int64","shape":[1],"data":[' + DIGITS + b"]}", 400, "4300 digits"),
        ("PUT", "/v2/buffers/b", js, b'{"dtype":"int64","shape":[' + DIGITS + b'],"data":[1]}', 400, "4300 digits"),
        ("POST", INFER, js, b'{"inputs":[{"name":"topk_ids","shape":[1,1],"datatype":"INT64","data":[' + DIGITS
         + b"]}]}", 400, "4300 digits"),
        ("POST", "/v2/fusions", js, b'{"name":' + DIGITS + b"}", 400, "4300 digits"),
        ("PUT", "/v2/buffers/b?dtype=int64&shape=" + DIGITS.decode(), {"content-type": "application/octet-stream"},
         b"\0" * 8, 400, "more than 19 digits"),
        ("PUT", "/v2/buffers/b", js, b'\xff\xfe{"dtype": "int64"}', 400, "not UTF-8"),
        ("PUT", "/v2/buffers/b", js, '{"dtype":"int64","shape":[1],"data":[1],"x":"\udcff"}'.encode("utf-8", "surrogatepass"),
         400, "not UTF-8"),
        ("POST", "/v2/fusions", js, _graph_with_size("+".join(["T*K"] + ["0"] * 2999), moe_graph), 400,
         "over the limit of 256"),
    ]


async def test_malformed_bodies_are_4xx(asgi_server, moe_graph):
    async with asgi_server() as c:
        await c.post("/v2/fusions", json=moe_graph)
        for method, path, headers, body, status, text in malformed_requests(moe_graph):
            r = await c.request(method, path, headers=headers, content=body)
            assert_error(r, status, text)
        assert await buffer_names(c) == []
        assert [f["name"] for f in (await c.get("/v2/fusions")).json()["fusions"]] == ["moe_problem_sizes"]


def test_malformed_bodies_keep_the_connection(live_server, moe_graph):
    """One keep-alive connection for every request: a 500 made uvicorn close it after each."""
    host, port = live_server.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    conn.request("POST", "/v2/fusions", body=json.dumps(moe_graph), headers={"content-type": "application/json"})
    assert conn.getresponse().read() and conn.sock is not None
    sock = conn.sock
    for method, path, headers, body, status, text in malformed_requests(moe_graph):
        conn.request(method, path, body=body, headers=headers)
        r = conn.getresponse()
        payload = json.loads(r.read())
        assert r.status == status and text in payload["error"], (path, r.status, payload)
        assert set(payload) == {"error", "details"}
        assert not r.will_close and conn.sock is sock, f"{method} {path}: the connection was closed"
    conn.close()


def test_a_long_size_expression_is_refused_by_the_compiler():
    from segfuse.compiler.shapes import MAX_SIZE_EXPR_CHARS, parse_size

    with pytest.raises(ValueError, match="over the limit"):
        parse_size("+".join(["N"] * 3000))
    assert str(parse_size("*".join(["N"] * 100))) == "N**100" and MAX_SIZE_EXPR_CHARS == 256


# ---- 7: metric labels from a closed set ------------------------------------------------------
async def test_request_metrics_label_unknown_methods_other(asgi_server):
    async with asgi_server(token="tok") as c:
        for k in range(20):
            await c.request(f"M{k}THOD", "/v2/buffers")  # 401: before any routing
            await c.request(f"X{k}", "/v2/buffers", headers={"authorization": "Bearer tok"})  # 405
        await c.request("M0THOD", f"/nowhere/{k}", headers={"authorization": "Bearer tok"})
        text = (await c.get("/metrics", headers={"authorization": "Bearer tok"})).text
    lines = [ln for ln in text.splitlines() if ln.startswith("segfuse_requests_total{")]
    methods = {ln.split('method="')[1].split('"')[0] for ln in lines}
    endpoints = {ln.split('endpoint="')[1].split('"')[0] for ln in lines}
    assert methods == {"other"}, methods  # (/metrics counts itself once answered)
    assert endpoints <= {"unmatched", "/v2/buffers", "/metrics"}, endpoints
    assert 'endpoint="unmatched",method="other",status="401"} 20.0' in text
    assert 'endpoint="/v2/buffers",method="other",status="405"} 20.0' in text


# ---- 9: refused runs are failed runs ---------------------------------------------------------
async def test_runs_total_error_counts_429_refusals(asgi_server, moe_graph):
    async with asgi_server(max_queued_runs=1) as c:
        await c.post("/v2/fusions", json=moe_graph)
        ex = c.app.state.server_state.executor
        ex.admitted = ex.max_admitted  # the queue is full
        try:
            for _ in range(3):
                assert_error(await c.post(INFER, json={"inputs": [ids_input([1])]}), 429, "too many runs")
        finally:
            ex.admitted = 0
        assert (await c.post(INFER, json={"inputs": [ids_input([1])]})).status_code == 200
        text = (await c.get("/metrics")).text
    assert 'segfuse_runs_total{outcome="error"} 3.0' in text
    assert 'segfuse_runs_total{outcome="ok"} 1.0' in text


# ---- 11: binary framing, big-endian .npy, chunked 413 ------------------------------------------
@pytest.mark.parametrize("value", ["1_0_3", "+103", " 103", "103 ", "0x67", "1e2", "-1", "9" * 30])
async def test_inference_header_content_length_is_digits_only(asgi_server, moe_graph, value):
    async with asgi_server() as c:
        await c.post("/v2/fusions", json=moe_graph)
        head = json.dumps({"inputs": [{"name": "topk_ids", "shape": [1, 1], "datatype": "INT64",
                                       "parameters": {"binary_data_size": 8}}]}).encode()
        body = head + np.array([3], np.int64).tobytes()
        r = await c.post(INFER, content=body, headers={"inference-header-content-length": str(len(head))})
        assert r.status_code == 200, r.text
        r = await c.post(INFER, content=body, headers={"inference-header-content-length": value})
        assert_error(r, 400, "Inference-Header-Content-Length", "digits only",
                     '"headers", "Inference-Header-Content-Length"')


@pytest.mark.parametrize("dtype", [">i8", ">i4", ">f4", ">f8", ">i2", ">u1"])
async def test_big_endian_npy_is_converted(asgi_server, dtype):
    a = (np.arange(-3, 9).reshape(3, 4) * 7).astype(dtype) if dtype != ">u1" else np.arange(12, dtype=">u1")
    buf = io.BytesIO()
    np.save(buf, a)
    async with asgi_server() as c:
        r = await c.put("/v2/buffers/be", content=buf.getvalue(), headers={"content-type": NPY})
        assert r.status_code == 201, r.text
        assert r.json()["buffer"]["dtype"] == a.dtype.newbyteorder("=").name
        got = np.load(io.BytesIO((await c.get("/v2/buffers/be", headers={"accept": NPY})).content))
        assert got.dtype == a.dtype.newbyteorder("=") and got.tolist() == a.tolist()


async def test_chunked_body_over_the_limit_is_413_with_loc(asgi_server, moe_graph):
    async def chunks():
        for _ in range(8):
            yield b"0" * 1024

    async with asgi_server(max_body_bytes=4096) as c:
        await c.post("/v2/fusions", json=moe_graph)
        for method, path in [("PUT", "/v2/buffers/b?dtype=uint8&shape=8192"), ("POST", INFER),
                             ("POST", "/v2/fusions"), ("POST", "/v2/systemsharedmemory/region/r/register")]:
            r = await c.request(method, path, content=chunks(), headers={"content-type": "application/octet-stream"})
            assert "content-length" not in r.request.headers
            body = assert_error(r, 413, "exceeds the limit of 4096 bytes")
            assert body["details"] == [{"loc": ["body"], "msg": body["error"]}], (path, body)
        assert await buffer_names(c) == []
