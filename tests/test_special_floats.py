"""NaN and infinities round-trip through JSON (issue 17, item 8) as the strings "NaN", "Infinity"
and "-Infinity" (protobuf's JSON mapping), in buffers (small and large bodies) and in runs."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

pytestmark = pytest.mark.anyio

VALUES = [1.5, float("nan"), float("inf"), float("-inf"), -0.25]
AS_JSON = [1.5, "NaN", "Infinity", "-Infinity", -0.25]


def _same(got: list, want: list) -> bool:
    return all((isinstance(a, str) and a == b) or (not isinstance(a, str) and (a == b or math.isnan(a) and math.isnan(b)))
               for a, b in zip(got, want)) and len(got) == len(want)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
async def test_buffer_json_round_trip(asgi_server, dtype):
    async with asgi_server() as c:
        r = await c.put("/v2/buffers/f", json={"dtype": dtype, "shape": [5], "data": AS_JSON})
        assert r.status_code == 201, r.text
        raw = (await c.get("/v2/buffers/f", headers={"accept": "application/octet-stream"})).content
        np.testing.assert_array_equal(np.frombuffer(raw, dtype), np.array(VALUES, dtype))
        doc = (await c.get("/v2/buffers/f", headers={"accept": "application/json"})).json()
        assert doc["data"] == AS_JSON


async def test_large_buffer_json_round_trip(asgi_server):
    n = 200_000  # a body over the codec process's threshold
    vals = np.random.default_rng(0).random(n)
    vals[::7] = np.nan
    vals[3::11] = np.inf
    data = [("NaN" if math.isnan(v) else "Infinity" if v == math.inf else v) for v in vals.tolist()]
    body = json.dumps({"dtype": "float64", "shape": [n], "data": data}).encode()
    assert len(body) >= 1 << 20
    async with asgi_server() as c:
        r = await c.put("/v2/buffers/big", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 201, r.text
        raw = (await c.get("/v2/buffers/big", headers={"accept": "application/octet-stream"})).content
        np.testing.assert_array_equal(np.frombuffer(raw, np.float64), vals)
        doc = (await c.get("/v2/buffers/big", headers={"accept": "application/json"})).json()
        assert _same(doc["data"], data)


async def test_runs_read_and_write_special_floats(asgi_server, chain_graph):
    async with asgi_server() as c:
        await c.post("/v2/fusions", json=chain_graph)
        a = [1.0, -1.0, "Infinity", "NaN", 2.0]
        b = [2.0, 2.0, 2.0, 2.0, "-Infinity"]
        cc = [0.5, 0.0, 1.0, 1.0, 1.0]
        r = await c.post("/v2/models/elementwise_chain/infer", json={"inputs": [
            {"name": n, "shape": [5], "datatype": "FP32", "data": d} for n, d in zip("abc", (a, b, cc))]})
        assert r.status_code == 200, r.text
        got = r.json()["outputs"][0]["data"]
        # out = where(a > 0, a*b + c, exp(c) * 0.5), computed here with NumPy
        av, bv, cv = (np.array([{"NaN": np.nan, "Infinity": np.inf, "-Infinity": -np.inf}.get(x, x) for x in d],
                               np.float32) for d in (a, b, cc))
        with np.errstate(all="ignore"):
            want = np.where(av > 0, av * bv + cv, np.exp(cv) * np.float32(0.5)).astype(np.float32)
        want_json = [("NaN" if math.isnan(v) else "Infinity" if v == math.inf else "-Infinity" if v == -math.inf
                      else v) for v in want.tolist()]
        assert _same(got, want_json) and "Infinity" in got and "-Infinity" in got


async def test_other_strings_are_refused(asgi_server):
    async with asgi_server() as c:
        for data in (["nan"], ["1.5"], ["Infinity"]):
            dtype = "int64" if data == ["Infinity"] else "float32"
            r = await c.put("/v2/buffers/s", json={"dtype": dtype, "shape": [1], "data": data})
            assert r.status_code == 400, (data, r.text)
        assert (await c.get("/v2/buffers/s")).status_code == 404
