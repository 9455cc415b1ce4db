"""Validation and binding errors: every error class reports a list of Issues, each with the
exact location (`ops[3].inputs[1]`) and a message that says what is wrong."""

from __future__ import annotations

import json

import numpy as np
import pytest
from segfuse.compiler import BindError, Fusion, GraphError, Issue, Limits, run_graph
from segfuse.compiler.errors import format_loc

XY = (("x", "float32", [2, 3]), ("y", "float32", [2, 3]))


def g(ops, inputs=XY, outputs=None) -> dict:
    return {"format": "segfuse.fusion/1", "name": "t",
            "inputs": [{"name": n, "dtype": d, "shape": s} for n, d, s in inputs], "ops": ops,
            "outputs": outputs if outputs is not None else [ops[-1]["out"] if ops else inputs[0][0]]}


def op(name, out, inputs, **attrs) -> dict:
    return {"op": name, "out": out, "inputs": inputs, **attrs}


def issues_of(graph, **kw) -> list[Issue]:
    with pytest.raises(GraphError) as e:
        Fusion.from_json(graph, **kw)
    assert all(isinstance(i, Issue) for i in e.value.issues)
    return e.value.issues


def one_issue(graph, **kw) -> Issue:
    issues = issues_of(graph, **kw)
    assert len(issues) == 1, issues
    return issues[0]


