"""cummax and cummin (issue 15, item 4) against PyTorch on the CPU: values and int64 indices in every
dtype, along every dim, with many ties (PyTorch gives a tie the LATER position), NaN (propagates;
a later NaN takes the position), +-inf, empty dims, 0-d inputs, rows longer than one block; the
registry reference, the NumPy backend and the segmented plan; validation; the builder; the indices
feeding a gather and a scatter; every kernel compiled offline with NVRTC for sm_90."""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
from helpers.graphs import one_op
from helpers.torch_oracle import check_same, to_torch
from segfuse.compiler import Fusion, FusionDefinition, GraphError, run_graph
from segfuse.compiler.dtypes import DType
from segfuse.compiler.engine import Engine
from segfuse.compiler.ops import REGISTRY


def _graph(op, dt: DType, shape, dim) -> dict:
    return one_op(op, [("x", dt.value, shape)], ["x"], out=["v", "i"], name="c", dim=dim)


def _ties(rng, shape, dt: DType, special=False) -> np.ndarray:
    if dt is DType.bool:
        return rng.random(shape) < 0.5
    a = rng.integers(0 if dt is DType.uint8 else -3, 4, shape)
    if dt.is_float:
        a = a.astype(np.float64)
        if special and a.size >= 8:
            flat = a.reshape(-1)
            flat[rng.choice(a.size, 4, replace=False)] = [np.nan, np.inf, -np.inf, np.nan]
    return a.astype(dt.np)


def _check(op, dt, shape, dim, x):
    f = Fusion.from_json(_graph(op, dt, shape, dim))
    want = getattr(torch, op)(to_torch(x), dim)
    ref = REGISTRY[op].ref([x], f.nodes[0].attrs, [f.types["v"], f.types["i"]])
    for how, outs in (("ref", dict(zip("vi", ref))), ("graph", run_graph(f, {"x": x})),
                      ("plan", Engine("numpy").run(f, {"x": x}).outputs)):
        check_same(outs["v"], want.values, f"{op} {how} values")
        check_same(outs["i"], want.indices, f"{op} {how} indices")


@pytest.mark.parametrize("dt", list(DType), ids=lambda d: d.value)
@pytest.mark.parametrize("op", ["cummax", "cummin"])
@pytest.mark.parametrize("shape, dim", [((5, 40), 1), ((5, 40), 0), ((2, 3, 7), -2), ((9,), 0), ((), 0), ((), -1),
                                        ((3, 0), 1), ((0, 4), 1), ((2, 2100), 1)])
def test_values_and_indices_match_torch(op, dt, shape, dim):
    seed = zlib.crc32(repr((op, dt.value, shape, dim)).encode())  # (stable across processes, unlike hash())
    _check(op, dt, shape, dim, _ties(np.random.default_rng(seed), shape, dt, special=True))


@pytest.mark.parametrize("op", ["cummax", "cummin"])
def test_ties_take_the_later_position_and_nan_propagates(op):
    x = np.array([1, 3, 3, 2, 3, 5, 5, np.nan, 9, np.nan, -np.inf], np.float32)
    if op == "cummin":
        x = -x
    _check(op, DType.float32, x.shape, 0, x)
    out = run_graph(Fusion.from_json(_graph(op, DType.float32, x.shape, 0)), {"x": x})
    assert out["i"].tolist() == [0, 1, 2, 2, 4, 5, 6, 7, 7, 9, 9]


def test_validation_errors():
    with pytest.raises(GraphError, match="dim 2 is out of range for a tensor of rank 2"):
        Fusion.from_json(_graph("cummax", DType.float32, (3, 4), 2))
    g = _graph("cummin", DType.float32, (3, 4), 0)
    g["ops"][0]["out"] = "v"
    g["outputs"] = ["v"]
    with pytest.raises(GraphError, match="op 'cummin' has 2 result"):
        Fusion.from_json(g)


def test_builder_and_indices_feeding_a_gather_and_a_scatter():
    with FusionDefinition("cm") as fd:
        x = fd.define_tensor("x", shape=[4, 9], dtype="int32")
        v, i = fd.ops.cummax(x, 1)
        g = fd.ops.take_along_axis(fd.ops.neg(x), i, 1)
        hits = fd.ops.scatter(fd.ops.full_like(i, 0), 1, i, 1, reduce="add")
        for t, n in ((v, "v"), (i, "i"), (g, "g"), (hits, "hits")):
            fd.add_output(t, n)
    x = _ties(np.random.default_rng(3), (4, 9), DType.int32)
    tx = to_torch(x)
    want = torch.cummax(tx, 1)
    for outs in (fd.execute({"x": x}), run_graph(fd.fusion(), {"x": x})):
        check_same(outs["v"], want.values)
        check_same(outs["i"], want.indices)
        check_same(outs["g"], torch.take_along_dim(-tx, want.indices, 1))
        check_same(outs["hits"], torch.zeros(4, 9, dtype=torch.int64).scatter_add(1, want.indices,
                                                                                  torch.ones(4, 9, dtype=torch.int64)))


def test_every_kernel_compiles_offline():
    pytest.importorskip("cuda.bindings.nvrtc")
    from offline_kernels import compile_sources, sources

    srcs = set()
    for op in ("cummax", "cummin"):
        for dt in (DType.float32, DType.float16, DType.int64, DType.bool, DType.float64):
            for shape, dim in (((3, 50), 1), ((), 0), (("N", 6), 0)):
                f = Fusion.from_json(_graph(op, dt, shape, dim))
                x = _ties(np.random.default_rng(0), tuple(5 if d == "N" else d for d in shape), dt)
                srcs |= sources(f, {"x": x})
    assert compile_sources(srcs) >= 30
