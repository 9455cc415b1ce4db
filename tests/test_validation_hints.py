"""Bad input stays a clear error (issue 15, item 5): an unknown op, attribute, field or attribute
value gets a "did you mean" when one is close (difflib) or when it is PyTorch's name for a segfuse
value ("sum" for a scatter's "add"), in the issue that names the field; nothing is suggested when
nothing is close. Also over HTTP: a 400 with the hint in the detail."""

from __future__ import annotations

import re

import pytest
from helpers.processes import ROOT
from segfuse.compiler import Fusion, GraphError

X = [{"name": "x", "dtype": "float32", "shape": [4]}, {"name": "i", "dtype": "int64", "shape": [4]}]


def _issues(ops, **top) -> list:
    g = {"format": "segfuse.fusion/1", "inputs": X, "ops": ops, "outputs": [ops[-1]["out"]], **top}
    with pytest.raises(GraphError) as e:
        Fusion.from_json(g)
    return [(i.loc, i.msg) for i in e.value.issues]


def _scatter(**attrs):
    return [{"op": "scatter", "out": "o", "inputs": ["x", "i", "x"], "dim": 0, **attrs}]


@pytest.mark.parametrize("given, meant", [("sum", "add"), ("prod", "mul"), ("max", "amax"), ("min", "amin"),
                                          ("SUM", "add"), ("ad", "add"), ("amx", "amax")])
def test_scatter_reduce_names_get_the_segfuse_name(given, meant):
    ((loc, msg),) = _issues(_scatter(reduce=given))
    assert loc == ("ops", 0, "reduce")
    assert msg.endswith(f"; did you mean '{meant}'?"), msg
    assert "'none', 'add', 'mul', 'amax', 'amin' or 'mean'" in msg


def test_nothing_close_no_hint():
    ((_, msg),) = _issues(_scatter(reduce="xyzzy"))
    assert "did you mean" not in msg
    ((_, msg),) = _issues([{"op": "qqqq", "out": "o", "inputs": ["x"]}])
    assert msg == "unknown op 'qqqq'"
    ((_, msg),) = _issues([{"op": "sum", "out": "o", "inputs": ["x"], "zzzzzz": 1}])
    assert "did you mean" not in msg


@pytest.mark.parametrize("given, meant", [("keepdims", "'keepdim'"), ("dim", "'dims'"), ("input", "'inputs'"),
                                          ("dtpye", "'dtype'")])
def test_unknown_attribute_names_the_close_one(given, meant):
    ((loc, msg),) = _issues([{"op": "sum", "out": "o", "inputs": ["x"], given: 1}])
    assert loc == ("ops", 0, given)
    assert msg.startswith("unknown attribute for op 'sum' (its attributes: dims, keepdim, dtype); did you mean ")
    assert meant in msg.split("did you mean")[1]


@pytest.mark.parametrize("op, meant", [("summ", "sum"), ("cumsumm", "cumsum"), ("scatter_add", "scatter"),
                                       ("argmaxx", "argmax")])
def test_unknown_op_names_the_close_one(op, meant):
    ((loc, msg),) = _issues([{"op": op, "out": "o", "inputs": ["x"]}])
    assert loc == ("ops", 0, "op") and msg.startswith(f"unknown op '{op}'; did you mean '{meant}'"), msg


@pytest.mark.parametrize("given, meant", [("half", "float16"), ("double", "float64"), ("long", "int64"),
                                          ("float", "float32"), ("float3", "float32")])
def test_dtype_names_torch_users_type(given, meant):
    ((loc, msg),) = _issues([{"op": "cast", "out": "o", "inputs": ["x"], "dtype": given}])
    assert loc == ("ops", 0, "dtype") and f"did you mean '{meant}'" in msg, msg
    issues = _issues([{"op": "neg", "out": "o", "inputs": ["x"]}],
                     inputs=[{"name": "x", "dtype": given, "shape": [4]}])
    assert issues[0][0] == ("inputs", 0, "dtype") and f"did you mean '{meant}'" in issues[0][1]


def test_unknown_graph_fields_name_the_close_one():
    issues = dict(_issues([{"op": "neg", "out": "o", "inputs": ["x"]}], outputz=["o"]))
    assert issues[("outputz",)] == "unknown field; did you mean 'outputs'?"
    issues = dict(_issues([{"op": "neg", "out": "o", "inputs": ["x"]}],
                          inputs=[{"name": "x", "dtype": "float32", "shap": [4]}]))
    assert issues[("inputs", 0, "shap")] == "unknown field; did you mean 'shape'?"


@pytest.mark.anyio
async def test_hint_in_the_400_detail(asgi_server):
    g = {"format": "segfuse.fusion/1", "inputs": X, "ops": _scatter(reduce="sum"), "outputs": ["o"]}
    async with asgi_server() as c:
        r = await c.post("/v2/fusions", json=g)
        assert r.status_code == 400, r.text
        (d,) = r.json()["details"]
        assert d["loc"] == ["ops", 0, "reduce"] and d["msg"].endswith("did you mean 'add'?")


def test_the_readme_hint_example_holds():
    """The README's status table promises a hint (`sum` -> `add`): the README is the oracle."""
    line = next(ln for ln in (ROOT / "README.md").read_text().splitlines() if "did you mean" in ln)
    pairs = re.findall(r"`(\w+)` -> `(\w+)`", line)
    assert pairs, line
    for given, meant in pairs:
        ((loc, msg),) = _issues(_scatter(reduce=given))
        assert loc == ("ops", 0, "reduce") and msg.endswith(f"; did you mean '{meant}'?"), msg