# (graph, exact loc, words the message must contain)
CASES = {
    "unknown op, with a suggestion": (
        g([op("ad", "o", ["x", "y"])]), ("ops", 0, "op"), ["unknown op 'ad'; did you mean 'add'"]),
    "unknown op, close to a longer name": (
        g([op("scater", "o", ["x"])]), ("ops", 0, "op"), ["unknown op 'scater'; did you mean 'scatter'"]),
    "unknown op, no suggestion": (
        g([op("frobnicate", "o", ["x"])]), ("ops", 0, "op"), ["unknown op 'frobnicate'"]),
    "unknown attribute": (
        g([op("sum", "o", ["x"], dimz=1)]), ("ops", 0, "dimz"), ["unknown attribute for op 'sum'", "dims, keepdim, dtype"]),
    "attribute of another op": (
        g([op("add", "o", ["x", "y"], dim=0)]), ("ops", 0, "dim"), ["unknown attribute for op 'add'", "none"]),
    "missing attribute": (
        g([op("reshape", "o", ["x"])]), ("ops", 0, "shape"), ["field required"]),
    "missing attribute (gather dim)": (
        g([op("gather", "o", ["x", "i"])], inputs=XY + (("i", "int64", [2, 3]),)), ("ops", 0, "dim"), ["field required"]),
    "wrong attribute type: fractional dim": (
        g([op("unsqueeze", "o", ["x"], dim=1.5)]), ("ops", 0, "dim"), ["valid integer"]),
    "wrong attribute type: string dim": (
        g([op("unsqueeze", "o", ["x"], dim="1")]), ("ops", 0, "dim"), ["valid integer"]),
    "wrong attribute type: bool dim": (
        g([op("unsqueeze", "o", ["x"], dim=True)]), ("ops", 0, "dim"), ["valid integer"]),
    "wrong attribute type: keepdim string": (
        g([op("sum", "o", ["x"], keepdim="yes")]), ("ops", 0, "keepdim"), ["valid boolean"]),
    "wrong attribute type: dims union": (
        g([op("sum", "o", ["x"], dims=0.5)]), ("ops", 0, "dims"), ["valid array", "valid integer"]),
    "wrong attribute type: element of a list": (
        g([op("permute", "o", ["x"], dims=[1, "a"])]), ("ops", 0, "dims", 1), ["valid integer"]),
    "wrong attribute type: shape not a list": (
        g([op("reshape", "o", ["x"], shape="abc")]), ("ops", 0, "shape"), ["valid array"]),
    "wrong attribute value: dtype": (
        g([op("cast", "o", ["x"], dtype="float8")]), ("ops", 0, "dtype"), ["'float32'", "'bfloat16'"]),
    "wrong attribute value: reduce": (
        g([op("scatter", "o", ["x", "i", "x"], dim=0, reduce="avg")], inputs=XY + (("i", "int64", [2, 3]),)),
        ("ops", 0, "reduce"), ["'add'", "'amax'"]),
    "unknown tensor": (
        g([op("add", "a", ["x", "y"]), op("add", "b", ["a", "y"]), op("add", "c", ["b", "y"]), op("add", "d", ["c", "x2"])]),
        ("ops", 3, "inputs", 1), ["unknown tensor 'x2'"]),
    "use before definition": (
        g([op("add", "a", ["x", "b"]), op("add", "b", ["x", "y"])], outputs=["a"]),
        ("ops", 0, "inputs", 1), ["'b' is used before it is defined (by ops[1])"]),
    "use of itself": (
        g([op("add", "a", ["x", "a"])]), ("ops", 0, "inputs", 1), ["'a' is used before it is defined (by ops[0])"]),
    "redefinition of an input": (
        g([op("add", "x", ["x", "y"])]), ("ops", 0, "out"), ["'x' is already defined (at inputs[0])"]),
    "redefinition of a result": (
        g([op("add", "a", ["x", "y"]), op("mul", "a", ["x", "y"])]), ("ops", 1, "out"), ["'a' is already defined (at ops[0])"]),
    "redefinition in a multi-result op": (
        g([op("sort", ["v", "x"], ["x"])], outputs=["v"]), ("ops", 0, "out", 1), ["'x' is already defined (at inputs[0])"]),
    "input declared twice": (
        g([op("add", "a", ["x", "y"])], inputs=(("x", "float32", [2]), ("x", "float32", [2]), ("y", "float32", [2]))),
        ("inputs", 1, "name"), ["'x' is defined twice (first at inputs[0])"]),
    "too few operands": (
        g([op("add", "a", ["x"])]), ("ops", 0, "inputs"), ["op 'add' takes 2 inputs (x, y), got 1"]),
    "too many operands": (
        g([op("exp", "a", ["x", "y"])]), ("ops", 0, "inputs"), ["op 'exp' takes 1 input (x), got 2"]),
    "no operands for cat": (
        g([op("cat", "a", [], dim=0)]), ("ops", 0, "inputs"), ["takes at least 1 input", "got 0"]),
    "wrong number of results": (
        g([op("sort", "a", ["x"])]), ("ops", 0, "out"), ["op 'sort' has 2 result(s)"]),
    "literal where a tensor is required": (
        g([op("exp", "a", [2])]), ("ops", 0, "inputs", 0), ["op 'exp' needs a tensor here, not the number 2"]),
    "literal as an index": (
        g([op("gather", "a", ["x", 1], dim=0)]), ("ops", 0, "inputs", 1), ["needs a tensor here, not the number 1"]),
    "literal as scatter's self": (
        g([op("scatter", "a", [1.5, "i", "x"], dim=0)], inputs=XY + (("i", "int64", [2, 3]),)),
        ("ops", 0, "inputs", 0), ["needs a tensor here, not the number 1.5"]),
    "two literals in a binary op": (
        g([op("add", "a", [1, 2])]), ("ops", 0, "inputs"), ["at least one tensor"]),
    "dim out of range": (
        g([op("unsqueeze", "a", ["x"], dim=4)]), ("ops", 0, "dim"), ["dim 4 is out of range for a tensor of rank 3",
                                                                      "-3 to 2"]),
    "dim out of range in a list": (
        g([op("sum", "a", ["x"], dims=[0, 3])]), ("ops", 0, "dims", 1), ["dim 3 is out of range for a tensor of rank 2",
                                                                          "-2 to 1"]),
    "negative dim out of range": (
        g([op("sum", "a", ["x"], dims=-3)]), ("ops", 0, "dims"), ["dim -3 is out of range"]),
    "repeated dim": (
        g([op("sum", "a", ["x"], dims=[1, -1])]), ("ops", 0, "dims", 1), ["appears more than once"]),
    "non-integer index tensor": (
        g([op("gather", "a", ["x", "y"], dim=0)]), ("ops", 0, "inputs", 1), ["index must be an integer tensor, not float32"]),
    "bool index tensor": (
        g([op("index_select", "a", ["x", "i"], dim=0)], inputs=XY + (("i", "bool", [2]),)),
        ("ops", 0, "inputs", 1), ["integer tensor, not bool"]),
    "gather rank mismatch": (
        g([op("gather", "a", ["x", "i"], dim=0)], inputs=XY + (("i", "int64", [2]),)),
        ("ops", 0, "inputs", 1), ["index has rank 1 but self has rank 2"]),
    "scatter rank mismatch": (
        g([op("scatter", "a", ["x", "i", "y"], dim=1)], inputs=XY + (("i", "int32", [2, 3, 1]),)),
        ("ops", 0, "inputs", 1), ["index has rank 3 but self has rank 2"]),
    "scatter src rank mismatch": (
        g([op("scatter", "a", ["x", "i", "s"], dim=1)], inputs=XY + (("i", "int32", [2, 3]), ("s", "float32", [6]))),
        ("ops", 0, "inputs", 2), ["src has rank 1 but self has rank 2"]),
    "index extent larger than self's": (
        g([op("gather", "a", ["x", "i"], dim=0)], inputs=XY + (("i", "int64", [2, 4]),)),
        ("ops", 0, "inputs", 1), ["index size 4 at dim 1 exceeds self's size 3"]),
    "index extent larger than src's": (
        g([op("scatter", "a", ["x", "i", "s"], dim=0)], inputs=XY + (("i", "int64", [2, 3]), ("s", "float32", [2, 2]))),
        ("ops", 0, "inputs", 1), ["index size 3 at dim 1 exceeds src's size 2"]),
    "scatter src dtype": (
        g([op("scatter", "a", ["x", "i", "s"], dim=0)], inputs=XY + (("i", "int64", [2, 3]), ("s", "float64", [2, 3]))),
        ("ops", 0, "inputs", 2), ["src of self's dtype float32, got float64"]),
    "broadcast mismatch": (
        g([op("add", "a", ["x", "y"])], inputs=(("x", "float32", [2, 3]), ("y", "float32", [4]))),
        ("ops", 0, "inputs", 1), ["cannot be broadcast", "3 against 4"]),
    "broadcast mismatch in where": (
        g([op("where", "a", ["c", "x", "y"])], inputs=(("c", "bool", [5]), ("x", "float32", [2, 3]), ("y", "float32", [3]))),
        ("ops", 0, "inputs", 1), ["cannot be broadcast"]),
    "dtype not allowed: bitwise on floats": (
        g([op("bitwise_and", "a", ["x", "y"])]), ("ops", 0, "inputs"),
        ["bitwise_and needs integer or bool operands (operands promote to float32)"]),
    "dtype not allowed: shift on bool": (
        g([op("left_shift", "a", ["b", "b"])], inputs=(("b", "bool", [2]),)), ("ops", 0, "inputs"), ["integer operands"]),
    "dtype not allowed: neg on bool": (
        g([op("neg", "a", ["b"])], inputs=(("b", "bool", [2]),)), ("ops", 0, "inputs"), ["not supported for bool"]),
    "dtype not allowed: sub with bool": (
        g([op("sub", "a", ["x", "b"])], inputs=(("x", "float32", [2]), ("b", "bool", [2]))),
        ("ops", 0, "inputs", 1), ["bool"]),
    "dtype not allowed: mean of integers": (
        g([op("mean", "a", ["i"])], inputs=(("i", "int32", [2]),)), ("ops", 0, "inputs", 0), ["floating-point"]),
    "where condition not bool": (
        g([op("where", "a", ["x", "x", "y"])]), ("ops", 0, "inputs", 0), ["condition must be bool, not float32"]),
    "bad literal: a list": (
        g([op("add", "a", ["x", [1]])]), ("ops", 0, "inputs", 1), ["tensor name or a number literal"]),
    "bad literal: null": (
        g([op("add", "a", ["x", None])]), ("ops", 0, "inputs", 1), ["tensor name or a number literal"]),
    "bad literal: too big for int64": (
        g([op("add", "a", ["x", 2**70])]), ("ops", 0, "inputs", 1), ["does not fit in int64"]),
    "bad fill value for the dtype": (
        g([op("full", "a", [], shape=[2], value=300, dtype="int8")]), ("ops", 0, "value"),
        ["300 cannot be converted to int8"]),
    "NaN fill for an integer dtype": (
        g([op("full", "a", [], shape=[2], value=float("nan"), dtype="int32")]), ("ops", 0, "value"),
        ["cannot be converted to int32"]),
    "reshape element count mismatch": (
        g([op("reshape", "a", ["x"], shape=[4, 2])]), ("ops", 0, "shape"),
        ["cannot reshape [2, 3] (6 elements) into [4, 2] (8 elements)"]),
    "reshape with two -1": (
        g([op("reshape", "a", ["x"], shape=[-1, -1])]), ("ops", 0, "shape", 1), ["only one dimension can be -1"]),
    "reshape -1 that does not divide": (
        g([op("reshape", "a", ["x"], shape=[4, -1])]), ("ops", 0, "shape"), ["cannot reshape"]),
    "unknown size symbol": (
        g([op("reshape", "a", ["x"], shape=["T", 6])]), ("ops", 0, "shape", 0), ["unknown size symbol 'T'"]),
    "bad size expression": (
        g([op("full", "a", [], shape=["T**2"], value=0)], inputs=(("x", "float32", ["T"]),)), ("ops", 0, "shape", 0),
        ["not a size expression"]),
    "negative input size": (
        g([op("exp", "a", ["x"])], inputs=(("x", "float32", [2, -1]),)), ("inputs", 0, "shape", 1),
        ["not a non-negative integer"]),
    "expression as an input size": (
        g([op("exp", "a", ["x"])], inputs=(("x", "float32", ["T+1"]),)), ("inputs", 0, "shape", 0),
        ["must be a name like 'T'"]),
    "output unknown": (
        g([op("add", "a", ["x", "y"])], outputs=["zz"]), ("outputs", 0, "name"), ["unknown tensor 'zz'"]),
    "output listed twice": (
        g([op("add", "a", ["x", "y"])], outputs=["a", "a"]), ("outputs", 1), ["'a' is listed twice (also outputs[0])"]),
    "no outputs": (
        g([op("add", "a", ["x", "y"])], outputs=[]), ("outputs",), ["at least one output"]),
    "alias_of not an input": (
        g([op("add", "a", ["x", "y"]), op("add", "b", ["x", "y"])], outputs=[{"name": "a", "alias_of": "b"}]),
        ("outputs", 0, "alias_of"), ["'b' is not a graph input"]),
    "alias_of an unknown name": (
        g([op("add", "a", ["x", "y"])], outputs=[{"name": "a", "alias_of": "q"}]),
        ("outputs", 0, "alias_of"), ["'q' is not a graph input"]),
    "alias_of dtype mismatch": (
        g([op("cast", "a", ["x"], dtype="float64")], outputs=[{"name": "a", "alias_of": "x"}]),
        ("outputs", 0, "alias_of"), ["float64[2, 3]", "float32[2, 3]", "same dtype and shape"]),
    "alias_of shape mismatch": (
        g([op("sum", "a", ["x"], dims=0)], outputs=[{"name": "a", "alias_of": "x"}]),
        ("outputs", 0, "alias_of"), ["float32[3]", "float32[2, 3]", "same dtype and shape"]),
    "alias_of symbolic shape mismatch": (
        g([op("pad", "a", ["x"], pad=[1, 0])], inputs=(("x", "float32", ["T"]),),
          outputs=[{"name": "a", "alias_of": "x"}]),
        ("outputs", 0, "alias_of"), ["same dtype and shape"]),
    "alias_of itself": (
        g([op("add", "a", ["x", "y"])], outputs=[{"name": "a", "alias_of": "a"}]),
        ("outputs", 0, "alias_of"), ["'a' cannot alias itself"]),
    "two outputs alias one input": (
        g([op("add", "a", ["x", "y"]), op("mul", "b", ["x", "y"])],
          outputs=[{"name": "a", "alias_of": "x"}, {"name": "b", "alias_of": "x"}]),
        ("outputs", 1, "alias_of"), ["input 'x' is already updated in place by outputs[0]"]),
    "an input aliasing another input": (
        g([op("add", "a", ["x", "y"])], outputs=["a", {"name": "y", "alias_of": "x"}]),
        ("outputs", 1, "alias_of"), ["'y' is itself a graph input", "cycle"]),
    "input returned and updated in place": (
        g([op("add", "a", ["x", "y"])], outputs=[{"name": "a", "alias_of": "x"}, "x"]),
        ("outputs", 1), ["input 'x' is returned and also updated in place by outputs[0]", "cycle"]),
    "broadcast_in_dim: wrong number of broadcast_dims": (
        g([op("broadcast_in_dim", "a", ["x"], shape=[2, 3, 4], broadcast_dims=[0])]), ("ops", 0, "broadcast_dims"),
        ["1 entries for an input of rank 2"]),
    "broadcast_in_dim: dims not increasing": (
        g([op("broadcast_in_dim", "a", ["x"], shape=[3, 2], broadcast_dims=[1, 0])]), ("ops", 0, "broadcast_dims", 1),
        ["increasing"]),
    "broadcast_in_dim: size mismatch": (
        g([op("broadcast_in_dim", "a", ["x"], shape=[2, 4], broadcast_dims=[0, 1])]), ("ops", 0, "broadcast_dims", 1),
        ["size 3", "size 4"]),
    "amax takes no dtype": (
        g([op("amax", "a", ["x"], dtype="float64")]), ("ops", 0, "dtype"), ["takes no dtype"]),
    "permute with a repeated dim": (
        g([op("permute", "a", ["x"], dims=[1, -1])]), ("ops", 0, "dims"), ["repeat"]),
    "slice with a zero step": (
        g([op("slice", "a", ["x"], dim=1, step=0)]), ("ops", 0, "step"), ["positive"]),
    "topk k larger than the dim": (
        g([op("topk", ["v", "i"], ["x"], k=4)], outputs=["v"]), ("ops", 0, "k"), ["k=4 is out of range"]),
    "cat rank mismatch": (
        g([op("cat", "a", ["x", "z"], dim=0)], inputs=XY + (("z", "float32", [3]),)), ("ops", 0, "inputs", 1),
        ["rank 1, expected 2"]),
    "cat size mismatch": (
        g([op("cat", "a", ["x", "z"], dim=0)], inputs=XY + (("z", "float32", [2, 4]),)), ("ops", 0, "inputs", 1),
        ["size 4 at dim 1 differs from 3"]),
    "lerp dtype mismatch": (
        g([op("lerp", "a", ["x", "z", 0.5])], inputs=XY + (("z", "float64", [2, 3]),)), ("ops", 0, "inputs", 1),
        ["float32 and float64"]),
    "unknown top-level field": (
        {**g([op("add", "a", ["x", "y"])]), "extra": 1}, ("extra",), ["unknown field"]),
    "wrong format": (
        {**g([op("add", "a", ["x", "y"])]), "format": "segfuse.fusion/2"}, ("format",), ["'segfuse.fusion/1'"]),
    "missing ops": (
        {k: v for k, v in g([op("add", "a", ["x", "y"])]).items() if k != "ops"}, ("ops",), ["field required"]),
    "bad tensor name": (
        g([op("add", "1a", ["x", "y"])], outputs=["x"]), ("ops", 0, "out"), ["pattern"]),
    "bad input dtype": (
        g([op("exp", "a", ["x"])], inputs=(("x", "complex64", [2]),)), ("inputs", 0, "dtype"), ["'float32'"]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_validation_error(name):
    graph, loc, words = CASES[name]
    issue = one_issue(graph)
    assert issue.loc == loc, f"{issue.loc} != {loc}: {issue.msg}"
    for w in words:
        assert w in issue.msg, f"{w!r} not in {issue.msg!r}"
    assert str(issue) == f"{format_loc(loc)}: {issue.msg}"


def test_validation_error_details_and_message():
    graph = g([op("add", "a", ["x", "y"]), op("add", "b", ["a", "y"]), op("add", "c", ["b", "y"]),
               op("add", "d", ["c", "x2"])])
    with pytest.raises(GraphError) as e:
        Fusion.from_json(graph)
    assert str(e.value) == "ops[3].inputs[1]: unknown tensor 'x2'"
    assert e.value.details() == [{"loc": ["ops", 3, "inputs", 1], "msg": "unknown tensor 'x2'"}]


def test_several_errors_all_reported():
    graph = g([op("ad", "a", ["x", "y"]),  # unknown op
               op("exp", "b", ["q"]),  # unknown tensor
               op("sum", "c", ["x"], dims=5),  # dim out of range
               op("add", "d", ["x", "y"], alpha=2),  # unknown attribute
               op("add", "e", ["x", "z"]),  # broadcast mismatch
               op("reshape", "f", ["x"], shape=[7]),  # reshape mismatch
               op("mul", "g", ["a", "y"])],  # uses a failed op's result: not reported again
              inputs=XY + (("z", "float32", [4]),), outputs=["c", "zz", "g", "c"])
    locs = [(i.loc, i.msg.split(" ")[0]) for i in issues_of(graph)]
    assert [loc for loc, _ in locs] == [("ops", 0, "op"), ("ops", 1, "inputs", 0), ("ops", 2, "dims"),
                                        ("ops", 3, "alpha"), ("ops", 4, "inputs", 1), ("ops", 5, "shape"),
                                        ("outputs", 1, "name"), ("outputs", 3)]


def test_failed_input_declaration_reported_once():
    graph = g([op("add", "a", ["x", "y"])], inputs=(("x", "float32", [-1]), ("y", "float32", ["T+1"])),
              outputs=["a", "x"])
    assert [i.loc for i in issues_of(graph)] == [("inputs", 0, "shape", 0), ("inputs", 1, "shape", 0)]


# ---- limits ----------------------------------------------------------------------------------
def test_limit_max_ops():
    graph = g([op("add", "a", ["x", "y"]), op("add", "b", ["a", "y"]), op("add", "c", ["b", "y"])])
    issue = one_issue(graph, limits=Limits(max_ops=2))
    assert issue.loc == ("ops",) and "3 ops exceed the limit of 2" in issue.msg
    Fusion.from_json(graph, limits=Limits(max_ops=3))


def test_limit_max_rank_of_inputs():
    graph = g([op("add", "a", ["x", "y"])], inputs=(("x", "float32", [1, 2, 3]), ("y", "float32", [3])))
    issue = one_issue(graph, limits=Limits(max_rank=2))
    assert issue.loc == ("inputs", 0, "shape") and "rank 3 exceeds the limit of 2" in issue.msg
    Fusion.from_json(graph, limits=Limits(max_rank=3))


def test_limit_max_rank_of_results():
    graph = g([op("unsqueeze", "a", ["x"], dim=0)])
    issue = one_issue(graph, limits=Limits(max_rank=2))
    assert issue.loc == ("ops", 0) and "rank 3, over the limit of 2" in issue.msg


def test_limit_max_inputs():
    issue = one_issue(g([op("add", "a", ["x", "y"])]), limits=Limits(max_inputs=1))
    assert issue.loc == ("inputs",) and "2 inputs exceed the limit of 1" in issue.msg


# ---- JSON ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("text,words", [('{"format": ', ["not valid JSON", "line 1 column 12"]),
                                        ("[1, 2]", ["must be a JSON object"]), ("", ["not valid JSON"]),
                                        ('{"ops": [}', ["not valid JSON"])])
