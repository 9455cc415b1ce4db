"""0-d tensors keep shape () through every .npy path of the server (issue 15, item 3): an uploaded
0-d .npy buffer, a 0-d fusion result stored in a buffer, both read back as .npy (and as JSON and raw
bytes, which already said []). NumPy's ascontiguousarray makes every 0-d array 1-d; the server
must not. Parametrized over the backend (CuPy where a GPU is visible)."""

from __future__ import annotations

import io

import numpy as np
import pytest

pytestmark = pytest.mark.anyio

NPY = "application/x-npy"
SUM = {"format": "segfuse.fusion/1", "name": "total",
       "inputs": [{"name": "x", "dtype": "float32", "shape": ["N"]}, {"name": "s0", "dtype": "float32", "shape": []}],
       "ops": [{"op": "sum", "out": "s", "inputs": ["x"]}, {"op": "add", "out": "t", "inputs": ["s", "s0"]}],
       "outputs": ["t"]}


def _npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, a)
    return buf.getvalue()


async def _get_npy(c, name: str) -> np.ndarray:
    r = await c.get(f"/v2/buffers/{name}", headers={"accept": NPY})
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == NPY
    return np.load(io.BytesIO(r.content))


@pytest.mark.parametrize("dtype", ["float32", "int64", "bool", "float16"])
async def test_uploaded_0d_npy_reads_back_0d(asgi_server, dtype):
    a = np.array(3, dtype=dtype)
    async with asgi_server() as c:
        r = await c.put("/v2/buffers/z", content=_npy(a), headers={"content-type": NPY})
        assert r.status_code == 201, r.text
        assert r.json()["buffer"]["shape"] == []
        back = await _get_npy(c, "z")
        assert back.shape == () and back.dtype == a.dtype and back == a
        r = await c.get("/v2/buffers/z", headers={"accept": "application/octet-stream"})
        assert r.headers["x-segfuse-shape"] == "" and r.content == a.tobytes()


async def test_0d_result_in_a_buffer_reads_back_0d(asgi_server, server_backend):
    x = np.arange(5, dtype=np.float32)
    async with asgi_server(backend=server_backend) as c:
        assert (await c.post("/v2/fusions", json=SUM)).status_code == 201
        r = await c.put("/v2/buffers/x", content=_npy(x), headers={"content-type": NPY})
        assert r.status_code == 201
        r = await c.put("/v2/buffers/s0", content=_npy(np.array(0.5, np.float32)), headers={"content-type": NPY})
        assert r.status_code == 201
        r = await c.post("/v2/models/total/infer", json={
            "inputs": [{"name": "x", "parameters": {"buffer": "x"}}, {"name": "s0", "parameters": {"buffer": "s0"}}],
            "outputs": [{"name": "t", "parameters": {"buffer": "t_out"}}]})
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["shape"] == []
        back = await _get_npy(c, "t_out")
        assert back.shape == () and float(back) == float(x.sum()) + 0.5
        # the stored buffer as an input again: still 0-d (a rank mismatch would be a 400)
        r = await c.post("/v2/models/total/infer", json={
            "inputs": [{"name": "x", "parameters": {"buffer": "x"}}, {"name": "s0", "parameters": {"buffer": "t_out"}}]})
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == [float(x.sum()) * 2 + 0.5]
