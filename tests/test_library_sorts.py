"""The CUDA backend's library sorts (compiler/cuda/library_sorts.py), chosen by the registry's
`library_sort` trait, on the CPU: NumPy stands in for CuPy (with CuPy's stable argsort), PyTorch's
stable sort is the oracle. Rows of several sort rows take CuPy's path, not our radix sort."""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from helpers.torch_oracle import check_same, to_torch
from segfuse.compiler.cuda.library_sorts import library_run
from segfuse.compiler.ir import Fusion
from segfuse.compiler.plan import Segment, SegmentKind


class StableNumpy:
    """NumPy as CuPy: cupy.argsort is a stable (thrust) sort; NumPy's default is not."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def argsort(x, axis=-1):
        return np.argsort(x, axis=axis, kind="stable")


def _run(op: dict, x: np.ndarray) -> list:
    outs = [op["out"]] if isinstance(op["out"], str) else op["out"]
    f = Fusion.from_json({"format": "segfuse.fusion/1", "name": "lib", "ops": [op], "outputs": outs,
                          "inputs": [{"name": "x", "dtype": str(x.dtype), "shape": list(x.shape)}]})
    ts = f.bind({"x": x.shape}).types
    seg = Segment(0, SegmentKind.library, [0], ["x"], outs, "test")
    run = library_run(types.SimpleNamespace(cp=StableNumpy()), f, seg, ts)
    assert run is not None
    env = {"x": x}
    run(env, types.SimpleNamespace(state=None))
    return [env[o] for o in outs]


@pytest.mark.parametrize("dtype", ["float32", "int32"])
@pytest.mark.parametrize("descending", [False, True])
def test_argsort_and_sort_match_torch_stable_sort(dtype, descending):
    x = np.random.default_rng(3).integers(-4, 5, (4, 37)).astype(dtype)  # many ties
    want_v, want_i = torch.sort(to_torch(x), dim=1, descending=descending, stable=True)
    (i,) = _run({"op": "argsort", "out": "i", "inputs": ["x"], "dim": 1, "descending": descending}, x)
    check_same(i, want_i, "argsort")
    v, i = _run({"op": "sort", "out": ["v", "i"], "inputs": ["x"], "dim": 1, "descending": descending}, x)
    check_same(v, want_v, "sort values")
    check_same(i, want_i, "sort indices")


@pytest.mark.parametrize("largest", [True, False])
def test_topk_takes_the_first_k_of_the_stable_sort(largest):
    x = np.random.default_rng(4).integers(-3, 4, (37, 5)).astype(np.float32)
    want_v, want_i = torch.sort(to_torch(x), dim=0, descending=largest, stable=True)
    v, i = _run({"op": "topk", "out": ["v", "i"], "inputs": ["x"], "k": 6, "dim": 0, "largest": largest}, x)
    check_same(v, want_v[:6], "topk values")
    check_same(i, want_i[:6], "topk indices")


def test_a_segment_of_a_non_sort_op_is_not_a_library_sort():
    x = np.ones((2, 3), np.float32)
    f = Fusion.from_json({"format": "segfuse.fusion/1", "name": "lib", "outputs": ["y"],
                          "ops": [{"op": "neg", "out": "y", "inputs": ["x"]}],
                          "inputs": [{"name": "x", "dtype": "float32", "shape": [2, 3]}]})
    seg = Segment(0, SegmentKind.library, [0], ["x"], ["y"], "test")
    assert library_run(types.SimpleNamespace(cp=np), f, seg, f.bind({"x": x.shape}).types) is None