def test_invalid_json(text, words):
    issue = one_issue(text)
    assert issue.loc == ()
    for w in words:
        assert w in issue.msg


def test_valid_json_text_and_bytes():
    graph = g([op("add", "a", ["x", "y"])])
    for src in (json.dumps(graph), json.dumps(graph).encode()):
        assert Fusion.from_json(src).to_json() == Fusion.from_json(graph).to_json()


# ---- bind -------------------------------------------------------------------------------------------
SYM = g([op("sum", "s", ["a"], dims=1), op("add", "p", ["s", "b"])],
        inputs=(("a", "float32", ["T", 3]), ("b", "float32", ["T"])))


def bind_issues(inputs: dict) -> list[Issue]:
    with pytest.raises(BindError) as e:
        run_graph(Fusion.from_json(SYM), inputs)
    return e.value.issues


A, B = np.zeros((4, 3), np.float32), np.zeros(4, np.float32)


@pytest.mark.parametrize("inputs,loc,words", [
    ({"a": A}, ("inputs", "b"), ["missing input"]),
    ({"a": A, "b": B, "c": B}, ("inputs", "c"), ["unknown input", "a, b"]),
    ({"a": A.astype(np.float64), "b": B}, ("inputs", "a"), ["dtype float64 does not match the graph's float32"]),
    ({"a": A, "b": B.astype(np.int32)}, ("inputs", "b"), ["dtype int32 does not match the graph's float32"]),
    ({"a": A.reshape(4, 3, 1), "b": B}, ("inputs", "a"), ["rank 3", "[T, 3]"]),
    ({"a": np.zeros((4, 2), np.float32), "b": B}, ("inputs", "a"), ["size 2 at dim 1 should be 3"]),
    ({"a": A, "b": np.zeros(5, np.float32)}, ("inputs", "b"), ["size 5 at dim 0 disagrees with T=4", "input 'a'"]),
    ({"a": A.astype(np.complex64), "b": B}, ("inputs", "a"), ["unsupported dtype complex64"]),
], ids=["missing", "unknown", "dtype", "dtype2", "rank", "static size", "symbol disagreement", "unsupported dtype"])
def test_bind_error(inputs, loc, words):
    (issue,) = bind_issues(inputs)
    assert issue.loc == loc
    for w in words:
        assert w in issue.msg, issue.msg


