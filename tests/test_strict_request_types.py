"""Request bodies are typed strictly, as their schema says: a string "true" or the number 1 is not
a boolean, a string "4", a float 4.0 or true is not an integer. A value of the wrong type is a 400
naming the field, and the request changes nothing stored (a lax parser read `"overwrite": "true"`
as true and replaced a stored buffer). JSON integers stay valid where the schema says number
(tensor data of a float tensor). Oracle: the values the test stored itself."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.anyio

IDS = [[1, 1], [2, 3]]
COUNTS = np.bincount(np.array(IDS).reshape(-1), minlength=16)


def assert_refused(r, loc: list) -> None:
    assert r.status_code == 400, (r.status_code, r.text)
    body = r.json()
    assert set(body) == {"error", "details"}, body
    assert any(d["loc"] == loc for d in body["details"]), (loc, body)


async def stored(c, name: str) -> dict:
    r = await c.get(f"/v2/buffers/{name}", headers={"Accept": "application/json"})
    assert r.status_code == 200, r.text
    return r.json()


async def put_json(c, name: str, doc: dict):
    return await c.put(f"/v2/buffers/{name}", json=doc)


@pytest.mark.parametrize("value", ["true", "yes", 1, "1"])
async def test_overwrite_must_be_a_boolean_and_a_refused_run_keeps_the_buffer(asgi_server, moe_graph, value):
    async with asgi_server() as c:
        assert (await c.post("/v2/fusions", json=moe_graph)).status_code == 201
        assert (await put_json(c, "counts", {"dtype": "int64", "shape": [16], "data": [7] * 16})).status_code == 201
        req = {"inputs": [{"name": "topk_ids", "shape": [2, 2], "datatype": "INT64", "data": IDS}],
               "outputs": [{"name": "counts", "parameters": {"buffer": "counts", "overwrite": value}}]}
        r = await c.post("/v2/models/moe_problem_sizes/infer", json=req)
        assert_refused(r, ["body", "outputs", 0, "parameters", "overwrite"])
        assert (await stored(c, "counts"))["data"] == [7] * 16
        req["outputs"][0]["parameters"]["overwrite"] = True  # the boolean itself still works
        assert (await c.post("/v2/models/moe_problem_sizes/infer", json=req)).status_code == 200
        assert (await stored(c, "counts"))["data"] == COUNTS.tolist()


@pytest.mark.parametrize("shape", [[True, 2], ["2", 2], [2.0, 2]])
async def test_a_buffer_shape_of_non_integers_is_refused_and_the_old_buffer_stays(asgi_server, shape):
    async with asgi_server() as c:
        assert (await put_json(c, "b", {"dtype": "int64", "shape": [4], "data": [1, 2, 3, 4]})).status_code == 201
        r = await put_json(c, "b", {"dtype": "int64", "shape": shape, "data": [9, 9, 9, 9]})
        assert_refused(r, ["body", "shape", shape.index(next(s for s in shape if type(s) is not int))])
        assert await stored(c, "b") == {"name": "b", "dtype": "int64", "shape": [4], "data": [1, 2, 3, 4]}


async def test_float_data_still_takes_json_integers(asgi_server):
    async with asgi_server() as c:
        assert (await put_json(c, "f", {"dtype": "float32", "shape": [3], "data": [1, 2.5, -3]})).status_code == 201
        assert (await stored(c, "f"))["data"] == [1.0, 2.5, -3.0]


@pytest.mark.parametrize("field,value,loc", [
    ("shape", ["2", 2], ["body", "inputs", 0, "shape", 0]),
    ("shape", [2.0, 2], ["body", "inputs", 0, "shape", 0]),
    ("parameters", {"binary_data_size": "32"}, ["body", "inputs", 0, "parameters", "binary_data_size"]),
])
async def test_infer_input_fields_are_strict(asgi_server, moe_graph, field, value, loc):
    async with asgi_server() as c:
        assert (await c.post("/v2/fusions", json=moe_graph)).status_code == 201
        inp = {"name": "topk_ids", "shape": [2, 2], "datatype": "INT64", "data": IDS, field: value}
        assert_refused(await c.post("/v2/models/moe_problem_sizes/infer", json={"inputs": [inp]}), loc)


@pytest.mark.parametrize("params,key", [({"timeout": "5"}, "timeout"), ({"priority": True}, "priority"),
                                        ({"binary_data_output": "false"}, "binary_data_output"),
                                        ({"sequence_start": 0}, "sequence_start")])
async def test_request_parameters_are_strict(asgi_server, moe_graph, params, key):
    async with asgi_server() as c:
        assert (await c.post("/v2/fusions", json=moe_graph)).status_code == 201
        body = {"inputs": [{"name": "topk_ids", "shape": [2, 2], "datatype": "INT64", "data": IDS}],
                "parameters": params}
        assert_refused(await c.post("/v2/models/moe_problem_sizes/infer", json=body), ["body", "parameters", key])


async def test_execute_replace_must_be_a_boolean_and_a_refused_call_keeps_the_fusion(asgi_server, moe_graph):
    async with asgi_server() as c:
        first = (await c.post("/v2/fusions", json=moe_graph)).json()["id"]
        other = dict(moe_graph, ops=[*moe_graph["ops"][:1],
                                     {"op": "full", "out": "zeros", "shape": [8], "value": 0, "dtype": "int64"},
                                     *moe_graph["ops"][2:]])
        r = await c.post("/v2/execute", json={"graph": other, "replace": "true", "inputs": [
            {"name": "topk_ids", "shape": [2, 2], "datatype": "INT64", "data": IDS}]})
        assert_refused(r, ["body", "replace"])
        assert (await c.get("/v2/fusions/moe_problem_sizes")).json()["id"] == first


@pytest.mark.parametrize("body,loc", [
    ({"key": "/segfuse_strict_test", "offset": 0, "byte_size": "64"}, ["body", "byte_size"]),
    ({"key": "/segfuse_strict_test", "offset": False, "byte_size": 64}, ["body", "offset"]),
    ({"key": "/segfuse_strict_test", "offset": 0.0, "byte_size": 64}, ["body", "offset"]),
])
async def test_region_registration_fields_are_strict(asgi_server, body, loc):
    async with asgi_server() as c:
        r = await c.post("/v2/systemsharedmemory/region/strict/register", json=body)
        assert_refused(r, loc)
        assert (await c.get("/v2/systemsharedmemory/status")).json() == []
