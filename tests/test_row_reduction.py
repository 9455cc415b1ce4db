"""Row-persistent reductions (issue 20): softmax, log_softmax, RMSNorm and LayerNorm written as
graphs plan as ONE row_reduction segment, chosen through the capability table with a reason, fall
back to one launch per reduction otherwise, render one kernel (plus its vector-load twin), and the
NumPy backend executing those plans agrees with PyTorch on CPU (the kernels compile for sm_90
through the compile-check plugin; the GPU runs them in tests/gpu/test_row_reduction_gpu.py)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
from norm_graphs import NORMS, norm_graph, norm_inputs, torch_norm
from segfuse.compiler.builder import FusionDefinition
from segfuse.compiler.codegen.options import DEFAULT_OPTIONS, CodegenOptions
from segfuse.compiler.cuda.prepare import modules_without_device
from segfuse.compiler.engine import Engine
from segfuse.compiler.segmenter import segment
from segfuse.compiler.segmenter.capability import Capability
from segfuse.compiler.segmenter.row_fusion import analyze

ENG = Engine("numpy")
SHAPES = [(32768, 4096), (32768, 8192), (8, 4096), (8, 8192)]
VARIANTS = [(k, dt, c) for k in NORMS for dt in ("float32", "bfloat16") for c in ((False, True) if "soft" in k else (False,))]


def _plan(f, R, D, cap=None):
    shapes = f.input_shapes({"R": R, "D": D})
    if cap is None:
        return ENG.plan(f, shapes)
    return segment(f, f.bind(shapes), cap)


@pytest.mark.parametrize("kind,dtype,composite", VARIANTS)
@pytest.mark.parametrize("R,D", SHAPES)
def test_one_row_kernel_per_normalization(kind, dtype, composite, R, D):
    f = norm_graph(kind, dtype, composite)
    plan = _plan(f, R, D)
    assert [s.kind.value for s in plan.segments] == ["row_reduction"]
    assert plan.kernel_count == 1
    seg = plan.segments[0]
    assert "row-persistent reduction:" in seg.reason and "over dim 1" in seg.reason
    assert seg.row.dims == (1,) and seg.row.cached_inputs[0] == "x" and seg.row.reductions[0] in seg.nodes
    shapes = f.input_shapes({"R": R, "D": D})
    mods = modules_without_device(f, plan, f.bind(shapes))
    assert len(mods) == 1
    launches = mods[0][1].launches
    assert [ln.vector_of is not None for ln in launches] == [True, False]  # D % 4 == 0: a vector twin
    # 16 elements a thread when the rows fill the SMs or are longer than 4096, else 8 (limits.row_threads)
    assert all(ln.block == (D // 16 if R > 132 or D > 4096 else D // 8) for ln in launches)
    # a block per row (no persistent grid: row_reduction.BLOCK_ROWS_PER_SM; rows of at most 16384
    # are not split over clusters: limits.ROW_SPLIT_MIN_LENGTH)
    assert all(ln.grid == R for ln in launches) and "__cluster_dims__" not in mods[0][1].source
    # the row in registers, the composite softmax ops too (their -inf pad for rows that may be
    # empty is an identity of amax: row_fusion.identity_pad_source)
    assert "xr0[sf_t]" in mods[0][1].source


def test_the_old_lowering_without_the_capability():
    f = norm_graph("softmax")
    off = _plan(f, 32768, 4096, Capability(row_reductions=False))
    assert [s.kind.value for s in off.segments] == ["reduction", "reduction", "pointwise"]
    assert off.kernel_count == 4
    rms = _plan(norm_graph("rmsnorm"), 32768, 4096, Capability(row_reductions=False))
    assert rms.kernel_count == 2


def test_rows_too_long_keep_the_grid_lowering():
    f = norm_graph("rmsnorm")
    plan = _plan(f, 4, 1 << 17)
    assert "row_reduction" not in [s.kind.value for s in plan.segments]
    assert any("fits one block's row-persistent kernel" in c["what"] for c in plan.heuristics["checks"])


def test_reductions_over_other_dims_or_reads_across_rows_are_not_row_fused():
    with FusionDefinition("cols") as fd:  # a reduction over dim 0, then one over dim 1
        x = fd.define_tensor("x", ["R", "D"])
        y = x - fd.ops.amax(x, [0], True)
        fd.add_output(y / fd.ops.sum(y, [1], True), "y")
    f = fd.fusion()
    plan = _plan(f, 4096, 1024)  # the dim-0 reduction keeps its own kernel; the rest is one row kernel
    assert [(s.kind.value, s.nodes) for s in plan.segments] == [("reduction", [0]), ("row_reduction", [1, 2, 3])]
    with FusionDefinition("rotate_rows") as fd:  # the row results read at other rows (rotated along dim 0)
        x = fd.define_tensor("x", ["R", "D"])
        m = fd.ops.amax(x, [1], True)
        rot = fd.ops.cat([fd.ops.slice(m, 0, 1, None), fd.ops.slice(m, 0, 0, 1)], 0)
        fd.add_output(x - rot, "y")
    f = fd.fusion()
    nodes = list(range(len(f.nodes)))
    types = f.bind({"x": (4096, 1024)}).types
    region, why = analyze(f, nodes, ["x"], ["y"], types)
    assert region is None and "row value" in why


def _run(f, inputs):
    shapes = {k: v.shape for k, v in inputs.items()}
    plan = ENG.plan(f, shapes)
    return plan, ENG.run(f, inputs).outputs["y"]


def _close(got, want, dtype):
    want = want.float().numpy()
    got = np.asarray(got).astype(np.float32)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == "bfloat16" else dict(rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(got, want, equal_nan=True, **tol)


@pytest.mark.parametrize("kind,dtype,composite", VARIANTS)
@pytest.mark.parametrize("R,D", [(37, 1000), (40, 1001), (3, 8192), (1, 5), (65, 33)])
def test_numpy_backend_matches_torch(kind, dtype, composite, R, D):
    f = norm_graph(kind, dtype, composite)
    ins = norm_inputs(kind, R, D, dtype, seed=R + D, special=True)
    plan, got = _run(f, ins)
    if R * D > 32768:
        assert [s.kind.value for s in plan.segments] == ["row_reduction"]
    t = {k: torch.from_numpy(v.astype(np.float32)).to(torch.float32 if dtype == "float32" else torch.bfloat16)
         for k, v in ins.items()}
    _close(got, torch_norm(kind, t), dtype)


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm", "softmax"])
def test_empty_rows(kind):
    f = norm_graph(kind, composite=kind == "softmax")  # (softmax: the composite pads an empty row)
    ins = norm_inputs(kind, 6, 0)
    _, got = _run(f, ins)
    assert got.shape == (6, 0)
    ins = norm_inputs(kind, 0, 64)
    _, got = _run(f, ins)
    assert got.shape == (0, 64)


def test_bfloat16_rounds_once_at_the_output():
    f = norm_graph("rmsnorm", "bfloat16")
    ins = norm_inputs("rmsnorm", 40, 1001, "bfloat16", seed=3)
    _, got = _run(f, ins)
    assert got.dtype == ml_dtypes.bfloat16
    x, w = (torch.from_numpy(ins[k].astype(np.float32)) for k in ("x", "w"))
    want = (x * torch.rsqrt((x * x).mean(1, keepdim=True) + 1e-6) * w).to(torch.bfloat16)
    got, want = np.asarray(got).astype(np.float32), want.float().numpy()
    # one rounding at the end: at most one bf16 step apart where float32 sums differ in order
    np.testing.assert_allclose(got, want, rtol=2.0 ** -7, atol=0)
    assert np.mean(got == want) > 0.99


def test_explain_prints_the_reason():
    from cli.explain_text import plan_lines

    f = norm_graph("layernorm")
    plan = _plan(f, 32768, 4096)
    text = "\n".join(plan_lines(plan, f, {"R": 32768, "D": 4096}, {"optin": 1, "default": 1, "name": "x"}, 1, 200))
    assert "row_reduction" in text and "row-persistent reduction: mean" in text


def test_a_register_cap_asks_for_resident_threads():
    """CodegenOptions.row_min_resident_threads_2byte (2048, for rows of 2-byte elements in
    registers that fill the SMs): the row kernels then carry `__launch_bounds__(block, threads //
    block)`, ptxas's register cap (the compile-check plugin compiles the sources for sm_90). Not for
    4-byte rows, warp-per-row kernels nor rows in shared memory; 0: no cap."""
    def sources(kind, dtype, R, D, options=DEFAULT_OPTIONS):
        f = norm_graph(kind, dtype)
        shapes = f.input_shapes({"R": R, "D": D})
        (_, mod), = modules_without_device(f, ENG.plan(f, shapes), f.bind(shapes), options=options)
        return mod.source

    assert sources("layernorm", "float32", 32768, 4096).count("__launch_bounds__(256)") == 2  # vector and scalar
    assert sources("layernorm", "bfloat16", 32768, 4096).count("__launch_bounds__(256, 8)") == 2
    assert sources("softmax", "bfloat16", 8, 4096).count("__launch_bounds__(512)") == 2  # rows do not fill the SMs: no cap
    assert sources("softmax", "bfloat16", 32768, 512).count("__launch_bounds__(256)") == 2  # a warp a row
    assert sources("softmax", "bfloat16", 100, 40000).count("__launch_bounds__(1024)") == 2  # shared memory
    uncapped = CodegenOptions(row_min_resident_threads_2byte=0)
    assert sources("layernorm", "bfloat16", 32768, 4096, uncapped).count("__launch_bounds__(256)") == 2
    assert sources("layernorm", "bfloat16", 32768, 4096, CodegenOptions(row_min_resident_threads_2byte=1024)).count(
        "__launch_bounds__(256, 4)") == 2


@pytest.mark.parametrize("R,D,split,block", [
    (1, 32768, 8, 1024), (8, 65536, 8, 1024), (33, 32768, 4, 1024), (64, 32768, 2, 1024), (66, 32768, 2, 1024),
    (67, 32768, 1, 1024), (8, 16384, 1, 1024), (1, 16400, 8, 1024), (2, 16387, 8, 1024), (3, 30000, 8, 1024)])
def test_few_rows_split_over_a_cluster(R, D, split, block):
    """Rows longer than 16384 too few to fill the GPU's 132 SMs are split over a thread-block cluster
    (limits.row_split): the blocks a row double while rows x blocks stay within the SMs, up to 8,
    each block keeping more than 512 elements; grid = rows x blocks, `__cluster_dims__` on the kernel, the threads
    sized for the block's part (4 elements a thread; 16 past the SMs), and the partials combined
    through the cluster (sf_cluster_reduce). The emulator and the GPU suite check the results."""
    f = norm_graph("layernorm")
    shapes = f.input_shapes({"R": R, "D": D})
    (_, mod), = modules_without_device(f, ENG.plan(f, shapes), f.bind(shapes))
    assert all(ln.grid == R * split and ln.block == block for ln in mod.launches)
    assert mod.source.count(f"__cluster_dims__({split}, 1, 1)") == (len(mod.launches) if split > 1 else 0)
    assert (mod.source.count("sf_cluster_reduce(sf_block_reduce(acc") == 2 * len(mod.launches)) == (split > 1)


def test_no_split_for_rows_outside_registers(monkeypatch):
    """A split needs the row in registers: rows read along them (a pad of the row) stay a block per
    row; so does every row with row_reduction.ROW_SPLIT_MAX = 1."""
    from segfuse.compiler.codegen import row_reduction

    with FusionDefinition("padded_rows") as fd:
        x = fd.define_tensor("x", shape=["R", "D"], dtype="float32")
        fd.add_output(fd.ops.pad(x - fd.ops.mean(x, [1], True), [1, 1]), "y")
    f = fd.fusion()
    (_, mod), = modules_without_device(f, ENG.plan(f, {"x": (4, 32768)}), f.bind({"x": (4, 32768)}))
    assert "__cluster_dims__" not in mod.source and "xr0[sf_t]" not in mod.source
    assert all(ln.grid == 4 and ln.block == 1024 for ln in mod.launches)
    monkeypatch.setattr(row_reduction, "ROW_SPLIT_MAX", 1)
    f = norm_graph("softmax")
    shapes = f.input_shapes({"R": 8, "D": 32768})
    (_, mod), = modules_without_device(f, ENG.plan(f, shapes), f.bind(shapes))
    assert "__cluster_dims__" not in mod.source and all(ln.grid == 8 and ln.block == 1024 for ln in mod.launches)


def test_rows_in_registers_load_with_evict_last_hints():
    """CodegenOptions.row_load_hints: the vector kernel of rows held in registers loads them (and the
    weights held with them) through prelude VLOAD_LAST's `sf_vload_last`, the scalar kernel and rows
    in shared memory plainly; a module that does not use it leaves it out (other kernels keep their
    sources and digests). Off, no module has it. The emulator and the GPU suite check the results."""
    from segfuse.compiler.codegen.prelude import VLOAD_LAST

    def kernels(kind, dtype, R, D, options=DEFAULT_OPTIONS):
        f = norm_graph(kind, dtype)
        shapes = f.input_shapes({"R": R, "D": D})
        (_, mod), = modules_without_device(f, ENG.plan(f, shapes), f.bind(shapes), options=options)
        bodies = mod.source.split('extern "C" __global__')[1:]
        return mod.source, [b.count("sf_vload_last(") for b in bodies]

    src, counts = kernels("rmsnorm", "float32", 32768, 4096)
    assert VLOAD_LAST in src and counts == [2, 0]  # the weights' load and the row's; none in the scalar kernel
    src, counts = kernels("softmax", "bfloat16", 8, 65536)  # split over a cluster: a part of a row
    assert VLOAD_LAST in src and counts[0] == 1 and counts[1:] == [0]
    src, counts = kernels("softmax", "float32", 100, 40000)  # rows re-read from global memory
    assert VLOAD_LAST not in src and counts == [0]
    src, counts = kernels("softmax", "bfloat16", 200, 40000)  # rows in shared memory
    assert VLOAD_LAST not in src and counts == [0, 0]
    src, counts = kernels("rmsnorm", "float32", 32768, 4096, CodegenOptions(row_load_hints=False))
    assert VLOAD_LAST not in src and counts == [0, 0]


def test_modules_with_optional_parts_compile_as_one_program():
    """prelude.one_program, the tests' batched compiles: the prelude and each optional part
    (VLOAD_LAST, CLUSTER_REDUCE, BLOCK_REDUCE1, BLOCK_REDUCE1_BUTTERFLY) once, however many modules carry it; NVRTC
    compiles the batch for sm_90 (joined naively, the parts are defined twice)."""
    pytest.importorskip("cuda.bindings.nvrtc")
    from segfuse.compiler.codegen.prelude import OPTIONAL_PARTS, PRELUDE, one_program
    from segfuse.compiler.cuda.nvrtc import compile_cubin

    def source(kind, dtype, R, D, options):
        f = norm_graph(kind, dtype)
        shapes = f.input_shapes({"R": R, "D": D})
        (_, mod), = modules_without_device(f, ENG.plan(f, shapes), f.bind(shapes), options=options)
        return mod.source

    plain = CodegenOptions(row_reduce_butterfly=False)  # (BLOCK_REDUCE1, not its butterfly form)
    srcs = [source("rmsnorm", "float32", 32768, 4096, plain), source("softmax", "bfloat16", 8, 65536, plain),
            source("softmax", "float32", 100, 40000, plain)]  # hints; a split row and hints; neither
    one = CodegenOptions(row_reduce_butterfly=False, row_one_barrier=True)  # (+ BLOCK_REDUCE1)
    srcs += [source("layernorm", "float32", 32768, 8192, one), source("softmax", "float32", 8, 65536, one)]
    srcs += [source("layernorm", "float32", 8, 4096, DEFAULT_OPTIONS),  # (+ BLOCK_REDUCE1_BUTTERFLY)
             source("softmax", "bfloat16", 8, 8192, DEFAULT_OPTIONS)]
    parts = [p for _, p in OPTIONAL_PARTS]
    assert all(sum(p in s for s in srcs) >= 2 for p in parts)  # each part in several modules
    program = one_program(srcs)
    assert program.startswith(PRELUDE) and all(program.count(p) == 1 for p in parts)
    assert program.count('extern "C" __global__') == sum(s.count('extern "C" __global__') for s in srcs)
    cubin, _ = compile_cubin(program)
    assert cubin[:4] == b"\x7fELF"
