"""Every invalid request is a 400, as Triton answers one, with segfuse's message and `loc`; the
fields Triton accepts (priority, sequence parameters, custom parameters, unknown top-level fields)
are accepted. The fast lane (server/fastlane.py) and the FastAPI route answer alike, JSON and binary.

Oracles: the statuses and accepted fields a real Triton 2.51 answered for the same requests (listed
in docs/http-api.md, "Request parameters"), NumPy's bincount for the results, and the count of
requests this test sent with a priority."""

from __future__ import annotations

import json

import numpy as np
import pytest
from helpers.graphs import counts_of
from helpers.service import assert_error, put_raw
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.anyio

MOE = "/v2/models/moe_problem_sizes/infer"
IDS = np.array([[1, 3], [3, 15]], np.int64)


def topk(**kw) -> dict:
    return {"name": "topk_ids", "shape": list(IDS.shape), "datatype": "INT64", "data": IDS.ravel().tolist(), **kw}


def binary(doc: dict, tail: bytes) -> tuple[bytes, dict]:
    """(body, headers) of the binary tensor data extension: the JSON header, then `tail`."""
    head = json.dumps(doc).encode()
    return head + tail, {"Inference-Header-Content-Length": str(len(head)), "Content-Type": "application/octet-stream"}


def raw_topk(a: np.ndarray, datatype: str = "INT64", shape=None) -> dict:
    return {"name": "topk_ids", "shape": list(a.shape if shape is None else shape), "datatype": datatype,
            "parameters": {"binary_data_size": a.nbytes}}


# (what, JSON infer body or (body, headers) of a binary one, text of the message, loc of the first detail)
INVALID_INFERS = [
    ("wrong datatype", {"inputs": [topk(datatype="INT32")]}, "int32", ["inputs", "topk_ids"]),
    ("wrong shape", {"inputs": [topk(shape=[4])]}, "rank 1", ["inputs", "topk_ids"]),
    ("missing input", {"inputs": []}, "missing input", ["inputs", "topk_ids"]),
    ("unknown input", {"inputs": [topk(), topk(name="other")]}, "unknown input", None),
    ("unknown output", {"inputs": [topk()], "outputs": [{"name": "nope"}]}, "not an output",
     ["outputs", 0, "name"]),
    ("data out of the datatype's range", {"inputs": [topk(data=[1, 2, 2 ** 63, 3])]}, "out of range",
     ["inputs", 0, "data"]),
    ("index out of range at run time", {"inputs": [topk(data=[1, 2, 16, 3])]}, "out of bounds", ["ops", 3]),
    ("binary: wrong datatype", binary({"inputs": [raw_topk(IDS.astype(np.int32), "INT32")]},
                                      IDS.astype(np.int32).tobytes()), "int32", ["inputs", "topk_ids"]),
    ("binary: wrong shape", binary({"inputs": [raw_topk(IDS, shape=[4])]}, IDS.tobytes()), "rank 1",
     ["inputs", "topk_ids"]),
    ("binary: unknown output", binary({"inputs": [raw_topk(IDS)], "outputs": [{"name": "nope"}]}, IDS.tobytes()),
     "not an output", ["outputs", 0, "name"]),
]


async def post_infer(c, body):
    if isinstance(body, tuple):
        return await c.post(MOE, content=body[0], headers=body[1])
    return await c.post(MOE, json=body)


def priority_requests(text: str) -> float:
    (fam,) = [f for f in text_string_to_metric_families(text) if f.name == "segfuse_infer_priority_requests"]
    return next(s.value for s in fam.samples if s.name.endswith("_total"))


async def test_invalid_infer_requests_are_400_on_the_fast_lane_and_the_route(asgi_server, moe_graph):
    async with asgi_server() as c:
        assert (await c.post("/v2/fusions", json=moe_graph)).status_code == 201
        answers = {}
        for fast_lane in (True, False):
            c.app.state.fast_lane = fast_lane
            for what, body, text, loc in INVALID_INFERS:
                r = await post_infer(c, body)
                got = assert_error(r, 400, text)
                if loc is not None:
                    assert got["details"][0]["loc"][:len(loc)] == loc, (what, got)
                answers.setdefault(what, []).append(got)
            r = await post_infer(c, {"inputs": [topk()]})  # the server still runs valid requests
            assert r.status_code == 200 and r.json()["outputs"][0]["data"] == counts_of(IDS).tolist()
        for what, (fast, routed) in answers.items():
            assert fast == routed, what


