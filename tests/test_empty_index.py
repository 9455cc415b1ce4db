"""Empty indices of any rank (issue 15, item 3): PyTorch checks no shapes of a scatter's or a
gather's operands when the index is empty, so a scatter returns `self` unchanged and a gather an
empty tensor of the index's shape, whatever the index's rank; a non-empty index of another rank is
still refused. Against PyTorch on the CPU (the NumPy backend and the segmented plan), and every
kernel of these graphs compiles offline with NVRTC."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers.graphs import graph
from helpers.torch_oracle import check_same, to_torch
from segfuse.compiler import BindError, Fusion, GraphError, run_graph
from segfuse.compiler.engine import Engine


def _graph(self_shape, idx_shape, op="scatter", src=None, dt="float32", **attrs):
    ins = [{"name": "x", "dtype": dt, "shape": list(self_shape)},
           {"name": "i", "dtype": "int64", "shape": list(idx_shape)}]
    inputs = ["x", "i"]
    if op == "scatter":
        if isinstance(src, tuple):
            ins.append({"name": "v", "dtype": dt, "shape": list(src)})
            inputs.append("v")
        else:
            inputs.append(src)
    return graph(ins, [{"op": op, "out": "o", "inputs": inputs, "dim": attrs.pop("dim", 0), **attrs},
                       {"op": "mul", "out": "o2", "inputs": ["o", 2]}], ["o", "o2"], "e")


CASES = [  # (self shape, index shape, src: shape or number, attrs)
    ((3, 4), (0,), (0,), {}),
    ((3, 4), (0,), (3, 4), {"reduce": "add"}),
    ((3, 4), (0,), (1, 1, 1, 1, 1), {"reduce": "amax", "include_self": False}),
    ((3, 4), (2, 0, 5), 1.5, {"dim": 1}),
    ((3, 4), (2, 0, 5), (2, 0, 5), {"dim": -1, "reduce": "mul"}),
    ((3, 4), (0, 10), (0, 10), {"reduce": "add"}),  # equal ranks, sizes beyond self's: unchecked too
    ((5,), (2, 0), 7.0, {"reduce": "amin", "include_self": False}),
]


def _torch_scatter(x, i, src, attrs):
    dim = attrs.get("dim", 0)
    red = {"add": "sum", "mul": "prod", "amax": "amax", "amin": "amin"}.get(attrs.get("reduce", "none"))
    if red is None:
        return x.scatter(dim, i, src)
    if not isinstance(src, torch.Tensor):
        src = torch.full(i.shape, src, dtype=x.dtype)
    return x.scatter_reduce(dim, i, src, red, include_self=attrs.get("include_self", True))


def _inputs(self_shape, idx_shape, src, rng):
    ins = {"x": rng.standard_normal(self_shape).astype(np.float32), "i": np.zeros(idx_shape, np.int64)}
    if isinstance(src, tuple):
        ins["v"] = rng.standard_normal(src).astype(np.float32)
    return ins


@pytest.mark.parametrize("case", CASES, ids=[f"{c[0]}-{c[1]}-{c[2]}" for c in CASES])
def test_scatter_with_an_empty_index_returns_self(case):
    self_shape, idx_shape, src, attrs = case
    f = Fusion.from_json(_graph(self_shape, idx_shape, src=src, **dict(attrs)))
    ins = _inputs(self_shape, idx_shape, src, np.random.default_rng(0))
    want = _torch_scatter(to_torch(ins["x"]), to_torch(ins["i"]), to_torch(ins["v"]) if "v" in ins else src, attrs)
    assert torch.equal(want, to_torch(ins["x"]))  # (PyTorch's behaviour, the premise of the fix)
    for outs in (run_graph(f, ins), Engine("numpy").run(f, ins).outputs):
        check_same(outs["o"], want, "scatter")
        check_same(outs["o2"], want * 2, "scatter * 2")


def test_scatter_into_0d_self_with_an_empty_index():
    f = Fusion.from_json(_graph((), (2, 0, 5), src=1.0))
    ins = {"x": np.array(5.0, np.float32), "i": np.zeros((2, 0, 5), np.int64)}
    want = to_torch(ins["x"]).scatter(0, to_torch(ins["i"]), 1.0)
    check_same(run_graph(f, ins)["o"], want)
    check_same(Engine("numpy").run(f, ins).outputs["o"], want)


@pytest.mark.parametrize("self_shape, idx_shape, dim", [((3, 4), (2, 0, 5), 0), ((3, 4), (0,), 1), ((), (0, 2), 0),
                                                        ((3, 4), (0, 9), 1)])
def test_gather_with_an_empty_index_is_empty_of_its_shape(self_shape, idx_shape, dim):
    f = Fusion.from_json(_graph(self_shape, idx_shape, op="gather", dim=dim))
    ins = {"x": np.ones(self_shape, np.float32), "i": np.zeros(idx_shape, np.int64)}
    want = to_torch(ins["x"]).gather(dim, to_torch(ins["i"]))
    for outs in (run_graph(f, ins), Engine("numpy").run(f, ins).outputs):
        check_same(outs["o"], want, "gather")


def test_a_nonempty_index_of_another_rank_is_still_refused():
    for op in ("scatter", "gather"):
        with pytest.raises(GraphError, match=f"index has rank 1 but self has rank 2; {op} needs equal ranks"):
            Fusion.from_json(_graph((3, 4), (2,), op=op, src=(2,)))
    with pytest.raises(GraphError, match="src has rank 1 but self has rank 2"):
        Fusion.from_json(_graph((3, 4), (2, 2), src=(2,)))


def test_a_symbolic_index_of_another_rank_is_checked_with_its_bound_size():
    f = Fusion.from_json(_graph(("M", 4), ("N",), src=("N",), reduce="add"))
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    out = run_graph(f, {"x": x, "i": np.zeros(0, np.int64), "v": np.zeros(0, np.float32)})
    np.testing.assert_array_equal(out["o"], x)
    with pytest.raises(BindError, match="index has rank 1 but self has rank 2"):
        run_graph(f, {"x": x, "i": np.zeros(3, np.int64), "v": np.zeros(3, np.float32)})


def test_every_kernel_of_these_graphs_compiles_offline():
    pytest.importorskip("cuda.bindings.nvrtc")
    from offline_kernels import compile_sources, sources

    srcs = set()
    for self_shape, idx_shape, src, attrs in CASES:
        f = Fusion.from_json(_graph(self_shape, idx_shape, src=src, **dict(attrs)))
        srcs |= sources(f, _inputs(self_shape, idx_shape, src, np.random.default_rng(0)))
    f = Fusion.from_json(_graph((3, 4), (2, 0, 5), op="gather"))
    srcs |= sources(f, {"x": np.ones((3, 4), np.float32), "i": np.zeros((2, 0, 5), np.int64)})
    assert compile_sources(srcs) >= len(CASES)
