"""NaN and infinite literals in graphs are written as the strings "NaN", "Infinity" and
"-Infinity" (JSON has no number for them; tensor data uses the same strings): the client registers
a graph with them (it raised "Out of range float values are not JSON compliant"),
`FusionDefinition.to_json()` writes them, the server reads them as operands and attributes and
answers with them (a -inf fill came back as null, with the id of a +inf fill), and the JSON Schema
describes them. Oracle: PyTorch on the CPU; the schema through jsonschema."""

from __future__ import annotations

import json
import math
from pathlib import Path

import jsonschema
import numpy as np
import pytest
import torch
from segfuse.client import Client
from segfuse.compiler import FusionDefinition
from segfuse.compiler.errors import GraphError
from segfuse.compiler.ir import Fusion

SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "docs" / "fusion-1.schema.json").read_text())
NONFINITE = {"NaN", "Infinity", "-Infinity"}


def strict_json(text: str):
    """json.loads that refuses the bare NaN / Infinity tokens (not JSON)."""
    def refuse(token):
        raise ValueError(f"bare {token} in JSON")

    return json.loads(text, parse_constant=refuse)


def masked_softmax_and_scatter_amax() -> FusionDefinition:
    with FusionDefinition("masked_softmax_amax") as fd:
        x = fd.define_tensor("x", shape=["R", "C"], dtype="float32")
        mask = fd.define_tensor("mask", shape=["R", "C"], dtype="bool")
        idx = fd.define_tensor("idx", shape=["N"], dtype="int64")
        src = fd.define_tensor("src", shape=["N"], dtype="float32")
        probs = fd.ops.softmax(fd.ops.where(mask, x, float("-inf")), -1)
        amax = fd.ops.scatter(fd.ops.full([6], float("-inf"), "float32"), 0, idx, src, reduce="amax")
        capped = fd.ops.minimum(src, float("inf"))
        fd.add_output(probs, "probs")
        fd.add_output(amax, "amax")
        fd.add_output(capped, "capped")
    return fd


def inputs() -> dict:
    rng = np.random.default_rng(3)
    mask = rng.random((4, 7)) < 0.6
    mask[2] = False  # a fully masked row: softmax of all -inf is NaN, as in PyTorch
    return {"x": rng.standard_normal((4, 7)).astype(np.float32), "mask": mask,
            "idx": np.array([0, 2, 2, 5, 0, 2], np.int64), "src": rng.standard_normal(6).astype(np.float32)}


def expected(ins: dict) -> dict:
    x, mask, idx, src = (torch.from_numpy(ins[k]) for k in ("x", "mask", "idx", "src"))
    probs = torch.softmax(torch.where(mask, x, float("-inf")), -1)
    amax = torch.full((6,), float("-inf")).scatter_reduce(0, idx, src, reduce="amax")
    return {"probs": probs.numpy(), "amax": amax.numpy(), "capped": torch.minimum(src, torch.tensor(math.inf)).numpy()}


def test_to_json_writes_the_strings_and_reads_them_back():
    fd = masked_softmax_and_scatter_amax()
    doc = strict_json(fd.to_json())
    written = [v for op in doc["ops"] for v in [*op.get("inputs", []), *op.values()]
               if isinstance(v, str) and v in NONFINITE]
    assert written.count("-Infinity") == 2 and written.count("Infinity") == 1, doc["ops"]
    again = FusionDefinition.from_json(fd.to_json())
    assert strict_json(again.to_json()) == doc
    assert Fusion.from_json(doc).id == fd.fusion().id
    np.testing.assert_array_equal(fd.execute(inputs())["amax"], expected(inputs())["amax"])


def test_the_client_registers_and_runs_a_graph_with_infinite_literals(live_server):
    fd = masked_softmax_and_scatter_amax()
    with Client(live_server.url) as c:
        ref = c.register(fd)
        assert ref.id == fd.fusion().id
        graph = c.fusion(ref)["graph"]
        assert [op.get("value") for op in graph["ops"] if op["op"] == "full"] == ["-Infinity"]
        ins = inputs()
        got = c.run(ref, inputs=ins)
        for k, want in expected(ins).items():
            np.testing.assert_allclose(got[k], want, rtol=1e-6, atol=1e-7, equal_nan=True, err_msg=k)
        assert np.isnan(got["probs"][2]).all() and got["amax"][1] == -np.inf
        as_dict = json.loads(fd.to_json())  # a graph dict and a file register the same fusion
        assert c.register(as_dict).id == ref.id


