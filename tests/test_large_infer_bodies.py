"""Large infer and execute bodies are decoded by the JSON codec process (server/request_bodies.py),
never on the event loop, and answered exactly as the same request sent small.

Oracle: the same request parsed in-process. JSON allows whitespace after the document, so a body
padded with 1 MiB of spaces is the same request taking the large path; every answer (status, error,
details, outputs) must equal the small one's. Results are also checked against NumPy."""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest
from helpers.health import assert_health_stayed_free, slowest_health_while
from helpers.waiting import scaled

pytestmark = pytest.mark.anyio

PAD = b" " * (1 << 20)  # from codec.LARGE up, a body goes to the codec process
MOE = "/v2/models/moe_problem_sizes/infer"
CHAIN = "/v2/models/elementwise_chain/infer"


def topk(data, shape=(2, 2), **extra) -> dict:
    return {"name": "topk_ids", "datatype": "INT64", "shape": list(shape), "data": data, **extra}


def chain_inputs(a, b, c) -> list[dict]:
    return [{"name": n, "datatype": "FP32", "shape": [len(v)], "data": v} for n, v in zip("abc", (a, b, c))]


# (path, JSON body) pairs: valid requests and each way a request can be refused
CASES = {
    "valid": (MOE, {"inputs": [topk([1, 2, 3, 3])]}),
    "valid-nested": (MOE, {"inputs": [topk([[1, 2], [3, 15]])], "id": "x"}),
    "special-floats": (CHAIN, {"inputs": chain_inputs([1.0, "NaN", -2.0], ["Infinity", 2.0, 3.0],
                                                        [0.5, "-Infinity", 1.0])}),
    "out-of-range": (MOE, {"inputs": [topk([1, 2, 2 ** 70, 3])]}),
    "wrong-count": (MOE, {"inputs": [topk([1, 2, 3])]}),
    "ragged": (MOE, {"inputs": [topk([[1, 2], [3]])]}),
    "strings": (MOE, {"inputs": [topk(["a", 1, 2, 3])]}),
    "bad-datatype": (MOE, {"inputs": [{**topk([1, 2, 3, 4]), "datatype": "INT99"}]}),
    "no-shape": (MOE, {"inputs": [{"name": "topk_ids", "datatype": "INT64", "data": [1, 2, 3, 4]}]}),
    "rank-over-limit": (MOE, {"inputs": [topk([1], shape=[1] * 9)]}),
    "twice-with-bad-data": (MOE, {"inputs": [topk([1, 2, 3, 3]), topk([1, 2, 2 ** 70, 3])]}),
    "buffer-and-data": (MOE, {"inputs": [topk([1, 2, 3, 4], parameters={"buffer": "b"})]}),
    "binary-size-without-header": (MOE, {"inputs": [topk([1, 2, 3, 4], parameters={"binary_data_size": 32})]}),
    "model-name-and-bad-data": (MOE, {"model_name": "other", "inputs": [topk([1, 2, 3])]}),
    "huge-timeout-and-bad-data": (MOE, {"parameters": {"timeout": 10 ** 400}, "inputs": [topk([1, 2, 3])]}),
    "extra-field": (MOE, {"inputs": [{**topk([1, 2, 3, 4]), "colour": "red"}]}),
    "unknown-output": (MOE, {"inputs": [topk([1, 2, 3, 4])], "outputs": [{"name": "nope"}]}),
    "not-an-object": (MOE, [1, 2, 3]),
    "triton-parameters": (MOE, {"inputs": [topk([1, 2, 3, 3])], "parameters": {
        "priority": 5, "sequence_id": "s-1", "sequence_start": True, "my_custom": 0.5}}),
    "unknown-top-level-field": (MOE, {"inputs": [topk([1, 2, 3, 3])], "client_note": {"a": [1]}}),
    "custom-parameter-object": (MOE, {"inputs": [topk([1, 2, 3, 3])], "parameters": {"my_custom": {"a": 1}}}),
}


