"""KServe's own REST client (kserve.InferenceRESTClient, protocol v2), unchanged, against a live
server: health, model readiness, infer with JSON and binary tensors, a large gzip response, and a
body naming another model. The client runs in a child process (tests/helpers/fresh_process.py: it
cannot share a process with tritonclient.grpc). Oracle: NumPy."""

from __future__ import annotations

import copy
import importlib.util
import uuid

import httpx
import numpy as np
import pytest
from helpers import kserve_client
from helpers.fresh_process import call
from helpers.graphs import ELEMENTWISE_CHAIN, MOE_PROBLEM_SIZES
from helpers.waiting import scaled

pytestmark = pytest.mark.skipif(importlib.util.find_spec("kserve") is None, reason="kserve is not installed")


def register(server, graph: dict) -> str:
    g = copy.deepcopy(graph)
    g["name"] = f"{graph['name']}_{uuid.uuid4().hex[:8]}"
    r = httpx.post(server.url + "/v2/fusions", json=g, timeout=scaled(30))
    assert r.status_code == 201, r.text
    return g["name"]


def test_health_and_model_ready(live_server):
    name = register(live_server, MOE_PROBLEM_SIZES)
    got = call(kserve_client.health, live_server.url, name, scaled(60))
    assert got == {"live": True, "ready": True, "model_ready": True, "unknown_model_ready": False}


def test_not_ready_keeps_the_error_body(live_server):
    rt = live_server.runtime
    rt.ready = False
    try:
        got = call(kserve_client.not_ready, live_server.url, scaled(60))
    finally:
        rt.ready = True
    assert got["ready_error"]["status"] == 503 and "not ready" in got["ready_error"]["text"]
    assert got["live"] is True


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_infer_request(live_server, binary):
    name = register(live_server, MOE_PROBLEM_SIZES)
    ids = np.random.default_rng(5).integers(0, 16, (128, 8), dtype=np.int64)
    res = call(kserve_client.infer, live_server.url, name, {"topk_ids": (ids, "INT64")}, binary,
                             scaled(60), "kserve-1", ["counts"])
    assert res["model_name"] == name and res["id"] == "kserve-1"
    np.testing.assert_array_equal(res["outputs"][0], np.bincount(ids.ravel(), minlength=16))


def test_infer_large_response(live_server):
    """httpx (under kserve) asks for gzip; the compressed infer response decodes to the right data."""
    name = register(live_server, ELEMENTWISE_CHAIN)
    rng = np.random.default_rng(6)
    n = 8192
    arrays = {k: rng.standard_normal(n).astype(np.float32) for k in "abc"}
    res = call(kserve_client.infer, live_server.url, name,
                             {k: (a, "FP32") for k, a in arrays.items()}, True, scaled(60))
    a, b, c = (arrays[k] for k in "abc")
    np.testing.assert_allclose(res["outputs"][0], np.where(a > 0, a * b + c, np.exp(c) * 0.5), rtol=1e-6)
    assert res["content_encoding"] == "gzip"


def test_model_name_mismatch_is_400(live_server):
    name = register(live_server, MOE_PROBLEM_SIZES)
    res = call(kserve_client.infer, live_server.url, name,
                             {"topk_ids": (np.array([[1]], np.int64), "INT64")}, False, scaled(60), None, None,
                             "someone_else")
    assert res["error"]["status"] == 400 and "body.model_name 'someone_else'" in res["error"]["text"]


def test_grpc_starts_in_a_process_with_kserve_and_serves_its_grpc_client():
    """segfuse's gRPC messages live in a descriptor pool of their own (server/grpc/messages.py), so an
    app embedded in a process that imported kserve (which defines the same protobuf symbols in the
    default pool) starts gRPC, and kserve's own gRPC client gets the right answers from it."""
    pytest.importorskip("grpc")
    graph = {**copy.deepcopy(MOE_PROBLEM_SIZES), "name": f"moe_{uuid.uuid4().hex[:8]}"}
    ids = np.random.default_rng(7).integers(0, 16, (64, 8), dtype=np.int64)
    got = call(kserve_client.grpc_beside_kserve, graph, ids)
    assert got["live"] is True and got["model_ready"] is True
    np.testing.assert_array_equal(got["counts"], np.bincount(ids.ravel(), minlength=16))
