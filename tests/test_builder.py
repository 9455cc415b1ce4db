"""FusionDefinition: ops, Python operators, multi-result ops, outputs, JSON round trips,
execution against PyTorch, and errors raised by the call that makes the mistake."""

from __future__ import annotations

import json
import operator
import pathlib

import numpy as np
import pytest
import torch
from segfuse.compiler import DType, Fusion, FusionDefinition, GraphError, Tensor

EXAMPLES = sorted((pathlib.Path(__file__).parent.parent / "examples").glob("*.json"))


def tt(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(a, copy=True))


def check(actual: np.ndarray, expected: torch.Tensor) -> None:
    act = tt(actual)
    assert act.dtype == expected.dtype and act.shape == expected.shape, (act.dtype, act.shape, expected)
    if expected.dtype.is_floating_point:
        torch.testing.assert_close(act, expected, equal_nan=True)
    else:
        assert torch.equal(act, expected), (act, expected)


RNG = np.random.default_rng(0)
A = RNG.standard_normal((4, 3)).astype(np.float32)
B = RNG.integers(1, 5, size=(3,)).astype(np.int32)

# Python operator -> (the op it records, how torch computes it)
BINARY_OPERATORS = [
    (operator.add, "add"), (operator.sub, "sub"), (operator.mul, "mul"), (operator.truediv, "div"),
    (operator.floordiv, "floor_divide"), (operator.mod, "remainder"), (operator.pow, "pow"),
    (operator.lt, "lt"), (operator.le, "le"), (operator.gt, "gt"), (operator.ge, "ge"), (operator.eq, "eq"),
    (operator.ne, "ne"),
]
INT_OPERATORS = [(operator.and_, "bitwise_and"), (operator.or_, "bitwise_or"), (operator.xor, "bitwise_xor"),
                 (operator.lshift, "left_shift"), (operator.rshift, "right_shift")]


def build(fn, dtypes=("float32", "int32"), shapes=((4, 3), (3,))):
    fd = FusionDefinition("t")
    a = fd.define_tensor("a", list(shapes[0]), dtypes[0])
    b = fd.define_tensor("b", list(shapes[1]), dtypes[1])
    out = fn(a, b)
    fd.add_output(out, "out")
    return fd


@pytest.mark.parametrize("form", ["tensor-tensor", "tensor-number", "number-tensor"])
@pytest.mark.parametrize("pyop,name", BINARY_OPERATORS, ids=[n for _, n in BINARY_OPERATORS])
def test_binary_operators(pyop, name, form):
    fn = {"tensor-tensor": lambda a, b: pyop(a, b), "tensor-number": lambda a, b: pyop(a, 2),
          "number-tensor": lambda a, b: pyop(3, b)}[form]
    fd = build(fn)
    recorded = fd.to_dict()["ops"][0]
    comparison = name in ("lt", "le", "gt", "ge", "eq", "ne")
    if form == "number-tensor" and comparison:  # Python reflects comparisons: 3 < b is b > 3
        want, inputs = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le"}.get(name, name), ["b", 3]
    else:
        want = name
        inputs = {"tensor-tensor": ["a", "b"], "tensor-number": ["a", 2], "number-tensor": [3, "b"]}[form]
    assert (recorded["op"], recorded["inputs"]) == (want, inputs)
    out = fd.execute({"a": A, "b": B})["out"]
    check(out, fn(tt(A), tt(B)))


@pytest.mark.parametrize("form", ["tensor-tensor", "tensor-number", "number-tensor"])
@pytest.mark.parametrize("pyop,name", INT_OPERATORS, ids=[n for _, n in INT_OPERATORS])
def test_integer_operators(pyop, name, form):
    fn = {"tensor-tensor": lambda a, b: pyop(a, b), "tensor-number": lambda a, b: pyop(a, 2),
          "number-tensor": lambda a, b: pyop(3, b)}[form]
    fd = build(fn, dtypes=("int64", "int32"))
    assert fd.to_dict()["ops"][0]["op"] == name
    a = RNG.integers(-50, 50, size=(4, 3))
    out = fd.execute({"a": a, "b": B})["out"]
    check(out, fn(tt(a), tt(B)))