def comparable(r) -> dict:
    doc = r.json()
    doc.get("parameters", {}).pop("timings_us", None)
    for key in ("cache_hits", "cache_misses", "kernels_compiled"):
        doc.get("parameters", {}).pop(key, None)
    return {"status": r.status_code, "body": doc}


async def register(c, *graphs) -> None:
    for g in graphs:
        assert (await c.post("/v2/fusions", json=g)).status_code == 201


def codec_calls(c, monkeypatch) -> list[str]:
    """The names of the calls the server makes to its codec process, as they are made."""
    codec, calls = c.app.state.server_state.codec, []
    real = codec.call

    async def spy(name, *args):
        calls.append(name)
        return await real(name, *args)

    monkeypatch.setattr(codec, "call", spy)
    return calls


@pytest.mark.parametrize("case", sorted(CASES))
async def test_a_large_body_is_answered_as_the_same_small_one(asgi_server, moe_graph, chain_graph, case,
                                                             monkeypatch):
    path, doc = CASES[case]
    small = json.dumps(doc).encode()
    async with asgi_server() as c:
        await register(c, moe_graph, chain_graph)
        calls = codec_calls(c, monkeypatch)
        r_small = await c.post(path, content=small)
        assert calls == []  # parsed in-process
        r_large = await c.post(path, content=small + PAD)
        assert calls == ["request"]  # parsed by the codec process
        assert comparable(r_large) == comparable(r_small)
        if case in ("valid", "triton-parameters", "unknown-top-level-field"):  # and the oracle: np.bincount
            assert r_large.json()["outputs"][0]["data"] == np.bincount([1, 2, 3, 3], minlength=16).tolist()
        assert r_small.status_code < 500


@pytest.mark.parametrize("body,text", [
    (b'{"inputs": [1,,2]}', "not valid JSON"),
    (b'{"inputs": [{"name": "\xff"}]}', "not UTF-8"),
])
async def test_malformed_large_bodies_get_the_small_bodies_error(asgi_server, moe_graph, chain_graph, body, text):
    async with asgi_server() as c:
        await register(c, moe_graph, chain_graph)
        r_small, r_large = await c.post(MOE, content=body), await c.post(MOE, content=body + PAD)
        assert r_small.status_code == r_large.status_code == 400
        assert text in r_large.json()["error"] and r_large.json() == r_small.json()


async def test_large_inline_data_round_trips(asgi_server, moe_graph, chain_graph):
    """Data large enough to matter (not padding): results equal NumPy's, on both infer routes,
    chunked (no Content-Length) and with a Content-Length."""
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 16, (150_000, 2))
    a, b, cc = (rng.standard_normal(100_000).astype(np.float32) for _ in range(3))
    moe = json.dumps({"inputs": [topk(ids.tolist(), ids.shape)]}).encode()
    chain = json.dumps({"inputs": chain_inputs(a.tolist(), b.tolist(), cc.tolist()),
                        "outputs": [{"name": "out"}]}).encode()
    assert len(moe) > 1 << 20 and len(chain) > 1 << 20

    async def chunked(body):
        for i in range(0, len(body), 100_000):
            yield body[i:i + 100_000]

    async with asgi_server() as c:
        await register(c, moe_graph, chain_graph)
        expected = np.bincount(ids.reshape(-1), minlength=16).tolist()
        for path in (MOE, "/v2/models/moe_problem_sizes/versions/1/infer"):
            for content in (moe, chunked(moe)):
                r = await c.post(path, content=content)
                assert r.status_code == 200, r.text
                assert r.json()["outputs"][0]["data"] == expected
        r = await c.post(CHAIN, content=chain)
        assert r.status_code == 200, r.text
        want = np.where(a > 0, a * b + cc, np.exp(cc) * np.float32(0.5))
        np.testing.assert_allclose(np.asarray(r.json()["outputs"][0]["data"], np.float32), want, rtol=1e-6)
        c.app.state.fast_lane = False  # the FastAPI route (and /v2/execute) take the same path
        r = await c.post(MOE, content=moe)
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == expected
        execute = json.dumps({"graph": moe_graph, "inputs": [topk(ids.tolist(), ids.shape)]}).encode()
        r = await c.post("/v2/execute", content=execute)
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == expected
        bad = json.dumps({"graph": moe_graph, "inputs": [topk([1, 2, 3])]}).encode()
        r_small, r_large = await c.post("/v2/execute", content=bad), await c.post("/v2/execute", content=bad + PAD)
        assert r_small.status_code == 400 and r_large.json() == r_small.json()