def test_bind_reports_every_input():
    issues = bind_issues({"a": np.zeros((4, 2), np.float64), "c": B})
    assert [i.loc for i in issues] == [("inputs", "a"), ("inputs", "a"), ("inputs", "b"), ("inputs", "c")]


def test_bind_direct_and_symbol_values():
    f = Fusion.from_json(SYM)
    bound = f.bind({"a": (5, 3), "b": (5,)})
    assert bound.env == {"T": 5}
    assert bound.types["p"].shape == (5,)
    with pytest.raises(BindError) as e:
        f.bind({"a": (5, 3), "b": (6,)}, loc_prefix=("request", "inputs"))
    assert e.value.issues[0].loc == ("request", "inputs", "b")


def test_bind_checks_symbolic_constraints_of_ops():
    """A broadcast between two symbols is only checked once their sizes are known."""
    f = Fusion.from_json(g([op("add", "p", ["a", "b"])], inputs=(("a", "float32", ["T"]), ("b", "float32", ["S"]))))
    assert run_graph(f, {"a": np.ones(4, np.float32), "b": np.ones(1, np.float32)})["p"].shape == (4,)
    with pytest.raises(BindError) as e:
        run_graph(f, {"a": np.ones(4, np.float32), "b": np.ones(5, np.float32)})
    (issue,) = e.value.issues
    assert issue.loc == ("ops", 0, "inputs", 1) and "cannot be broadcast" in issue.msg


def test_bind_checks_alias_shapes_unknown_at_validation():
    """slice(T, start=1) has size max(0, T-1): equal to T only when T = 0."""
    f = Fusion.from_json(g([op("slice", "a", ["x"], dim=0, start=1)], inputs=(("x", "float32", ["T"]),),
                           outputs=[{"name": "a", "alias_of": "x"}]))
    x = np.arange(3, dtype=np.float32)
    with pytest.raises(BindError) as e:
        run_graph(f, {"x": x})
    (issue,) = e.value.issues
    assert issue.loc == ("outputs", 0, "alias_of") and "same shape" in issue.msg
    np.testing.assert_array_equal(x, np.arange(3, dtype=np.float32))
    run_graph(f, {"x": np.zeros(0, np.float32)})  # T = 0: the shapes agree
