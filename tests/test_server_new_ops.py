"""The ops of issue 15 over HTTP: a graph with every one of them registers, plans (the expansion's
tensors in the plan, kernels' sources listed) and runs through the KServe infer route against
PyTorch on the CPU; bad attributes are 400s with a hint, a bad index at run time a 4xx naming the
op, never a 5xx. Parametrized over the backend (CuPy where a GPU is visible: marker gpu)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.anyio

GRAPH = {
    "format": "segfuse.fusion/1", "name": "issue15_ops",
    "inputs": [{"name": "x", "dtype": "float32", "shape": ["R", 12]},
               {"name": "i", "dtype": "int64", "shape": [7]},
               {"name": "v", "dtype": "float32", "shape": [7, 12]}],
    "ops": [{"op": "softmax", "out": "p", "inputs": ["x"], "dim": 1},
            {"op": "log_softmax", "out": "lp", "inputs": ["x"], "dim": 0},
            {"op": "logsumexp", "out": "l", "inputs": ["x"], "dims": [1]},
            {"op": "var_mean", "out": ["var", "mean"], "inputs": ["x"], "dims": 0, "correction": 0},
            {"op": "std", "out": "sd", "inputs": ["x"], "dims": [1], "keepdim": True},
            {"op": "cummax", "out": ["cmv", "cmi"], "inputs": ["x"], "dim": 1},
            {"op": "cummin", "out": ["cnv", "cni"], "inputs": ["x"], "dim": 0},
            {"op": "select", "out": "row", "inputs": ["x"], "dim": 0, "index": -1},
            {"op": "index_reduce", "out": "ir", "inputs": ["x", "i", "v"], "dim": 0, "reduce": "mean",
             "include_self": False},
            {"op": "index_reduce", "out": "ia", "inputs": ["x", "i", "v"], "dim": 0, "reduce": "amax"},
            {"op": "scatter", "out": "sm", "inputs": ["x", "cmi", "x"], "dim": 1, "reduce": "mean"}],
    "outputs": ["p", "lp", "l", "var", "mean", "sd", "cmv", "cmi", "cnv", "cni", "row", "ir", "ia", "sm"],
}


def _want(x, i, v) -> dict:
    tx, ti, tv = torch.from_numpy(x), torch.from_numpy(i), torch.from_numpy(v)
    var, mean = torch.var_mean(tx, 0, correction=0)
    cm, cn = torch.cummax(tx, 1), torch.cummin(tx, 0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # (index_reduce is in beta)
        ir = tx.index_reduce(0, ti, tv, "mean", include_self=False)
        ia = tx.index_reduce(0, ti, tv, "amax")
    return {"p": torch.softmax(tx, 1), "lp": torch.log_softmax(tx, 0), "l": torch.logsumexp(tx, [1]), "var": var,
            "mean": mean, "sd": torch.std(tx, [1], keepdim=True), "cmv": cm.values, "cmi": cm.indices,
            "cnv": cn.values, "cni": cn.indices, "row": tx[-1], "ir": ir, "ia": ia,
            "sm": tx.scatter_reduce(1, cm.indices, tx, "mean")}


async def test_every_new_op_over_http(asgi_server, server_backend):
    rng = np.random.default_rng(0)
    x = rng.integers(-4, 5, (6, 12)).astype(np.float32)  # (small integers: ties for cummax, exact sums)
    i, v = rng.integers(0, 6, 7), rng.standard_normal((7, 12)).astype(np.float32)
    async with asgi_server(backend=server_backend) as c:
        r = await c.post("/v2/fusions", json=GRAPH)
        assert r.status_code == 201, r.text
        fid = r.json()["id"]
        r = await c.get(f"/v2/fusions/{fid}/plan", params={"shape": "R=6"})
        assert r.status_code == 200, r.text
        plan = r.json()["plan"]
        assert any("#" in t for t in plan["tensors"]) and "p" in plan["tensors"]  # the expansion's tensors
        r = await c.post(f"/v2/models/{fid}/infer", json={"inputs": [
            {"name": "x", "shape": [6, 12], "datatype": "FP32", "data": x.reshape(-1).tolist()},
            {"name": "i", "shape": [7], "datatype": "INT64", "data": i.tolist()},
            {"name": "v", "shape": [7, 12], "datatype": "FP32", "data": v.reshape(-1).tolist()}]})
        assert r.status_code == 200, r.text
        got = {o["name"]: o for o in r.json()["outputs"]}
        for name, w in _want(x, i, v).items():
            o = got[name]
            assert o["shape"] == list(w.shape), name
            a = np.asarray(o["data"], dtype=np.float64).reshape(w.shape)
            np.testing.assert_allclose(a, w.double().numpy(), rtol=2e-5, atol=2e-5, err_msg=name)


async def test_bad_input_is_a_clear_4xx(asgi_server, server_backend):
    async with asgi_server(backend=server_backend) as c:
        bad = {**GRAPH, "ops": [{**GRAPH["ops"][8], "reduce": "prod", "include_self": True}], "outputs": ["ir"]}
        r = await c.post("/v2/fusions", json=bad)
        assert r.status_code == 400 and "did you mean 'mul'?" in r.text, r.text
        bad = {**GRAPH, "ops": [{"op": "softmaxx", "out": "p", "inputs": ["x"], "dim": 1}], "outputs": ["p"]}
        r = await c.post("/v2/fusions", json=bad)
        assert r.status_code == 400 and "did you mean 'softmax'" in r.text, r.text
        ok = {**GRAPH, "name": "ir_only", "ops": [GRAPH["ops"][8]], "outputs": ["ir"]}
        assert (await c.post("/v2/fusions", json=ok)).status_code == 201
        r = await c.post("/v2/models/ir_only/infer", json={"inputs": [
            {"name": "x", "shape": [2, 12], "datatype": "FP32", "data": [0.0] * 24},
            {"name": "i", "shape": [7], "datatype": "INT64", "data": [0, 1, 9, 0, 0, 0, 0]},
            {"name": "v", "shape": [7, 12], "datatype": "FP32", "data": [1.0] * 84}]})
        assert 400 <= r.status_code < 500, r.text
        assert "index_reduce: index 9 is out of bounds for dimension 0 with size 2" in r.text