async def test_large_binary_bodies(asgi_server, moe_graph, chain_graph):
    """With the binary extension: a large JSON header goes to the codec process, a small header with
    a large raw tail stays in host memory; inline and binary inputs mix, in input order."""
    rng = np.random.default_rng(1)
    a, b, cc = (rng.standard_normal(300_000).astype(np.float32) for _ in range(3))
    n = a.size
    inputs = [{"name": "a", "datatype": "FP32", "shape": [n], "parameters": {"binary_data_size": 4 * n}},
              {"name": "b", "datatype": "FP32", "shape": [n], "data": b.tolist()},
              {"name": "c", "datatype": "FP32", "shape": [n], "parameters": {"binary_data_size": 4 * n}}]
    want = np.where(a > 0, a * b + cc, np.exp(cc) * np.float32(0.5))
    big_header = json.dumps({"inputs": inputs}).encode()
    small_header = json.dumps({"inputs": [inputs[0], {**inputs[1], "data": None,
                                                      "parameters": {"binary_data_size": 4 * n}}, inputs[2]]},
                              ).encode().replace(b', "data": null', b"")
    async with asgi_server() as c:
        await register(c, moe_graph, chain_graph)
        for header, tail in ((big_header, a.tobytes() + cc.tobytes()),
                             (small_header, a.tobytes() + b.tobytes() + cc.tobytes())):
            r = await c.post(CHAIN, content=header + tail, headers={"inference-header-content-length": str(len(header))})
            assert r.status_code == 200, r.text
            np.testing.assert_allclose(np.asarray(r.json()["outputs"][0]["data"], np.float32), want, rtol=1e-6)
        # a tail one tensor short, and one byte long: the errors of a small body
        for tail in (a.tobytes(), a.tobytes() + cc.tobytes() + b"x"):
            r_large = await c.post(CHAIN, content=big_header + tail,
                                   headers={"inference-header-content-length": str(len(big_header))})
            assert r_large.status_code == 400, r_large.text
            assert "binary" in r_large.json()["error"]
        r = await c.post(CHAIN, content=big_header, headers={"inference-header-content-length": str(len(big_header) + 1)})
        assert r.status_code == 400 and "outside the body" in r.json()["error"]


# ---- the event loop stays free: health answers while a large body is decoded --------------------
def digits_json(ids: np.ndarray) -> bytes:
    """A JSON list of one-digit numbers, made without a Python loop."""
    out = np.full(2 * ids.size + 1, ord(","), np.uint8)
    out[0], out[-1] = ord("["), ord("]")
    out[1:-1:2] = ids.astype(np.uint8) + ord("0")
    return out.tobytes()


async def test_health_answers_while_a_large_inline_json_infer_is_decoded(moe_graph):
    n = 20_000_000  # 40 MB of JSON
    ids = np.random.default_rng(2).integers(0, 10, n)
    body = (b'{"inputs": [{"name": "topk_ids", "datatype": "INT64", "shape": [%d, 2], "data": ' % (n // 2)
            + digits_json(ids) + b"}]}")
    from helpers.processes import SEGFUSE, server_process

    with server_process([*SEGFUSE, "serve"]) as url:  # its own process: the client never shares its GIL
        async with httpx.AsyncClient(base_url=url, timeout=scaled(120)) as c:
            assert (await c.post("/v2/fusions", json=moe_graph)).status_code == 201
            # (this first large body also starts the codec process)
            slowest, answered, r, took = await slowest_health_while(url, c.post(MOE, content=body))
            assert r.status_code == 200, r.text
            assert r.json()["outputs"][0]["data"] == np.bincount(ids, minlength=16).tolist()
            assert_health_stayed_free(slowest, answered, took, at_least=5)
