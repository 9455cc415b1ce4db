"""The planner and the code generator agree at the limits they share (compiler/limits.py): the
index width the plan records is the one the kernel uses, the kernels at the largest 32-bit size
step past the end without overflowing, and a sort row the plan leaves to codegen fits the shared
memory codegen has, one element more does not. Shapes only: nothing is allocated."""

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


@pytest.mark.parametrize("dtype", ["int8", "float32"])
def test_grid_stride_loops_at_the_32bit_limit_do_not_overflow(dtype):
    # a grid-stride loop tests l < n after stepping by a whole grid: at the largest size indexed
    # with 32 bits, the last index plus every launch's threads still fits an int (the vector
    # variant steps over vectors of 4 elements)
    n = INDEX32_MAX
    f = _graph([{"op": "add", "out": "y", "inputs": ["x", 1]}], [{"name": "x", "dtype": dtype, "shape": [n]}], ["y"])
    (seg,) = [s for s in ENGINE.plan(f, {"x": (n,)}).segments if s.nodes]
    mod = generate(f, seg, f.bind({"x": (n,)}).types)
    assert mod.index_bits == 32 and mod.launches
    for launch in mod.launches:
        items = n // 4 if launch.vector_of is not None else n
        assert items - 1 + launch.grid * launch.block <= 2**31 - 1, launch


@pytest.mark.parametrize("dtype", [DType.float32, DType.int64, DType.float16])
def test_a_sort_row_the_plan_leaves_to_codegen_fits_shared_memory(dtype):
    row = max_sort_row(dtype, DEFAULT_CAPABILITY)
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