@pytest.mark.parametrize("pyop,name,dtype", [(operator.neg, "neg", "float32"), (operator.abs, "abs", "int32"),
                                             (operator.invert, "bitwise_not", "int32"),
                                             (operator.invert, "bitwise_not", "bool")])
def test_unary_operators(pyop, name, dtype):
    fd = FusionDefinition()
    a = fd.define_tensor("a", [4, 3], dtype)
    fd.add_output(pyop(a), "out")
    assert fd.to_dict()["ops"] == [{"op": name, "out": "out", "inputs": ["a"]}]
    x = {"float32": A, "int32": (A * 10).astype(np.int32), "bool": A > 0}[dtype]
    check(fd.execute({"a": x})["out"], pyop(tt(x)))


def test_chained_expression_matches_torch():
    fd = FusionDefinition("chain")
    x = fd.define_tensor("x", ["T", 3], "float32")
    w = fd.define_tensor("w", [3], "bfloat16")
    y = fd.ops.where(x > 0, x * w, -x / 2)  # float32 * bfloat16 promotes to float32
    z = fd.ops.sum(fd.ops.exp(y) - 1.5, dims=-1, keepdim=True)
    fd.add_output(z, "z")
    fd.add_output(fd.ops.cast(y, DType.float16), "y16")
    w_np = np.array([0.5, -1.25, 2.0], dtype=np.float32)
    import ml_dtypes

    out = fd.execute({"x": A, "w": w_np.astype(ml_dtypes.bfloat16)})
    tx, tw = tt(A), tt(w_np).to(torch.bfloat16)
    ty = torch.where(tx > 0, tx * tw, -tx / 2)
    check(out["z"], torch.sum(torch.exp(ty) - 1.5, dim=-1, keepdim=True))
    check(out["y16"], ty.to(torch.float16))


def test_tensor_properties():
    fd = FusionDefinition()
    a = fd.define_tensor("a", ["T", 3], "float16")
    b = a * 2.5
    assert isinstance(b, Tensor) and b.dtype is DType.float16 and str(b.shape[0]) == "T" and b.shape[1] == 3
    c = fd.ops.sum(a, dims=[0, 1])
    assert c.dtype is DType.float16 and c.shape == ()
    assert "float16" in repr(b)


# ---- multi-result ops ------------------------------------------------------------------------
def test_sort_and_topk_return_tuples():
    fd = FusionDefinition()
    x = fd.define_tensor("x", [5, 6], "float32")
    res = fd.ops.sort(x, dim=1, descending=True)
    assert isinstance(res, tuple) and len(res) == 2
    values, indices = res
    tv, ti = fd.ops.topk(x, 3, dim=0, largest=False)
    assert values.dtype is DType.float32 and indices.dtype is DType.int64
    assert tv.shape == (3, 6) and ti.dtype is DType.int64
    for t, n in [(values, "values"), (indices, "indices"), (tv, "top_values"), (ti, "top_indices")]:
        fd.add_output(t, n)
    x_np = RNG.standard_normal((5, 6)).astype(np.float32)
    out = fd.execute({"x": x_np})
    ref = torch.sort(tt(x_np), dim=1, descending=True, stable=True)
    check(out["values"], ref.values)
    check(out["indices"], ref.indices)
    ref_top = torch.topk(tt(x_np), 3, dim=0, largest=False)
    check(out["top_values"], ref_top.values)
    check(out["top_indices"], ref_top.indices)
    assert fd.to_dict()["ops"][0]["out"] == ["values", "indices"]


# ---- outputs ---------------------------------------------------------------------------------
def test_add_output_renames_everywhere():
    fd = FusionDefinition()
    a = fd.define_tensor("a", [3], "float32")
    b = a + 1
    c = b * b
    fd.add_output(b, "b_out")
    fd.add_output(c, "c_out")
    ops = fd.to_dict()["ops"]
    assert ops[0]["out"] == "b_out" and ops[1]["inputs"] == ["b_out", "b_out"]
    assert b.name == "b_out" and fd.to_dict()["outputs"] == ["b_out", "c_out"]
    out = fd.execute({"a": np.arange(3, dtype=np.float32)})
    check(out["c_out"], (torch.arange(3.0) + 1) ** 2)


