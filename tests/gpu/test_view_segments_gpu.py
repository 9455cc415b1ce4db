"""The plan's views on the H200 (issue 14): a view segment launches nothing, a view output of a
kernel is a view of what the kernel wrote, a reshape of a non-contiguous input falls back to a
kernel, and every result equals the NumPy interpreter's, on the general path and the fast path
(second call) alike."""

from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from corpus import all_cases, case_inputs  # noqa: E402
from helpers.graphs import view_of_kernel_output, view_only  # noqa: E402
from segfuse.compiler import FusionDefinition  # noqa: E402
from segfuse.compiler.cuda.runtime import get_runtime  # noqa: E402
from segfuse.compiler.engine import Engine  # noqa: E402
from segfuse.compiler.ir import Fusion  # noqa: E402
from segfuse.compiler.numpy_backend import run_graph  # noqa: E402

pytestmark = pytest.mark.gpu


def _same(got: dict, want: dict):
    for k, w in want.items():
        g, w = cp.asnumpy(got[k]), np.asarray(w)
        if g.dtype != w.dtype and g.dtype.itemsize == w.dtype.itemsize:
            g = g.view(w.dtype)  # bfloat16 results travel as uint16 bits
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=1e-5, atol=1e-6, err_msg=k)


def _twice(eng, f, ins):
    first = eng.run(f, ins).outputs
    second = eng.run(f, ins).outputs  # the per-signature fast path
    return first, second


def test_a_view_segment_launches_nothing_and_returns_a_copy_of_the_input():
    f, eng = view_only(), Engine("cupy")
    x = cp.asarray(np.random.default_rng(0).standard_normal((4096, 3)).astype(np.float32))
    for out in _twice(eng, f, {"x": x}):
        assert out["flat"].shape == (4096 * 3,) and not cp.shares_memory(out["flat"], x)
        _same(out, run_graph(f, {"x": cp.asnumpy(x)}))
    prep = get_runtime().prepared_for(f, {"x": x})
    assert [s.kind for s in prep.steps] == ["view"] and prep.kernels == 0


def test_a_reshape_of_a_transposed_input_is_made_by_a_kernel():
    f, eng = view_only(), Engine("cupy")
    base = cp.asarray(np.arange(3 * 4096, dtype=np.float32).reshape(3, 4096))
    x = base.T  # (4096, 3), not contiguous
    for out in _twice(eng, f, {"x": x}):
        _same(out, {"flat": cp.asnumpy(x).reshape(-1)})
    prep = get_runtime().prepared_for(f, {"x": x})
    assert [s.kind for s in prep.steps] == ["kernel"]


def test_views_of_a_kernel_output_share_its_buffer():
    f, eng = view_of_kernel_output(), Engine("cupy")
    x = cp.asarray(np.random.default_rng(1).standard_normal((512, 7)).astype(np.float32))
    for out in _twice(eng, f, {"x": x}):
        assert cp.shares_memory(out["r"], out["y"]) and cp.shares_memory(out["u"], out["y"])
        _same(out, run_graph(f, {"x": cp.asnumpy(x)}))


def test_outputs_that_view_inputs_or_broadcast_are_dense_copies():
    with FusionDefinition("commits_gpu") as fd:
        x = fd.define_tensor("x", ["A", "B"], "float32")
        v = fd.define_tensor("v", ["B"], "float32")
        y = fd.ops.exp(x)
        fd.add_output(x)
        fd.add_output(fd.ops.reshape(x, [-1]), "flat_x")
        fd.add_output(fd.ops.expand(v, ["A", -1]), "wide")
        fd.add_output(y, "y")
        fd.add_output(fd.ops.reshape(y, [-1]), "flat_y")
    f, eng = fd.fusion(), Engine("cupy")
    rng = np.random.default_rng(2)
    ins = {"x": cp.asarray(rng.standard_normal((64, 5)).astype(np.float32)),
           "v": cp.asarray(rng.standard_normal(5).astype(np.float32))}
    for out in _twice(eng, f, ins):
        assert not cp.shares_memory(out["x"], ins["x"]) and not cp.shares_memory(out["flat_x"], ins["x"])
        assert out["wide"].flags.c_contiguous
        _same(out, run_graph(f, {k: cp.asnumpy(a) for k, a in ins.items()}))


@pytest.mark.parametrize("prefix", ["mv_", "gather_"])
def test_multi_shape_pointwise_segments_run_in_one_launch(prefix):
    eng = Engine("cupy")
    for case in [c for c in all_cases() if c[0].startswith(prefix)]:
        f = Fusion.from_json(case[1])
        ins = case_inputs(case)
        # (bfloat16 inputs go as host arrays: the runtime uploads their bits)
        host = any(v.dtype.itemsize == 2 and v.dtype.kind == "V" or str(v.dtype) == "bfloat16" for v in ins.values())
        dev = ins if host else {k: cp.asarray(v) for k, v in ins.items()}
        for out in _twice(eng, f, dev):
            _same(out, run_graph(f, ins))
        prep = get_runtime().prepared_for(f, dev)
        assert prep.kernels == prep.plan.kernel_count, case[0]