async def test_invalid_graphs_buffers_and_plans_are_400(asgi_server, moe_graph, scatter_add_graph):
    """The segfuse-specific routes follow the same rule: an invalid graph, a reserved name, a plan for
    sizes the graph cannot take, buffer data its datatype cannot hold, inline data where a buffer
    is updated in place."""
    async with asgi_server() as c:
        bad_graph = {**moe_graph, "ops": [*moe_graph["ops"][:3], {"op": "nope", "out": "counts", "inputs": []}]}
        body = assert_error(await c.post("/v2/fusions", json=bad_graph), 400, "invalid graph", "unknown op")
        assert body["details"][0]["loc"][:2] == ["ops", 3]
        assert_error(await c.post("/v2/fusions", json={**moe_graph, "name": "stats"}), 400, "reserved")
        body = assert_error(await c.post("/v2/repository/models/moe_problem_sizes/load",
                                         json={"parameters": {"config": json.dumps(bad_graph)}}), 400, "unknown op")
        assert body["details"][0]["loc"][:3] == ["parameters", "config", "ops"]
        body = assert_error(await c.post("/v2/execute", json={"graph": bad_graph, "inputs": [topk()]}), 400, "nope")
        assert body["details"][0]["loc"][:2] == ["graph", "ops"]
        assert (await c.post("/v2/fusions", json=moe_graph)).status_code == 201
        assert_error(await c.get("/v2/fusions/moe_problem_sizes/plan", params={"shape": "T=4"}), 400, "K")
        r = await c.put("/v2/buffers/b", json={"dtype": "int8", "shape": [2], "data": [1, 300]})
        assert_error(r, 400, "out of range")
        assert (await c.post("/v2/fusions", json=scatter_add_graph)).status_code == 201
        dst = np.arange(8, dtype=np.float32)
        inline = {"inputs": [{"name": "dst", "shape": [8], "datatype": "FP32", "data": dst.tolist()},
                             {"name": "index", "shape": [1], "datatype": "INT64", "data": [0]},
                             {"name": "src", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
        name = scatter_add_graph["name"]
        assert_error(await c.post(f"/v2/models/{name}/infer", json=inline), 400, "alias_of")
        # and a buffer given with a datatype that is not the stored one
        assert (await put_raw(c, "ids", IDS)).status_code == 201
        r = await c.post(MOE, json={"inputs": [{"name": "topk_ids", "datatype": "INT32", "shape": [2, 2],
                                                "parameters": {"buffer": "ids"}}]})
        assert_error(r, 400, "INT32", "ids")


async def test_triton_parameters_and_unknown_fields_are_accepted_on_both_paths(asgi_server, moe_graph):
    """priority, sequence_id/start/end, custom parameters and unknown top-level fields: 200 with the
    right counts; each request that carried a priority is counted once (a body seen before is served
    from the parsed-request cache: counted too)."""
    bodies = [
        {"inputs": [topk()], "parameters": {"priority": 1}},
        {"inputs": [topk()], "parameters": {"priority": 0}},
        {"inputs": [topk()], "parameters": {"sequence_id": 42, "sequence_start": True, "sequence_end": False}},
        {"inputs": [topk()], "parameters": {"sequence_id": "session-a", "sequence_end": True}},
        {"inputs": [topk()], "parameters": {"my_flag": True, "my_level": 3, "my_ratio": 0.25, "my_name": "x"}},
        {"inputs": [topk()], "client_note": {"nested": [1, 2]}, "trace_id": "abc"},
        binary({"inputs": [raw_topk(IDS)], "parameters": {"priority": 9, "sequence_id": 3, "my_flag": "on"},
                "client_note": 1}, IDS.tobytes()),
    ]
    with_priority = 3  # the first two (a priority of 0 is carried too) and the binary one
    async with asgi_server() as c:
        assert (await c.post("/v2/fusions", json=moe_graph)).status_code == 201
        before = priority_requests((await c.get("/metrics")).text)
        for fast_lane in (True, False):
            c.app.state.fast_lane = fast_lane
            for _ in range(2):  # the second time from the parsed-request cache
                for body in bodies:
                    r = await post_infer(c, body)
                    assert r.status_code == 200, (body, r.text)
                    out = r.json()["outputs"][0]
                    assert out["data"] == counts_of(IDS).tolist(), body
        after = priority_requests((await c.get("/metrics")).text)
        assert after - before == 2 * 2 * with_priority  # both paths, twice each


async def test_request_parameters_of_the_wrong_kind_are_400(asgi_server, moe_graph):
    """Known ones of the wrong type or range, custom ones that are not a string, number or boolean
    (Triton: 500 for the first, 400 for the second)."""
    cases = [({"priority": -1}, "priority"), ({"priority": 2 ** 64}, "priority"), ({"priority": "high"}, "priority"),
             ({"sequence_id": -1}, "sequence_id"), ({"sequence_id": 2 ** 64}, "sequence_id"),
             ({"sequence_id": True}, "sequence_id"), ({"sequence_end": 1}, "sequence_end"),
             ({"timeout": 1.5}, "timeout"), ({"binary_data_output": "yes"}, "binary_data_output"),
             ({"my_custom": {"a": 1}}, "my_custom"), ({"my_custom": [1]}, "my_custom"), ({"my_custom": None}, "my_custom")]
    async with asgi_server() as c:
        assert (await c.post("/v2/fusions", json=moe_graph)).status_code == 201
        for fast_lane in (True, False):
            c.app.state.fast_lane = fast_lane
            for params, key in cases:
                body = assert_error(await c.post(MOE, json={"inputs": [topk()], "parameters": params}), 400, key)
                assert body["details"][0]["loc"][-2:] == ["parameters", key], (params, body)
        # the largest values Triton's uint64 takes are accepted
        r = await c.post(MOE, json={"inputs": [topk()], "parameters": {"priority": 2 ** 64 - 1,
                                                                       "sequence_id": 2 ** 64 - 1}})
        assert r.status_code == 200 and r.json()["outputs"][0]["data"] == counts_of(IDS).tolist(), r.text
