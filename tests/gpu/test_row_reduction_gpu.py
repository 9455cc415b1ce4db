"""Row-persistent reductions on the GPU (compiler/codegen/row_reduction.py): softmax, log_softmax,
RMSNorm and LayerNorm graphs (and the composite softmax ops) through Engine("cupy") against the
NumPy backend executing the same plan and against PyTorch on the GPU, float32 and bfloat16, at
[8, 4096], [32768, 4096], [37, 1000], [3, 8192], [1, 5] and odd lengths; -inf rows, empty rows,
a non-contiguous (transposed) input, a misaligned input (the scalar twin of the vector kernel);
one launch each. Few rows split over thread-block clusters (limits.row_split): their parts, the
partials combined through distributed shared memory, the same results call after call."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

cp = pytest.importorskip("cupy")
torch = pytest.importorskip("torch")

from norm_graphs import NORMS, norm_graph, norm_inputs, torch_norm  # noqa: E402
from segfuse.compiler.cuda.runtime import get_runtime  # noqa: E402
from segfuse.compiler.engine import Engine  # noqa: E402

pytestmark = pytest.mark.gpu

VARIANTS = [(k, dt, c) for k in NORMS for dt in ("float32", "bfloat16") for c in ((False, True) if "soft" in k else (False,))]
SHAPES = [(8, 4096), (32768, 4096), (37, 1000), (3, 8192), (1, 5), (40, 1001), (200, 33), (5, 8193), (16, 16384)]


def _tol(dtype):
    return dict(rtol=2e-2, atol=2e-2) if dtype == "bfloat16" else dict(rtol=1e-5, atol=1e-5)


def _f32(a):
    return np.asarray(a).astype(np.float32)


def _gpu(a):
    """A host array on the GPU (CuPy has no bfloat16: segfuse takes its bits as uint16)."""
    return cp.asarray(a.view(np.uint16) if a.dtype == ml_dtypes.bfloat16 else a)


def _host(a, dtype):
    h = cp.asnumpy(a)
    return h.view(ml_dtypes.bfloat16) if dtype == "bfloat16" else h


def _check(kind, dtype, composite, R, D, special=True, to_gpu=_gpu, f=None):
    f = f or norm_graph(kind, dtype, composite)
    ins = norm_inputs(kind, R, D, dtype, seed=R * 7 + D, special=special)
    want_np = Engine("numpy").run(f, ins).outputs["y"]
    dev = {k: to_gpu(v) for k, v in ins.items()}
    eng = Engine("cupy")
    for _ in range(2):  # the second call takes the fast path
        got = _host(eng.run(f, dev).outputs["y"], dtype)
        np.testing.assert_allclose(_f32(got), _f32(want_np), equal_nan=True, **_tol(dtype))
    tdt = torch.float32 if dtype == "float32" else torch.bfloat16
    t = {k: torch.from_numpy(_f32(v)).to(tdt).cuda() for k, v in ins.items()}
    want_t = torch_norm(kind, t).float().cpu().numpy()
    np.testing.assert_allclose(_f32(got), want_t, equal_nan=True, **_tol(dtype))
    return f, dev


@pytest.mark.parametrize("kind,dtype,composite", VARIANTS)
@pytest.mark.parametrize("R,D", SHAPES)
def test_against_numpy_and_torch(kind, dtype, composite, R, D):
    f, dev = _check(kind, dtype, composite, R, D)
    prep = get_runtime().prepared_for(f, dev)
    assert prep.kernels == 1, prep.fallbacks
    assert not any("split" in x for x in prep.fallbacks), prep.fallbacks


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("R,D", [(8, 4096), (3, 8192), (32768, 4096), (37, 256), (5, 1000), (2, 40000)])
def test_weights_loaded_after_the_row(kind, dtype, R, D):
    """CodegenOptions.row_weights_after_row (on by default: the weights in registers load inside
    the row loop, after the row, where the rows fit the SMs): few rows, rows that fill the SMs (the
    old order), a warp a row, no multiple of 4, a row split over a cluster, against NumPy and
    PyTorch (a fusion of its own name)."""
    from segfuse.compiler.ir import Fusion

    base = norm_graph(kind, dtype)
    f = Fusion.from_json({**base.to_json(), "name": f"{base.name}_late_weights"})
    f, dev = _check(kind, dtype, False, R, D, f=f)
    assert get_runtime().prepared_for(f, dev).kernels == 1


@pytest.mark.parametrize("kind", NORMS)
def test_empty_rows_and_no_rows(kind):
    for R, D in ((6, 0), (0, 64)):
        f = norm_graph(kind, composite=kind in ("softmax", "log_softmax"))
        ins = norm_inputs(kind, R, D)
        want = Engine("numpy").run(f, ins).outputs["y"]
        got = cp.asnumpy(Engine("cupy").run(f, {k: cp.asarray(v) for k, v in ins.items()}).outputs["y"])
        assert got.shape == want.shape == (R, D)


@pytest.mark.parametrize("kind", ["softmax", "layernorm"])
def test_transposed_input_is_read_through_its_strides(kind):
    def transposed(a):
        a = cp.asarray(a)
        return cp.ascontiguousarray(a.T).T if a.ndim == 2 else a  # same values, column-major

    _check(kind, "float32", False, 37, 1000, to_gpu=transposed)


def test_misaligned_input_runs_the_scalar_kernel():
    f = norm_graph("rmsnorm")
    ins = norm_inputs("rmsnorm", 64, 4096)
    buf = cp.empty(ins["x"].size + 1, dtype=cp.float32)
    x = buf[1:].reshape(64, 4096)  # 4 bytes past a 16-byte boundary
    x[...] = cp.asarray(ins["x"])
    got = cp.asnumpy(Engine("cupy").run(f, {"x": x, "w": cp.asarray(ins["w"])}).outputs["y"])
    want = Engine("numpy").run(f, ins).outputs["y"]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("reduce", ["three barriers", "one barrier", "butterfly"])
@pytest.mark.parametrize("kind,dtype", [("softmax", "bfloat16"), ("rmsnorm", "float32"), ("layernorm", "float32")])
@pytest.mark.parametrize("R,D", [(3000, 4096), (1000, 1001)])
def test_row_loop(monkeypatch, reduce, kind, dtype, R, D):
    """Row kernels on a grid of one block an SM (row_reduction.BLOCK_ROWS_PER_SM = 1), so each
    block loops over many rows, with CodegenOptions.row_one_barrier's reduction, its butterfly form
    (row_reduce_butterfly) and neither (a shared buffer reused too early would show),
    against the NumPy backend, twice."""
    from segfuse.compiler.codegen import row_reduction
    from segfuse.compiler.codegen.options import CodegenOptions
    from segfuse.compiler.cuda.runtime import CupyRuntime

    from .planned_runtime import PlannedRuntime

    monkeypatch.setattr(row_reduction, "BLOCK_ROWS_PER_SM", 1)
    options = CodegenOptions(row_one_barrier=reduce != "three barriers", row_reduce_butterfly=reduce == "butterfly")
    f = norm_graph(kind, dtype)
    ins = norm_inputs(kind, R, D, dtype, seed=R + D, special=True)
    want = Engine("numpy").run(f, ins).outputs["y"]
    rt = PlannedRuntime(rt=CupyRuntime(options=options))  # its own prepared entries: the patched code generator runs
    dev = {k: _gpu(v) for k, v in ins.items()}
    for _ in range(2):
        got = _host(rt.run(f, dev)[0]["y"], dtype)
        np.testing.assert_allclose(_f32(got), _f32(want), equal_nan=True, **_tol(dtype))
    prep = rt.prepared_for(f, dev)
    src = "".join(m.source for _, m in prep.modules)
    assert prep.kernels == 1 and ("sf_block_reduce1(acc" in src) == (reduce == "one barrier")
    assert ("sf_block_reduce1w<" in src) == (reduce == "butterfly")


SPLIT_SHAPES = [(1, 65536), (2, 40000), (3, 30000), (8, 65536), (16, 32768), (33, 32768), (2, 16387), (1, 16400)]


@pytest.mark.parametrize("kind,dtype", [(k, dt) for k in NORMS for dt in ("float32", "bfloat16")])
@pytest.mark.parametrize("R,D", SPLIT_SHAPES)
def test_split_rows(kind, dtype, R, D):
    """Rows split over a cluster of 2-8 blocks (the last part shorter; 16387: the scalar kernel)
    against the NumPy backend and PyTorch: one kernel, with `__cluster_dims__`."""
    f, dev = _check(kind, dtype, False, R, D)
    prep = get_runtime().prepared_for(f, dev)
    assert prep.kernels == 1, prep.fallbacks
    assert "__cluster_dims__(" in "".join(m.source for _, m in prep.modules)


@pytest.mark.parametrize("kind,dtype,R,D", [("softmax", "bfloat16", 16, 32768), ("layernorm", "float32", 8, 65536)])
def test_split_rows_repeat_exactly(kind, dtype, R, D):
    """200 calls back to back, one synchronize: every call's output has the same bits (a block
    that left, or rewrote its partials, while another cluster block still read them would change
    some), and they match the NumPy backend."""
    f = norm_graph(kind, dtype)
    ins = norm_inputs(kind, R, D, dtype, seed=5, special=False)
    want = Engine("numpy").run(f, ins).outputs["y"]
    dev = {k: _gpu(v) for k, v in ins.items()}
    eng = Engine("cupy")
    outs = [eng.run(f, dev).outputs["y"] for _ in range(200)]
    cp.cuda.runtime.deviceSynchronize()
    first = cp.asnumpy(outs[0])
    assert all(bool((o == outs[0]).all()) for o in outs[1:])
    np.testing.assert_allclose(_f32(_host(outs[0], dtype)), _f32(want), **_tol(dtype))
    assert first.shape == (R, D)
