"""The scatter family's `reduce` is an enum of the ops layer (`Reduce`), with strings on the wire:
a graph's JSON keeps them, the attribute models dump them as strings, and a bad value's message
(with its "did you mean") lists the members' values."""

from __future__ import annotations

import json

import pytest
from helpers.graphs import graph
from segfuse.compiler import Fusion
from segfuse.compiler.errors import GraphError
from segfuse.compiler.ops.indexing import Reduce

NAMES = ["none", "add", "mul", "amax", "amin", "mean"]  # the wire format, written out independently


def _graph(op: dict) -> dict:
    return graph([("x", "float32", [4]), ("i", "int64", [4])], [op], ["o"], "r")


def test_the_members_are_the_wire_strings():
    assert [m.value for m in Reduce] == NAMES
    assert all(m == s and hash(m) == hash(s) and f"{m}" == s for m, s in zip(Reduce, NAMES))


@pytest.mark.parametrize("given", ["add", "amin", "mul", "none"])  # (mean is composite: an add)
def test_a_graph_reads_an_enum_and_writes_strings(given):
    meant = given
    g = _graph({"op": "scatter", "out": "o", "inputs": ["x", "i", 1.0], "dim": 0, "reduce": given})
    f = Fusion.from_json(g)
    attrs = f.nodes[0].attrs
    assert attrs.reduce is Reduce(meant)
    assert attrs.model_dump(mode="json")["reduce"] == meant
    assert json.loads(json.dumps(attrs.model_dump()))["reduce"] == meant
    assert json.loads(json.dumps(f.to_json()))["ops"][0]["reduce"] == meant


def test_index_put_and_index_add_report_the_enum_too():
    put = Fusion.from_json(_graph({"op": "index_put", "out": "o", "inputs": ["x", "i", 1.0], "accumulate": True}))
    assert put.nodes[0].attrs.reduce is Reduce.add
    put = Fusion.from_json(_graph({"op": "index_put", "out": "o", "inputs": ["x", "i", 1.0]}))
    assert put.nodes[0].attrs.reduce is Reduce.none


@pytest.mark.parametrize("value,hint", [("ad", "; did you mean 'add'?"), ("sum", "; did you mean 'add'?"),
                                        ("bogus", ""), (3, "")])
def test_a_bad_reduce_names_the_field_and_the_values(value, hint):
    g = _graph({"op": "scatter", "out": "o", "inputs": ["x", "i", 1.0], "dim": 0, "reduce": value})
    with pytest.raises(GraphError) as e:
        Fusion.from_json(g)
    assert str(e.value) == "ops[0].reduce: Input should be 'none', 'add', 'mul', 'amax', 'amin' or 'mean'" + hint