def test_add_output_alias_of_updates_input_in_place():
    fd = FusionDefinition("scatter_add")
    dst = fd.define_tensor("dst", ["M"], "float32")
    index = fd.define_tensor("index", ["N"], "int64")
    src = fd.define_tensor("src", ["N"], "float32")
    fd.add_output(fd.ops.scatter(dst, 0, index, src, reduce="add"), "dst_new", alias_of=dst)
    assert fd.to_dict()["outputs"] == [{"name": "dst_new", "alias_of": "dst"}]
    d = np.zeros(4, np.float32)
    i = np.array([0, 2, 2, 3])
    s = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
    out = fd.execute({"dst": d, "index": i, "src": s})
    expected = torch.zeros(4).scatter_reduce(0, tt(i), tt(s), "sum")
    check(d, expected)
    assert out["dst_new"] is d


def test_add_output_alias_by_name():
    fd = FusionDefinition()
    x = fd.define_tensor("x", [3], "int32")
    fd.add_output(x + 1, alias_of="x")
    f = fd.fusion()
    assert f.outputs[0].alias_of == "x"


@pytest.mark.parametrize("mistake", ["dtype", "shape", "not an input", "twice", "rename to existing", "rename input"])
def test_add_output_errors_at_the_call(mistake):
    fd = FusionDefinition()
    x = fd.define_tensor("x", [3], "float32")
    y = x * 2
    before = fd.to_dict()
    with pytest.raises((GraphError, ValueError)) as e:
        if mistake == "dtype":
            fd.add_output(fd.ops.cast(y, "float64"), alias_of=x)
        elif mistake == "shape":
            fd.add_output(fd.ops.sum(y), alias_of=x)
        elif mistake == "not an input":
            fd.add_output(y + 1, alias_of=y)
        elif mistake == "twice":
            fd.add_output(y, alias_of=x)
            before = fd.to_dict()
            fd.add_output(y + 3, alias_of=x)
        elif mistake == "rename to existing":
            fd.add_output(y, "x")
        else:
            fd.add_output(x, "renamed")
    if isinstance(e.value, GraphError):
        assert e.value.issues[0].loc[0] == "outputs"
    after = fd.to_dict()
    after["ops"] = after["ops"][:len(before["ops"])]  # ops recorded for the failed call's arguments stay
    assert after == before, "a failed add_output leaves the definition as it was"
    fd.add_output(y * 3, "ok")
    fd.fusion()


# ---- JSON round trips ----------------------------------------------------------------------------
def make_moe():
    with FusionDefinition("moe_problem_sizes") as fd:
        ids = fd.define_tensor("topk_ids", shape=["T", "K"], dtype="int64")
        flat = fd.ops.reshape(ids, [-1])
        counts = fd.ops.scatter(fd.ops.full([16], 0, "int64"), 0, flat, fd.ops.full_like(flat, 1), reduce="add")
        order = fd.ops.argsort(flat, stable=True)
        fd.add_output(counts, "counts")
        fd.add_output(order, "order")
    return fd


def test_to_json_from_json_round_trip_exact():
    fd = make_moe()
    text = fd.to_json()
    again = FusionDefinition.from_json(text)
    assert again.to_json() == text
    assert FusionDefinition.from_json(json.loads(text)).to_json() == text
    assert again.to_json(indent=None) == fd.to_json(indent=None)
    assert Fusion.from_json(text).id == fd.fusion().id


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_examples_round_trip(path):
    data = json.loads(path.read_text())
    fd = FusionDefinition.from_json(path.read_text())
    assert fd.to_dict() == data
    assert json.loads(FusionDefinition.from_json(fd.to_json()).to_json()) == data


def test_execute_matches_torch():
    fd = make_moe()
    ids = np.random.default_rng(1).integers(0, 16, size=(7, 2))
    out = fd.execute({"topk_ids": ids})
    flat = tt(ids).reshape(-1)
    check(out["counts"], torch.zeros(16, dtype=torch.int64).scatter_reduce(0, flat, torch.ones_like(flat), "sum"))
    check(out["order"], torch.argsort(flat, stable=True))


