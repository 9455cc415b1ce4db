"""scatter with reduce "mean" and index_reduce (issue 15, item 4) against PyTorch on the CPU:
torch.scatter_reduce(..., "mean", include_self) and torch.index_reduce (prod, mean, amax, amin,
include_self) in every dtype they take, with duplicate indices, untouched targets, NaN sources,
int32 indices, empty indices; the registry reference, the NumPy backend (the expansion of "mean"
into primitives) and the segmented plan; validation (PyTorch's names get hints), run-time index
errors that name the op, the builder, the expansion in the plan, offline NVRTC compiles."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from helpers.graphs import one_op
from helpers.torch_oracle import check_same, to_torch
from segfuse.compiler import Fusion, FusionDefinition, GraphError, RunError, run_graph
from segfuse.compiler.dtypes import DType
from segfuse.compiler.engine import Engine
from segfuse.compiler.ops import REGISTRY

DTYPES = [DType.float32, DType.float16, DType.bfloat16, DType.float64, DType.int64, DType.int32, DType.int8, DType.uint8]
TORCH_REDUCE = {"mul": "prod", "mean": "mean", "amax": "amax", "amin": "amin", "add": "sum"}
TOL = {"rtol": 1e-6, "atol": 1e-6}


def _values(rng, shape, dt: DType) -> np.ndarray:
    """Small integers (exact sums in every dtype, so the order of accumulation cannot matter)."""
    lo = 0 if dt is DType.uint8 else -4
    return rng.integers(lo, 5, shape).astype(dt.np)


def _run_all(op, graph, ins, attrs_of=None):
    f = Fusion.from_json(graph)
    node_attrs = REGISTRY[op].attrs.model_validate({k: v for k, v in graph["ops"][0].items()
                                                    if k not in ("op", "out", "inputs")})
    args = [ins[x] if isinstance(x, str) else x for x in graph["ops"][0]["inputs"]]
    ref = REGISTRY[op].ref(args, node_attrs, [f.types["o"]])[0]
    return {"ref": ref, "graph": run_graph(f, dict(ins))["o"], "plan": Engine("numpy").run(f, dict(ins)).outputs["o"]}


def _graph(op, ins: dict, operands, **attrs) -> dict:
    return one_op(op, ins, operands, out="o", name="m", **attrs)


@pytest.mark.parametrize("dt", DTYPES, ids=lambda d: d.value)
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("shape, idx_shape, dim", [((10,), (40,), 0), ((4, 9), (4, 5), 1), ((5, 3), (7, 2), 0),
                                                   ((3, 4), (2, 0, 5), 0)])
def test_scatter_mean(dt, include_self, shape, idx_shape, dim):
    rng = np.random.default_rng(11)
    size = shape[dim % len(shape)]
    ins = {"s": _values(rng, shape, dt), "i": rng.integers(0, size, idx_shape), "v": _values(rng, idx_shape, dt)}
    want = to_torch(ins["s"]).scatter_reduce(dim, to_torch(ins["i"]), to_torch(ins["v"]), "mean",
                                             include_self=include_self)
    g = _graph("scatter", ins, ["s", "i", "v"], dim=dim, reduce="mean", include_self=include_self)
    for how, got in _run_all("scatter", g, ins).items():
        check_same(got, want, f"scatter mean {how}", TOL)


@pytest.mark.parametrize("dt", [DType.float32, DType.int64, DType.float16], ids=lambda d: d.value)
def test_scatter_mean_of_a_number_and_int32_indices(dt):
    rng = np.random.default_rng(12)
    ins = {"s": _values(rng, (4, 9), dt), "j": rng.integers(0, 9, (4, 5)).astype(np.int32)}
    src = torch.full((4, 5), 3, dtype=to_torch(ins["s"]).dtype)
    for inc in (True, False):
        want = to_torch(ins["s"]).scatter_reduce(1, to_torch(ins["j"]).long(), src, "mean", include_self=inc)
        g = _graph("scatter", ins, ["s", "j", 3], dim=1, reduce="mean", include_self=inc)
        for how, got in _run_all("scatter", g, ins).items():
            check_same(got, want, f"scatter mean of 3 {how}", TOL)


@pytest.mark.parametrize("dt", [d for d in DTYPES], ids=lambda d: d.value)
@pytest.mark.parametrize("reduce", ["mul", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("shape, n, dim", [((6, 5), 9, 0), ((4, 7), 3, 1), ((2, 3, 4), 5, -2), ((5,), 8, 0),
                                           ((4, 3), 0, 0)])
def test_index_reduce(dt, reduce, include_self, shape, n, dim):
    rng = np.random.default_rng(13)
    d = dim % len(shape)
    src_shape = tuple(n if k == d else s for k, s in enumerate(shape))
    ins = {"s": _values(rng, shape, dt), "i": rng.integers(0, shape[d], n), "v": _values(rng, src_shape, dt)}
    if reduce == "mul" and dt.is_int:  # (products of 9 values: keep them small; PyTorch wraps the same anyway)
        ins["s"], ins["v"] = np.sign(ins["s"]).astype(dt.np) + 1, np.sign(ins["v"]).astype(dt.np) + 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # (index_reduce is in beta)
        want = to_torch(ins["s"]).index_reduce(dim, to_torch(ins["i"]), to_torch(ins["v"]), TORCH_REDUCE[reduce],
                                               include_self=include_self)
    g = _graph("index_reduce", ins, ["s", "i", "v"], dim=dim, reduce=reduce, include_self=include_self)
    for how, got in _run_all("index_reduce", g, ins).items():
        check_same(got, want, f"index_reduce {reduce} {how}", TOL)


@pytest.mark.parametrize("reduce", ["amax", "amin", "mean", "mul"])
def test_index_reduce_nan_and_int32_index(reduce):
    rng = np.random.default_rng(14)
    ins = {"s": rng.standard_normal((5, 4)).astype(np.float32), "i": np.array([0, 3, 0, 3, 1], np.int32),
           "v": rng.standard_normal((5, 4)).astype(np.float32)}
    ins["v"][0, 1] = np.nan
    ins["s"][1, 2] = np.nan
    for inc in (True, False):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            want = to_torch(ins["s"]).index_reduce(0, to_torch(ins["i"]).long(), to_torch(ins["v"]),
                                                   TORCH_REDUCE[reduce], include_self=inc)
        g = _graph("index_reduce", ins, ["s", "i", "v"], dim=0, reduce=reduce, include_self=inc)
        for how, got in _run_all("index_reduce", g, ins).items():
            check_same(got, want, f"index_reduce {reduce} {how}", {"rtol": 1e-6, "atol": 1e-6})


def test_index_reduce_add_is_index_add_with_include_self():
    rng = np.random.default_rng(15)
    ins = {"s": _values(rng, (4, 3), DType.int64), "i": np.array([0, 2, 0]), "v": _values(rng, (3, 3), DType.int64)}
    want = to_torch(ins["s"]).index_add(0, to_torch(ins["i"]), to_torch(ins["v"]))
    for how, got in _run_all("index_reduce", _graph("index_reduce", ins, ["s", "i", "v"], dim=0, reduce="add"),
                             ins).items():
        check_same(got, want, how)
    cleared = to_torch(ins["s"]).index_fill(0, to_torch(ins["i"]), 0).index_add(0, to_torch(ins["i"]), to_torch(ins["v"]))
    g = _graph("index_reduce", ins, ["s", "i", "v"], dim=0, reduce="add", include_self=False)
    for how, got in _run_all("index_reduce", g, ins).items():
        check_same(got, cleared, how)


def _one(op, dt="float32", idx=(3,), src=(3, 4), **attrs):
    ins = {"s": np.zeros((5, 4), DType(dt).np), "i": np.zeros(idx, np.int64), "v": np.zeros(src, DType(dt).np)}
    return _graph(op, ins, ["s", "i", "v"], dim=0, **attrs)


@pytest.mark.parametrize("graph, where, words", [
    (_one("scatter", "bool", src=(3, 4), idx=(3, 4), reduce="mean"), ("ops", 0, "reduce"),
     "scatter with reduce 'mean' is not supported for bool"),
    (_one("index_reduce", "bool", reduce="amax"), ("ops", 0, "inputs", 0), "index_reduce is not supported for bool"),
    (_one("index_reduce", reduce="prod"), ("ops", 0, "reduce"), "did you mean 'mul'?"),
    (_one("index_reduce", reduce="sum"), ("ops", 0, "reduce"), "did you mean 'add'?"),
    (_one("index_reduce"), ("ops", 0, "reduce"), "field required"),
    (_one("index_reduce", idx=(3, 1), reduce="mean"), ("ops", 0, "inputs", 1), "index_reduce needs a 1-D index"),
    (_one("index_reduce", src=(2, 4), reduce="mean"), ("ops", 0, "inputs", 2), "source shape [2, 4] should be [5, 4]"),
    (_one("scatter", idx=(3, 4), src=(3, 4), reduce="avg"), ("ops", 0, "reduce"), "'amin' or 'mean'"),
])
def test_validation_errors(graph, where, words):
    with pytest.raises(GraphError) as e:
        Fusion.from_json(graph)
    (issue,) = e.value.issues
    assert issue.loc == where and words in issue.msg, issue


@pytest.mark.parametrize("op", ["scatter", "index_reduce"])
def test_a_bad_index_at_run_time_names_the_op(op):
    ins = {"s": np.zeros((5, 4), np.float32), "i": np.array([[0, 7, 1]] if op == "scatter" else [0, 7, 1]),
           "v": np.ones((3, 4) if op == "index_reduce" else (1, 3), np.float32)}
    g = _graph(op, ins, ["s", "i", "v"], dim=0 if op == "index_reduce" else 1, reduce="mean")
    f = Fusion.from_json(g)
    for run in (lambda: run_graph(f, dict(ins)), lambda: Engine("numpy").run(f, dict(ins))):
        with pytest.raises(RunError) as e:
            run()
        assert e.value.issues[0].loc[:2] == ("ops", 0)
        assert f"{op}: index 7 is out of bounds" in str(e.value)


def test_builder_and_the_expansion_in_the_plan():
    with FusionDefinition("ir") as fd:
        s = fd.define_tensor("s", shape=[6, 4], dtype="float32")
        i = fd.define_tensor("i", shape=[5], dtype="int64")
        v = fd.define_tensor("v", shape=[5, 4], dtype="float32")
        fd.add_output(fd.ops.index_reduce(s, 0, i, v, "mean", include_self=False), "m")
        fd.add_output(fd.ops.index_reduce(s, 0, i, v, reduce="amax"), "a")
        fd.add_output(fd.ops.scatter(s, 0, fd.ops.unsqueeze(i, 1), 1.5, reduce="mean"), "sm")
    rng = np.random.default_rng(16)
    ins = {"s": _values(rng, (6, 4), DType.float32), "i": rng.integers(0, 6, 5), "v": _values(rng, (5, 4), DType.float32)}
    ts, ti, tv = (to_torch(ins[k]) for k in "siv")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        want = {"m": ts.index_reduce(0, ti, tv, "mean", include_self=False), "a": ts.index_reduce(0, ti, tv, "amax"),
                "sm": ts.scatter_reduce(0, ti[:, None], torch.full((5, 1), 1.5), "mean")}
    outs = fd.execute(ins)
    for k, w in want.items():
        check_same(outs[k], w, k, TOL)
    f = fd.fusion()
    plan = Engine("numpy").plan(f, {k: v.shape for k, v in ins.items()})
    labels = [f.nodes[p].label() for seg in plan.segments for p in seg.nodes]
    assert sum(lb.startswith("ops[0] index_reduce ") for lb in labels) == 2  # the sum and the count
    assert any(lb.startswith("ops[0] maximum ") for lb in labels) and any(lb.startswith("ops[0] div -> m") for lb in labels)
    assert [lb for lb in labels if lb.startswith("ops[1] ")] == ["ops[1] index_reduce -> a"]  # amax stays one node


def test_every_kernel_compiles_offline():
    pytest.importorskip("cuda.bindings.nvrtc")
    from offline_kernels import compile_sources, sources

    srcs = set()
    rng = np.random.default_rng(0)
    for dt in (DType.float16, DType.int64):  # (every dtype: the corpus, tests/test_codegen_compile.py)
        ins = {"s": _values(rng, (6, 5), dt), "i": rng.integers(0, 6, 9), "v": _values(rng, (9, 5), dt),
               "j": rng.integers(0, 5, (6, 5))}
        for reduce in ("mul", "mean"):
            for inc in (True, False):
                g = _graph("index_reduce", ins, ["s", "i", "v"], dim=0, reduce=reduce, include_self=inc)
                g["ops"].append({"op": "scatter", "out": "p", "inputs": ["s", "j", "s"], "dim": 1, "reduce": "mean",
                                 "include_self": inc})
                g["outputs"].append("p")
                srcs |= sources(Fusion.from_json(g), ins)
    assert compile_sources(srcs) >= 8
