"""select and the composite reductions (issue 15, item 4) against PyTorch on the CPU: softmax,
log_softmax, logsumexp, var, std, var_mean (PyTorch's `correction`), in every float dtype, over
kept and reduced dims, with PyTorch's edge cases (rows of -inf, +inf, NaN, empty dims, 0-d inputs,
N - correction <= 0, integer inputs). Each op is checked three ways: its registry reference
directly, the graph on the NumPy backend (the expansion into primitive ops), and the segmented plan
(Engine("numpy")). Also: validation errors, the builder, the expansion in the plan, and every
kernel of these graphs compiled offline with NVRTC for sm_90."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from helpers.graphs import one_op
from helpers.torch_oracle import check_same, to_numpy, to_torch
from segfuse.compiler import Fusion, FusionDefinition, GraphError, run_graph
from segfuse.compiler.dtypes import DType
from segfuse.compiler.engine import Engine
from segfuse.compiler.ops import REGISTRY

TOL = {DType.float32: {"rtol": 1e-5, "atol": 1e-6}, DType.float64: {"rtol": 1e-12, "atol": 1e-12},
       DType.float16: {"rtol": 2e-3, "atol": 1e-3}, DType.bfloat16: {"rtol": 1.6e-2, "atol": 8e-3}}
TORCH_DT = {DType.float32: torch.float32, DType.float64: torch.float64, DType.float16: torch.float16,
            DType.bfloat16: torch.bfloat16, DType.int64: torch.int64, DType.bool: torch.bool}


def _graph(op: str, dt: DType, shape, n_out=1, **attrs) -> dict:
    out = "o" if n_out == 1 else [f"o{k}" for k in range(n_out)]
    return one_op(op, [("x", dt.value, shape)], ["x"], out=out, name="c", **attrs)


def _sample(rng, shape, dt: DType, special: bool = False) -> np.ndarray:
    if dt is DType.bool:
        return rng.random(shape) < 0.5
    if not dt.is_float:
        return rng.integers(-5, 6, shape).astype(dt.np)
    x = np.asarray(rng.standard_normal(shape) * 3, dtype=np.float64)
    if special and x.ndim == 2 and x.shape[0] >= 4 and x.shape[1] >= 3:
        x[0] = -np.inf  # a row of -inf
        x[1, 1] = np.inf  # a row with +inf
        x[2, 2] = np.nan  # a row with NaN
        x[3] = 0.75  # ties
    return x.astype(dt.np)


def _check(op: str, graph: dict, x: np.ndarray, want, dt: DType):
    want = list(want) if isinstance(want, tuple) else [want]
    f = Fusion.from_json(graph)
    names = [o if isinstance(o, str) else o["name"] for o in graph["outputs"]]
    ref = REGISTRY[op].ref([x], _attrs(op, graph), [f.types[n] for n in names])
    got = [("ref", ref), ("graph", [run_graph(f, {"x": x})[n] for n in names]),
           ("plan", [Engine("numpy").run(f, {"x": x}).outputs[n] for n in names])]
    for how, outs in got:
        for k, (a, w) in enumerate(zip(outs, want)):
            check_same(a, w, f"{op} {how} output {k}", TOL.get(dt))


def _attrs(op, graph):
    return REGISTRY[op].attrs.model_validate({k: v for k, v in graph["ops"][0].items() if k not in ("op", "out", "inputs")})


DTYPES = [DType.float32, DType.float16, DType.bfloat16, DType.float64]


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: d.value)
@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape, dim", [((6, 9), 1), ((6, 9), 0), ((2, 3, 4), -2), ((5,), 0), ((), 0), ((7, 1100), 1)])
def test_softmax_family(op, dt, shape, dim):
    x = _sample(np.random.default_rng(1), shape, dt, special=True)
    fn = getattr(torch, op)
    _check(op, _graph(op, dt, shape, dim=dim), x, fn(to_torch(x), dim), dt)


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
@pytest.mark.parametrize("src, dst", [(DType.int64, DType.float32), (DType.float32, DType.float64),
                                      (DType.float16, DType.float32), (DType.bool, DType.float16)])
def test_softmax_dtype_converts_first(op, src, dst):
    x = _sample(np.random.default_rng(2), (4, 7), src)
    want = getattr(torch, op)(to_torch(x), 1, dtype=TORCH_DT[dst])
    _check(op, _graph(op, src, (4, 7), dim=1, dtype=dst.value), x, want, dst)


@pytest.mark.parametrize("dt", DTYPES + [DType.int64, DType.bool], ids=lambda d: d.value)
@pytest.mark.parametrize("shape, dims, keepdim", [((6, 9), [1], False), ((6, 9), 0, True), ((2, 3, 4), [0, 2], False),
                                                  ((2, 3, 4), [], True), ((), [0], False), ((5, 1300), [1], False)])
def test_logsumexp(dt, shape, dims, keepdim):
    x = _sample(np.random.default_rng(3), shape, dt, special=True)
    tdims = dims if dims != [] else list(range(len(shape)))  # (torch's dim=[] fails; segfuse's [] is every dim)
    want = torch.logsumexp(to_torch(x), tdims, keepdim=keepdim)
    _check("logsumexp", _graph("logsumexp", dt, shape, dims=dims, keepdim=keepdim), x, want,
           dt if dt.is_float else DType.float32)


def _torch_var(op, t, dims, correction, keepdim):
    kw = {"dim": dims if dims not in (None, []) else None, "correction": correction, "keepdim": keepdim}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # (degrees of freedom <= 0)
        return getattr(torch, op)(t, **kw)


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: d.value)
@pytest.mark.parametrize("op", ["var", "std", "var_mean"])
@pytest.mark.parametrize("shape, dims, correction, keepdim", [
    ((6, 9), 1, 1, False), ((6, 9), [0], 0, True), ((2, 3, 4), [0, 2], 2, False), ((2, 3, 4), None, 1, True),
    ((5,), [], 0.5, False), ((), None, 1, False), ((3, 2), 1, 2, False), ((3, 2), 1, 3, False), ((4, 5), 0, -1, False),
    ((3, 1200), [1], 1, False)])
def test_var_family(op, dt, shape, dims, correction, keepdim):
    x = _sample(np.random.default_rng(4), shape, dt)
    want = _torch_var(op, to_torch(x), dims, correction, keepdim)
    g = _graph(op, dt, shape, n_out=2 if op == "var_mean" else 1, dims=dims, correction=correction, keepdim=keepdim)
    if dims is None:
        del g["ops"][0]["dims"]
    _check(op, g, x, want, dt)


@pytest.mark.parametrize("op", ["softmax", "log_softmax", "logsumexp", "var", "std", "var_mean"])
def test_empty_dims(op):
    """An empty reduced dim: softmax of it is empty, logsumexp -inf, var and mean NaN (PyTorch)."""
    x = np.zeros((3, 0), np.float32)
    attrs = {"dim": 1} if "softmax" in op else {"dims": [1]}
    want = (getattr(torch, op)(to_torch(x), 1) if op != "logsumexp" else torch.logsumexp(to_torch(x), [1])) \
        if op not in ("var", "std", "var_mean") else _torch_var(op, to_torch(x), 1, 1, False)
    _check(op, _graph(op, DType.float32, (3, 0), n_out=2 if op == "var_mean" else 1, **attrs), x, want, DType.float32)


@pytest.mark.parametrize("n", [0, 1, 2, 9])
def test_symbolic_sizes(n):
    """With a symbolic reduced dim the plan pads the max with -inf (the dim may be empty) and counts N
    at run time; both bound empty and not."""
    g = {"format": "segfuse.fusion/1", "name": "s", "inputs": [{"name": "x", "dtype": "float32", "shape": [3, "N"]}],
         "ops": [{"op": "softmax", "out": "p", "inputs": ["x"], "dim": 1},
                 {"op": "logsumexp", "out": "l", "inputs": ["x"], "dims": [1]},
                 {"op": "var_mean", "out": ["v", "m"], "inputs": ["x"], "dims": [1], "correction": 1},
                 {"op": "std", "out": "s", "inputs": ["x"], "correction": 0}],
         "outputs": ["p", "l", "v", "m", "s"]}
    f = Fusion.from_json(g)
    x = _sample(np.random.default_rng(5), (3, n), DType.float32)
    t = to_torch(x)
    v, m = _torch_var("var_mean", t, [1], 1, False)
    want = {"p": torch.softmax(t, 1), "l": torch.logsumexp(t, [1]), "v": v, "m": m,
            "s": _torch_var("std", t, None, 0, False)}
    for outs in (run_graph(f, {"x": x}), Engine("numpy").run(f, {"x": x}).outputs):
        for k, w in want.items():
            check_same(outs[k], w, k, TOL[DType.float32])


@pytest.mark.parametrize("dt", [DType.float32, DType.int64, DType.bool, DType.bfloat16], ids=lambda d: d.value)
@pytest.mark.parametrize("shape, dim, index", [((4, 6, 5), 0, 2), ((4, 6, 5), -1, -1), ((4, 6, 5), 1, -6), ((3,), 0, 1),
                                               ((2, 0, 3), 2, 1)])
def test_select(dt, shape, dim, index):
    x = _sample(np.random.default_rng(6), shape, dt)
    _check("select", _graph("select", dt, shape, dim=dim, index=index), x, torch.select(to_torch(x), dim, index), dt)


def test_select_feeding_a_reduction_and_a_scatter():
    g = {"format": "segfuse.fusion/1", "name": "s",
         "inputs": [{"name": "x", "dtype": "float32", "shape": [4, 6]}, {"name": "i", "dtype": "int64", "shape": [3, 6]}],
         "ops": [{"op": "select", "out": "r", "inputs": ["x"], "dim": 0, "index": -1},
                 {"op": "select", "out": "c", "inputs": ["i"], "dim": 1, "index": 2},
                 {"op": "sum", "out": "s", "inputs": ["r"]},
                 {"op": "index_select", "out": "g", "inputs": ["x", "c"], "dim": 0}],
         "outputs": ["r", "s", "g"]}
    rng = np.random.default_rng(7)
    x, i = rng.standard_normal((4, 6)).astype(np.float32), rng.integers(0, 4, (3, 6))
    f = Fusion.from_json(g)
    tx, ti = to_torch(x), to_torch(i)
    for outs in (run_graph(f, {"x": x, "i": i}), Engine("numpy").run(f, {"x": x, "i": i}).outputs):
        check_same(outs["r"], tx[-1])
        check_same(outs["s"], tx[-1].sum(), tol=TOL[DType.float32])
        check_same(outs["g"], tx.index_select(0, ti[:, 2]))


@pytest.mark.parametrize("op, dt, attrs, words", [
    ("softmax", "int64", {"dim": 0}, "softmax needs a floating-point input or dtype, got int64"),
    ("log_softmax", "float32", {"dim": 0, "dtype": "int32"}, "floating-point input or dtype, got int32"),
    ("softmax", "float32", {"dim": 2}, "dim 2 is out of range for a tensor of rank 2"),
    ("var", "int32", {"dims": 0}, "var needs a floating-point input, got int32"),
    ("std", "bool", {}, "std needs a floating-point input"),
    ("var_mean", "float32", {"dims": [0, 0]}, "dim 0 appears more than once"),
    ("logsumexp", "float32", {}, "field required"),
    ("select", "float32", {"dim": 1, "index": 5}, "index 5 is out of range for dim 1 of size 5"),
    ("select", "float32", {"dim": 0, "index": -4}, "index -4 is out of range for dim 0 of size 3"),
    ("var", "float32", {"dims": 1, "unbiased": True}, "unknown attribute for op 'var'"),
])
def test_validation_errors(op, dt, attrs, words):
    with pytest.raises(GraphError, match=words):
        Fusion.from_json(_graph(op, DType(dt), (3, 5), n_out=2 if op == "var_mean" else 1, **attrs))
    with pytest.raises(GraphError, match="select.. cannot be applied to a 0-d tensor"):
        Fusion.from_json(_graph("select", DType.float32, (), dim=0, index=0))


def test_select_index_checked_with_the_bound_size():
    from segfuse.compiler import BindError

    f = Fusion.from_json(_graph("select", DType.float32, ("N", 2), dim=0, index=3))
    with pytest.raises(BindError, match="index 3 is out of range for dim 0 of size 2"):
        run_graph(f, {"x": np.zeros((2, 2), np.float32)})
    check_same(run_graph(f, {"x": np.arange(10, dtype=np.float32).reshape(5, 2)})["o"], torch.tensor([6.0, 7.0]))


def test_builder_and_the_expansion_in_the_plan():
    with FusionDefinition("b") as fd:
        x = fd.define_tensor("x", shape=[4, 9], dtype="float16")
        p = fd.ops.softmax(x, 1)
        v, m = fd.ops.var_mean(x, dims=1, correction=0)
        r = fd.ops.select(fd.ops.logsumexp(x, [0], keepdim=True), 0, 0)
        s = fd.ops.std(x)
        for t, n in ((p, "p"), (v, "v"), (m, "m"), (r, "r"), (s, "s")):
            fd.add_output(t, n)
    assert [o["op"] for o in fd.to_dict()["ops"]] == ["softmax", "var_mean", "logsumexp", "select", "std"]
    x = _sample(np.random.default_rng(8), (4, 9), DType.float16)
    outs = fd.execute({"x": x})
    tx = to_torch(x)
    tv, tm = torch.var_mean(tx, 1, correction=0)
    for k, w in {"p": torch.softmax(tx, 1), "v": tv, "m": tm, "r": torch.logsumexp(tx, [0], keepdim=True)[0],
                 "s": torch.std(tx)}.items():
        check_same(outs[k], w, k, TOL[DType.float16])
    plan = Engine("numpy").plan(fd.fusion(), {"x": (4, 9)})
    f = fd.fusion()
    labels = [f.nodes[p].label() for s in plan.segments for p in s.nodes]
    assert any(" amax -> " in lb and lb.startswith("ops[0] ") for lb in labels), labels  # softmax's max
    assert any(" exp -> " in lb for lb in labels) and any(" mean -> " in lb for lb in labels)
    assert "p" in plan.to_json() and "#" in plan.to_json()  # the expansion's tensors are in the plan
    assert to_numpy(torch.tensor(1.0)).shape == ()


def test_every_kernel_of_these_ops_compiles_offline():
    pytest.importorskip("cuda.bindings.nvrtc")
    from offline_kernels import compile_sources, sources

    srcs = set()
    for op, attrs in (("softmax", {"dim": 1}), ("log_softmax", {"dim": 0}), ("logsumexp", {"dims": [1]}),
                      ("var", {"dims": 1}), ("std", {}), ("select", {"dim": 1, "index": 2})):
        for dt in (DType.float32, DType.bfloat16):
            for shape in ((5, 7), (3, "N")):
                f = Fusion.from_json(_graph(op, dt, shape, **attrs))
                srcs |= sources(f, {"x": _sample(np.random.default_rng(0), (5, 7) if shape == (5, 7) else (3, 40), dt)})
    assert compile_sources(srcs) >= 24