# ---- errors at the call that makes the mistake ------------------------------------------------
def test_op_error_raised_by_the_call():
    fd = FusionDefinition()
    a = fd.define_tensor("a", ["T", 3], "float32")
    z = fd.define_tensor("z", [4], "float32")
    n_ops = len(fd.to_dict()["ops"])
    with pytest.raises(GraphError) as e:
        fd.ops.add(a, z)
    (issue,) = e.value.issues
    assert issue.loc == ("ops", n_ops, "inputs", 1) and "cannot be broadcast" in issue.msg
    assert len(fd.to_dict()["ops"]) == n_ops, "the failed op is not recorded"
    with pytest.raises(GraphError) as e:
        a & 1  # bitwise on floats
    assert "bitwise_and" in e.value.issues[0].msg
    with pytest.raises(GraphError) as e:
        fd.ops.unsqueeze(a, 5)
    assert e.value.issues[0].loc == ("ops", n_ops, "dim")
    fd.add_output(a * 2, "ok")  # still usable
    fd.fusion()


def test_define_tensor_errors_at_the_call():
    fd = FusionDefinition()
    fd.define_tensor("a", [2], "float32")
    with pytest.raises(GraphError) as e:
        fd.define_tensor("q", [2], "float8")
    assert e.value.issues[0].loc == ("inputs", 1, "dtype")
    with pytest.raises(GraphError) as e:
        fd.define_tensor("a", [3], "int32")
    assert e.value.issues[0].loc == ("inputs", 1, "name")
    with pytest.raises(GraphError):
        fd.define_tensor("n", [-2])
    b = fd.define_tensor("b", [2], "float32")  # the mistakes left nothing behind
    assert [i["name"] for i in fd.to_dict()["inputs"]] == ["a", "b"]
    fd.add_output(b + 1)
    fd.fusion()


def test_python_call_errors():
    fd = FusionDefinition()
    a = fd.define_tensor("a", [2, 3], "float32")
    with pytest.raises(TypeError, match="unexpected argument 'dimz'"):
        fd.ops.sum(a, dimz=1)
    with pytest.raises(TypeError, match="takes"):
        fd.ops.exp(a, 1, 2, 3)
    with pytest.raises(TypeError, match="operands are Tensors or numbers"):
        fd.ops.add(a, "b")
    with pytest.raises(AttributeError, match="no op named 'nonexistent'"):
        fd.ops.nonexistent  # noqa: B018
    with pytest.raises(GraphError) as e:
        fd.ops.sum(a, dims="0")
    assert e.value.issues[0].loc[-1] == "dims"
    assert "add" in dir(fd.ops) and "scatter" in dir(fd.ops)


def test_context_manager_validates_the_finished_graph():
    with pytest.raises(GraphError) as e:
        with FusionDefinition() as fd:
            a = fd.define_tensor("a", [2], "float32")
            fd.ops.exp(a)  # no output declared
    assert e.value.issues[0].loc == ("outputs",)


def test_signatures_follow_pytorch_argument_order():
    fd = FusionDefinition()
    x = fd.define_tensor("x", [4, 3], "float32")
    i = fd.define_tensor("i", [2, 3], "int64")
    g = fd.ops.gather(x, 0, i)  # torch.gather(input, dim, index)
    s = fd.ops.index_select(x, 1, fd.ops.iota(2))  # torch.index_select(input, dim, index)
    c = fd.ops.cat([x, x], 0)
    w = fd.ops.where(x > 0, x, 0.0)
    cl = fd.ops.clamp(x, -0.5, 0.5)
    for t, n in [(g, "g"), (s, "s"), (c, "c"), (w, "w"), (cl, "cl")]:
        fd.add_output(t, n)
    xi = RNG.integers(0, 4, size=(2, 3))
    out = fd.execute({"x": A, "i": xi})
    tx = tt(A)
    check(out["g"], torch.gather(tx, 0, tt(xi)))
    check(out["s"], torch.index_select(tx, 1, torch.arange(2)))
    check(out["c"], torch.cat([tx, tx], 0))
    check(out["w"], torch.where(tx > 0, tx, 0.0))
    check(out["cl"], torch.clamp(tx, -0.5, 0.5))
