"""The planner and the code generator agree at the limits they share (compiler/limits.py): the
index width the plan records is the one the kernel uses, and a sort row the plan leaves to codegen
fits the shared memory codegen has, one element more does not. Shapes only: nothing is allocated."""

from __future__ import annotations

import pytest
from segfuse.compiler.codegen.lazy import Unsupported
from segfuse.compiler.codegen.segment import generate
from segfuse.compiler.dtypes import DType
from segfuse.compiler.engine import Engine
from segfuse.compiler.ir import Fusion
from segfuse.compiler.limits import INDEX32_MAX, SMEM_PER_BLOCK
from segfuse.compiler.plan import Segment, SegmentKind
from segfuse.compiler.segmenter.capability import DEFAULT_CAPABILITY, max_sort_row

ENGINE = Engine("numpy")


def _graph(ops, inputs, outputs):
    return Fusion.from_json({"format": "segfuse.fusion/1", "name": "limits", "inputs": inputs, "ops": ops,
                             "outputs": outputs})


@pytest.mark.parametrize("n, bits", [(INDEX32_MAX, 32), (INDEX32_MAX + 1, 64)])
def test_plan_and_kernel_choose_the_same_index_width(n, bits):
    f = _graph([{"op": "add", "out": "y", "inputs": ["x", 1]}], [{"name": "x", "dtype": "int8", "shape": [n]}], ["y"])
    plan = ENGINE.plan(f, {"x": (n,)})
    types = f.bind({"x": (n,)}).types
    (seg,) = [s for s in plan.segments if s.nodes]
    assert seg.hints["index_bits"] == bits
    mod = generate(f, seg, types)
    assert mod.index_bits == bits
    assert ("long long l = " in mod.source) == (bits == 64)  # the loop index itself


def test_index32_limit_leaves_a_grid_of_overshoot():
    # a grid-stride loop tests l < n after stepping by up to a whole grid (2^25 threads here)
    assert INDEX32_MAX + 2**25 <= 2**31 - 1
    assert DEFAULT_CAPABILITY.index32_limit == INDEX32_MAX


@pytest.mark.parametrize("dtype", [DType.float32, DType.int64, DType.float16])
def test_a_sort_row_the_plan_leaves_to_codegen_fits_shared_memory(dtype):
    row = max_sort_row(dtype, DEFAULT_CAPABILITY)
    assert DEFAULT_CAPABILITY.sort_smem_bytes == SMEM_PER_BLOCK
    for length, fits in ((row, True), (row + 1, False)):
        shape = (4, length)  # several rows: a grid-mode sort (one row per block), no radix sort
        f = _graph([{"op": "argsort", "out": "o", "inputs": ["x"], "dim": 1, "stable": True}],
                   [{"name": "x", "dtype": dtype.value, "shape": list(shape)}], ["o"])
        kinds = [s.kind for s in ENGINE.plan(f, {"x": shape}).segments]
        assert (SegmentKind.library in kinds) == (not fits), (length, kinds)
        seg = Segment(0, SegmentKind.sort, [0], ["x"], ["o"], "limit")
        types = f.bind({"x": shape}).types
        if fits:
            mod = generate(f, seg, types, single_block=False)
            assert mod.launches[0].smem <= SMEM_PER_BLOCK
        else:
            with pytest.raises(Unsupported, match="shared memory"):
                generate(f, seg, types, single_block=False)
