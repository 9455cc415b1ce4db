"""Which generated kernels can fail (write the device error word), without a GPU.

A run synchronizes to read the error word only when one of its kernels checks something, so the
checks the codegen can prove always pass are left out: a divisor or exponent that is a literal
(as the kernel sees it, after rounding to the common dtype) and scatter indices produced by a
sort-kind op along a row no longer than the target dimension. Everything else keeps its check.
The GPU side (the run returns without waiting; errors still raise) is tests/gpu/test_fast_path.py.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from corpus import moe_graphs
from helpers.graphs import one_op
from segfuse.compiler.codegen.segment import generate
from segfuse.compiler.ir import Fusion
from segfuse.compiler.segmenter import segment


def _modules(graph: dict, shapes: dict, dtypes: dict | None = None):
    f = Fusion.from_json(graph)
    bound = f.bind(shapes, dtypes) if dtypes else f.bind(shapes)
    types = dict(bound.types)
    plan = segment(f, bound)
    return [generate(f, s, types, None, single_block=(s.kind.value == "single_block"))
            for s in plan.segments if s.nodes]


def _pointwise(op: str, dt: str, other) -> dict:
    """y = op(x, other): `other` an input of x's dtype and shape where it is a name, else a literal."""
    inputs = [(n, dt, ["N"]) for n in ("x", other) if isinstance(n, str)]
    return one_op(op, inputs, ["x", other], out="y", name="pw")


@pytest.mark.parametrize("op, dt, other, fails", [
    ("floor_divide", "int64", 8, False),
    ("floor_divide", "int32", -3, False),
    ("remainder", "int64", 7, False),
    ("ceil_div", "int32", 128, False),
    ("floor_divide", "int64", 0, True),  # always divides by zero: the run must report it
    ("floor_divide", "int8", 256, True),  # 256 is 0 in int8, the kernel's common dtype
    ("floor_divide", "int64", "d", True),  # a tensor divisor may hold a zero
    ("pow", "int64", 2, False),
    ("pow", "int64", -1, True),
    ("floor_divide", "float32", 0, False),  # float division by zero is inf/nan, not an error
])
def test_literal_operands_that_always_pass_need_no_check(op, dt, other, fails):
    shapes = {"x": (1000,)}
    if isinstance(other, str):
        shapes[other] = (1000,)
    (m,) = _modules(_pointwise(op, dt, other), shapes)
    assert m.may_fail is fails
    assert bool(re.search(r"\bsf_(?:nz|nonneg|fail)\(", m.source.split('extern "C"', 1)[1])) is fails


def _scatter_by(index_op: dict, n: int, m: int) -> dict:
    """o = scatter(zeros(M), index, iota(N)): index from `index_op` over x [N]."""
    return {"format": "segfuse.fusion/1", "name": "sc",
            "inputs": [{"name": "x", "dtype": "int32", "shape": [n]}],
            "ops": [index_op,
                    {"op": "full", "out": "z", "inputs": [], "shape": [m], "value": 0, "dtype": "int64"},
                    {"op": "iota", "out": "ar", "inputs": [], "length": n},
                    {"op": "scatter", "out": "o", "inputs": ["z", "i", "ar"], "dim": 0}],
            "outputs": ["o"]}


ARGSORT = {"op": "argsort", "out": "i", "inputs": ["x"], "dim": 0, "descending": True, "stable": True}
TOPK = {"op": "topk", "out": ["v", "i"], "inputs": ["x"], "k": 16}
CAST = {"op": "cast", "out": "i", "inputs": ["x"], "dtype": "int64"}


@pytest.mark.parametrize("index_op, n, m, fails", [
    (ARGSORT, 512, 512, False),  # an inverse permutation: indices in [0, 512)
    (ARGSORT, 512, 1024, False),
    (ARGSORT, 512, 511, True),  # index 511 would be out of range: keep the check
    (TOPK, 512, 512, False),
    (TOPK, 512, 300, True),
    (CAST, 512, 512, True),  # data used as indices: anything goes
])
def test_scatter_by_sorted_indices_needs_no_check(index_op, n, m, fails):
    mods = _modules(_scatter_by(index_op, n, m), {"x": (n,)})
    assert any(md.may_fail for md in mods) is fails


@pytest.mark.parametrize("idt", ["int64", "int32"])
@pytest.mark.parametrize("T", [1, 128])
def test_moe_fusions_that_cannot_fail(T, idt):
    """Only the expert histogram reads data as indices (expert ids could be >= E): it alone keeps a
    check, so the other MoE fusions' runs need no synchronization."""
    for g, mk in moe_graphs(idt=idt):
        ins = mk(T)(np.random.default_rng(0))
        mods = _modules(g, {k: v.shape for k, v in ins.items()})
        assert len(mods) == 1, g["name"]
        assert mods[0].may_fail is (g["name"] == "moe_problem_sizes"), g["name"]