def _fill(value) -> dict:
    return {"format": "segfuse.fusion/1", "name": "fill",
            "inputs": [{"name": "x", "dtype": "float32", "shape": [3]}],
            "ops": [{"op": "full_like", "out": "y", "inputs": ["x"], "value": value},
                    {"op": "maximum", "out": "z", "inputs": ["y", value]}],
            "outputs": ["z"]}


@pytest.mark.parametrize("text,value", [("-Infinity", -math.inf), ("Infinity", math.inf), ("NaN", math.nan)])
def test_the_server_reads_and_writes_the_strings(asgi_server, text, value):
    import anyio

    async def go():
        async with asgi_server() as c:
            r = await c.post("/v2/fusions", json=_fill(text))
            assert r.status_code == 201, r.text
            graph = (await c.get(f"/v2/fusions/{r.json()['id']}")).json()["graph"]
            assert graph["ops"][0]["value"] == text and graph["ops"][1]["inputs"] == ["y", text]
            out = await c.post(f"/v2/models/{r.json()['id']}/infer",
                               json={"inputs": [{"name": "x", "shape": [3], "datatype": "FP32", "data": [1, 2, 3]}]})
            assert out.status_code == 200, out.text
            want = np.maximum(np.full(3, value, np.float32), np.float32(value))
            assert out.json()["outputs"][0]["data"] == [text] * 3 and (np.isnan(want).all() or (want == value).all())
            return r.json()["id"]

    assert anyio.run(go) == Fusion.from_json(_fill(value)).id


def _full_only(value) -> dict:
    return {"name": "full", "ops": [{"op": "full", "out": "y", "shape": [3], "value": value, "dtype": "float32"}],
            "outputs": ["y"]}


@pytest.mark.parametrize("graph", [_fill, _full_only])
def test_distinct_non_finite_fills_are_distinct_fusions(graph):
    """The id hashes the canonical graph, where -inf, +inf and NaN attributes were all null."""
    ids = [Fusion.from_json(graph(v)).id for v in (-math.inf, math.inf, math.nan, 0.0)]
    assert len(set(ids)) == 4
    assert [Fusion.from_json(graph(v)).id for v in ("-Infinity", "Infinity", "NaN")] == ids[:3]
    assert [Fusion.from_json(graph(v)).to_json()["ops"][0]["value"] for v in (-math.inf, math.inf, math.nan)] == \
        ["-Infinity", "Infinity", "NaN"]


def test_the_schema_describes_the_strings():
    fd = masked_softmax_and_scatter_amax()
    jsonschema.validate(strict_json(fd.to_json()), SCHEMA)
    for text in NONFINITE:
        jsonschema.validate(_fill(text), SCHEMA)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(_fill("-inf"), SCHEMA)


@pytest.mark.parametrize("name", ["NaN", "Infinity"])
def test_a_tensor_cannot_take_the_name_of_a_literal(name):
    g = _fill(0.0)
    g["inputs"][0]["name"] = name
    g["ops"][0]["inputs"] = [name]
    with pytest.raises(GraphError, match=f"'{name}'.*reserved"):
        Fusion.from_json(g)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(g, SCHEMA)


def test_the_server_still_reads_bare_tokens_as_the_same_fusion(asgi_server):
    """Python's json.dumps writes -Infinity bare (not JSON): the server takes it, as the strings."""
    import anyio

    async def go():
        async with asgi_server() as c:
            body = json.dumps(_full_only(-math.inf)).encode()
            assert b"-Infinity" in body and b'"-Infinity"' not in body
            r = await c.post("/v2/fusions", content=body, headers={"Content-Type": "application/json"})
            assert r.status_code == 201, r.text
            return r.json()["id"]

    assert anyio.run(go) == Fusion.from_json(_full_only("-Infinity")).id


@pytest.mark.parametrize("attr", ["start", "step"])
@pytest.mark.parametrize("text", ["Infinity", "-Infinity", "NaN"])
def test_an_iota_bound_must_be_finite(attr, text):
    """As torch.arange refuses one (torch.arange(0, inf) raises), validation does, naming it."""
    start, step = (float(text), 1.0) if attr == "start" else (0.0, float(text))
    with pytest.raises(RuntimeError):
        torch.arange(start, start + 4 * step, step)  # iota(4, start, step) as PyTorch writes it
    g = {"name": "iota", "ops": [{"op": "iota", "out": "y", "length": 4, "dtype": "float32", attr: text}],
         "outputs": ["y"]}
    with pytest.raises(GraphError, match=f"ops\\[0\\].{attr}: {attr} must be finite"):
        Fusion.from_json(g)
