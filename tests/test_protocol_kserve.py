"""KServe's own REST client (kserve.InferenceRESTClient, protocol v2), unchanged, against a live
uvicorn server: health bodies, model readiness, infer(InferRequest) with JSON and binary tensors,
the body's model_name checked against the URL, and large (compressed) responses. Oracle: NumPy."""

from __future__ import annotations

import asyncio
import copy
import uuid

import httpx
import numpy as np
import pytest
from helpers.graphs import ELEMENTWISE_CHAIN, MOE_PROBLEM_SIZES
from helpers.waiting import scaled
from kserve import InferenceRESTClient, InferInput, InferRequest, RESTConfig
from kserve.protocol.infer_type import RequestedOutput


def register(server, graph: dict) -> str:
    g = copy.deepcopy(graph)
    g["name"] = f"{graph['name']}_{uuid.uuid4().hex[:8]}"
    r = httpx.post(server.url + "/v2/fusions", json=g, timeout=scaled(30))
    assert r.status_code == 201, r.text
    return g["name"]


def run(coro_fn):
    async def main():
        client = InferenceRESTClient(RESTConfig(protocol="v2", timeout=scaled(60)))
        try:
            return await coro_fn(client)
        finally:
            await client.close()

    return asyncio.run(main())


def test_health_and_model_ready(live_server):
    name = register(live_server, MOE_PROBLEM_SIZES)

    async def go(c):
        assert await c.is_server_live(live_server.url) is True
        assert await c.is_server_ready(live_server.url) is True
        assert await c.is_model_ready(live_server.url, name) is True
        assert await c.is_model_ready(live_server.url, "no_such_fusion") is False

    run(go)


def test_not_ready_keeps_the_error_body(live_server):
    rt = live_server.runtime

    async def go(c):
        rt.ready = False
        try:
            with pytest.raises(httpx.HTTPStatusError) as ei:
                await c.is_server_ready(live_server.url)
            assert ei.value.response.status_code == 503 and "not ready" in str(ei.value)
            assert await c.is_server_live(live_server.url) is True
        finally:
            rt.ready = True

    run(go)


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_infer_request(live_server, binary):
    name = register(live_server, MOE_PROBLEM_SIZES)
    ids = np.random.default_rng(5).integers(0, 16, (128, 8), dtype=np.int64)
    inp = InferInput("topk_ids", list(ids.shape), "INT64")
    inp.set_data_from_numpy(ids, binary_data=binary)
    req = InferRequest(name, [inp], request_id="kserve-1",
                       request_outputs=[RequestedOutput("counts", {"binary_data": binary})])

    async def go(c):
        return await c.infer(live_server.url, req, model_name=name)

    res = run(go)
    assert res.model_name == name and res.id == "kserve-1"
    np.testing.assert_array_equal(res.outputs[0].as_numpy(), np.bincount(ids.ravel(), minlength=16))


def test_infer_large_response(live_server):
    """httpx (under kserve) asks for gzip; the compressed infer response decodes to the right data."""
    name = register(live_server, ELEMENTWISE_CHAIN)
    rng = np.random.default_rng(6)
    n = 8192
    arrays = {k: rng.standard_normal(n).astype(np.float32) for k in "abc"}
    inputs = []
    for k, a in arrays.items():
        i = InferInput(k, [n], "FP32")
        i.set_data_from_numpy(a, binary_data=True)
        inputs.append(i)
    headers: dict = {}

    async def go(c):
        return await c.infer(live_server.url, InferRequest(name, inputs), model_name=name, response_headers=headers)

    res = run(go)
    a, b, c = (arrays[k] for k in "abc")
    np.testing.assert_allclose(res.outputs[0].as_numpy(), np.where(a > 0, a * b + c, np.exp(c) * 0.5), rtol=1e-6)
    assert headers.get("content-encoding") == "gzip"


def test_model_name_mismatch_is_400(live_server):
    name = register(live_server, MOE_PROBLEM_SIZES)
    inp = InferInput("topk_ids", [1, 1], "INT64")
    inp.set_data_from_numpy(np.array([[1]], np.int64), binary_data=False)

    async def go(c):
        with pytest.raises(httpx.HTTPStatusError) as ei:
            await c.infer(live_server.url, InferRequest("someone_else", [inp]), model_name=name)
        return ei.value

    e = run(go)
    assert e.response.status_code == 400 and "body.model_name 'someone_else'" in str(e)
