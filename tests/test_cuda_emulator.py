"""Generated CUDA kernels executed on the CPU (tests/cuda_emulator.py) against NumPy written
apart from the code under test: the multi-block radix argsort (grid barriers, warp match, both
orders, a row that is no multiple of a tile), its fused MoE epilogue, the keys' histogram inside
it (Capability.fuse_sort_histograms: the whole MoE prologue in one kernel, ties, an id out of
range reported through the error word) and the single-block kernels whose first phase, a
histogram, the grid's blocks share (segmenter/spread.py). A deliberately wrong kernel must fail.
The GPU suite runs the same kernels on the H200 (tests/gpu/test_sort_histogram_gpu.py,
tests/gpu/test_fused_sort_gpu.py)."""

from __future__ import annotations

import copy
import dataclasses
import os

import cuda_emulator as emu
import numpy as np
import pytest
from corpus import all_cases, case_inputs, moe_graphs
from helpers import random_graphs as pg
from helpers.emulated import on_device
from helpers.plan_graphs import graphs, runnable, scan_chain, unspecified_write
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from segfuse.compiler import Engine, run_graph
from segfuse.compiler.codegen import radix_sort as rs
from segfuse.compiler.codegen import sort_epilogue as se
from segfuse.compiler.codegen.segment import generate
from segfuse.compiler.dtypes import DType, from_numpy
from segfuse.compiler.ir import Fusion
from segfuse.compiler.segmenter import segment
from segfuse.compiler.segmenter import sort_epilogue as sep
from segfuse.compiler.segmenter.capability import DEFAULT_CAPABILITY
from torch_graphs import prologue_graph

pytestmark = pytest.mark.skipif(not emu.available(), reason="needs a C++17 compiler (c++)")
HIST = dataclasses.replace(DEFAULT_CAPABILITY, fuse_sort_histograms=True)
K = 8
PLANS = Engine("numpy")


def _sort(src, name, keys: np.ndarray, desc: bool, params=(), outs=()):
    """Launch a radix-sort kernel as compiler/cuda/radix_sort.py does (grid: one block per tile
    here); returns (the plain kernel's index row, the error words, the counters after the run)."""
    n, kb = keys.size, rs.key_bytes(keys.dtype)
    grid = -(-n // rs.TILE)
    scratch = np.zeros(rs.scratch_bytes(n, kb, grid), np.uint8)
    ctr = np.zeros(rs.CTR_BYTES // 4 + 8, np.uint32)
    out = np.full(n, -1, np.int64)
    err = np.zeros(5, np.int64)
    args = [keys.reshape(-1), n, int(desc), out, scratch, ctr] + ([err, *outs] if params else [])
    emu.compile_source(src).launch(name, grid, rs.THREADS, rs.smem_bytes(kb), args)
    assert not ctr.any()  # the last block left the counters zero for the next launch
    return out, err


@pytest.mark.parametrize("dtype,desc", [("int64", False), ("int32", True), ("float32", False)])
def test_plain_radix_argsort(dtype, desc):
    rng = np.random.default_rng(1)
    keys = (rng.standard_normal(20000) * 50).astype(dtype) if dtype == "float32" else \
        rng.integers(-(2**30), 2**30, 20000).astype(dtype)  # several passes; 20000 = 4.9 tiles
    keys[::7] = keys[3]  # ties
    src, name = rs.source(np.dtype(dtype))
    out, _ = _sort(src, name, keys, desc)
    want = np.argsort(-keys if desc else keys, kind="stable")
    np.testing.assert_array_equal(out, want)


def _fused(f, T, cap=DEFAULT_CAPABILITY):
    b = f.bind({f.inputs[0][0]: (T, K)})
    (seg,) = [s for s in segment(f, b, cap).segments if s.fused_sort]
    m = sep.match(f, seg.nodes, seg.inputs, seg.outputs, b.types)
    epi, params = se.render(f, m, b.types)
    return m, epi, params, b.types


def _run_fused(f, ids, cap=DEFAULT_CAPABILITY, mutate=None):
    T = ids.shape[0]
    m, epi, params, types = _fused(f, T, cap)
    if mutate:
        epi = mutate(epi)
    src, name = rs.source(ids.dtype, epi)
    outs = [np.full(tuple(types[p].shape), -7, types[p].dtype.np) for p in params]
    _, err = _sort(src, name, ids, m.descending, params, outs)
    return dict(zip(params, (o.astype(np.int64) for o in outs))), err


def _prologue_oracle(ids, E=256):
    flat = ids.reshape(-1).astype(np.int64)
    counts = np.bincount(flat, minlength=E)
    order = np.argsort(flat, kind="stable")
    inv = np.empty_like(order)
    inv[order] = np.arange(order.size)
    return {"counts": counts, "offsets": np.concatenate([[0], np.cumsum(counts)]), "input_perm": order // K,
            "output_perm": inv}


@pytest.mark.parametrize("idt", ["int32", "int64"])
def test_fused_moe_argsort(idt):
    g, _ = moe_graphs(idt=idt)[-1]  # descending, stable
    f = Fusion.from_json(g)
    ids = np.random.default_rng(2).integers(0, 256, (2500, K)).astype(idt)
    got, err = _run_fused(f, ids)
    order = np.argsort(-ids.reshape(-1).astype(np.int64), kind="stable")
    inv = np.empty_like(order)
    inv[order] = np.arange(order.size)
    np.testing.assert_array_equal(got["input_permutation"], order // K)
    np.testing.assert_array_equal(got["output_permutation"], inv)
    assert not err.any()


@pytest.mark.parametrize("idt", ["int32", "int64"])
@pytest.mark.parametrize("case", ["random", "all equal", "two values", "few bins"])
def test_whole_prologue_in_one_kernel(idt, case):
    f = Fusion.from_json(prologue_graph(idt))
    rng = np.random.default_rng(3)
    T = 2500 if case == "random" else 4096
    ids = {"random": rng.integers(0, 256, (T, K)), "all equal": np.full((T, K), 9),
           "two values": rng.choice([3, 200], (T, K)), "few bins": rng.integers(0, 5, (T, K))}[case].astype(idt)
    got, err = _run_fused(f, ids, HIST)
    want = _prologue_oracle(ids)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    assert not err.any()


@pytest.mark.parametrize("bad", [256, -1])
def test_an_id_out_of_range_is_reported(bad):
    f = Fusion.from_json(prologue_graph("int64"))
    ids = np.random.default_rng(4).integers(0, 256, (2560, K))  # (-1: a full-width key range, 8 passes)
    ids[100, 3] = bad
    _, err = _run_fused(f, ids, HIST)
    scatter = next(nd.index for nd in f.nodes if nd.outputs[0] == "counts")
    assert err.tolist() == [1, scatter, bad, 0, 256]  # code, op, value, dim, size: the scatter's error


def test_a_wrong_kernel_fails():
    """The emulator sees a kernel's mistakes: offsets that drop each bin's own count."""
    f = Fusion.from_json(prologue_graph("int32"))
    ids = np.random.default_rng(5).integers(0, 256, (2500, K)).astype(np.int32)
    wrong = lambda epi: dataclasses.replace(epi, hist=epi.hist.replace("(sf_x + sf_c)", "(sf_x)"))  # noqa: E731
    got, _ = _run_fused(f, ids, HIST, mutate=wrong)
    assert not np.array_equal(got["offsets"], _prologue_oracle(ids)["offsets"])


def _run_segment(f, seg, types, inputs: dict) -> dict:
    """A generated module's launches as compiler/cuda/param_blocks.py fires them (scalar
    variants), on fresh output buffers; returns every parameter's array."""
    mod = generate(f, seg, types)
    arrays = {p: inputs[p] if p in inputs else np.full(tuple(types[p].shape), -7, types[p].dtype.np)
              for p in mod.params}
    scratch = np.zeros(max(mod.scratch_bytes, 1), np.uint8)
    err, ctr = np.zeros(5, np.int64), np.zeros(16, np.uint32)
    m = emu.compile_source(mod.source)
    for ln in mod.launches:
        if ln.vector_of is None:
            m.launch(ln.kernel, ln.grid, ln.block, ln.smem, [arrays[p] for p in mod.params] + [scratch, err, ctr])
    assert not err.any() and not ctr.any()
    return arrays


@pytest.mark.parametrize("T", [4096, 16384])
def test_histogram_spread_over_blocks(T):
    """moe_problem_sizes (counts) and the prologue's counts and offsets: one single-block kernel
    whose histogram phase runs on ceil(8T / 8192) blocks, the last one finishing the segment."""
    f = Fusion.from_json(moe_graphs(idt="int32")[0][0])
    b = f.bind({"topk_ids": (T, K)})
    (seg,) = segment(f, b).segments
    assert seg.kind.value == "single_block"
    ids = np.random.default_rng(T).integers(0, 256, (T, K)).astype(np.int32)
    got = _run_segment(f, seg, b.types, {"topk_ids": ids})
    np.testing.assert_array_equal(got["counts"], np.bincount(ids.reshape(-1), minlength=256))
    assert generate(f, seg, b.types).launches[0].grid == T * K // 8192


# ---- every corpus graph and random graphs: the CUDA runtime's real run paths, real kernels ----
def _close(got: np.ndarray, want: np.ndarray, what: str):
    """Integers exactly; floats within the GPU suite's tolerances (the host's libm is not CUDA's)."""
    if got.dtype != want.dtype and got.dtype.itemsize == want.dtype.itemsize:
        got = got.view(want.dtype)  # (bfloat16 travels as uint16 bits)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    dt = from_numpy(want.dtype)
    if dt.is_float:
        tol = {DType.float16: 2e-2, DType.bfloat16: 6e-2, DType.float32: 2e-5, DType.float64: 1e-10}[dt]
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol,
                                   equal_nan=True, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


@pytest.mark.parametrize("case", all_cases(), ids=[c[0] for c in all_cases()])
def test_corpus_kernels(case, emulated):
    rt, Array = emulated
    name, g, _ = case
    f = Fusion.from_json(g)
    ins = case_inputs(case)
    want = run_graph(f, copy.deepcopy(ins))
    got, _ = rt.run(f, on_device(ins, Array), PLANS.plan(f, {k: np.shape(v) for k, v in ins.items()}))
    for k in want:
        _close(np.array(got[k]), want[k], f"{name}: {k}")


@settings(max_examples=int(os.environ.get("SEGFUSE_EMU_GRAPHS", "12")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(graphs(), st.integers(0, 2**16))
def test_random_graphs(emulated, case, seed):
    """helpers/plan_graphs.py's random graphs (multi-block sizes included), planned and run
    through the CUDA runtime on emulated kernels, against the NumPy interpreter (not graphs with a
    write whose result with duplicate indices is unspecified: as in the GPU suite, either
    duplicate may win; the emulator's thread order differs from the interpreter's)."""
    found = None if any(unspecified_write(op) for op in case[0]["ops"]) else runnable(case, seed)
    if found is None:
        return
    f, ins, want = found
    rt, Array = emulated
    dev = on_device(ins, Array)
    got, _ = rt.run(f, dev, PLANS.plan(f, {k: np.shape(v) for k, v in ins.items()}))
    for k in want:
        _close(np.array(got[k]), want[k], f"output {k}")
    for o in f.outputs:
        if o.alias_of:
            _close(np.array(dev[o.alias_of]), want[o.name], f"in place {o.alias_of}")


# ---- row normalizations: the row-persistent kernels (a warp per row, a block per row with the
# row in registers -- rows of a multiple of 4, and not (the scalar variant only) --, in shared
# memory (bfloat16 rows of 40000: more than 32 elements a thread), and rows too long for it that
# re-read global memory (float32 rows of 40000); here without splitting rows over clusters
# (row_reduction.ROW_SPLIT_MAX = 1), which the next test runs ----------------------------------
@pytest.mark.parametrize("kind", ["softmax", "log_softmax", "rmsnorm", "layernorm"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("R,D", [(37, 300), (6, 4096), (5, 1001), (3, 30000), (2, 40000)])
def test_row_normalizations_against_torch(emulated, monkeypatch, kind, dtype, R, D):
    from segfuse.compiler.codegen import row_reduction

    monkeypatch.setattr(row_reduction, "ROW_SPLIT_MAX", 1)
    _check_norm(emulated, kind, dtype, R, D)


@pytest.mark.parametrize("kind", ["softmax", "log_softmax", "rmsnorm", "layernorm"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("R,D,split", [(1, 16400, 8), (3, 30000, 8), (2, 16387, 8), (2, 40000, 8)])
def test_split_rows_against_torch(emulated, kind, dtype, R, D, split):
    """Few rows split over a thread-block cluster (limits.row_split): each block holds its part of
    the row in registers (the last part shorter: rows of 30000 in parts of 3752, 16400 in parts of
    2052, 16387 -- no multiple of 4, the scalar kernel -- in parts of 2052, the last 2023), the partials meet through the cluster's
    shared memory (the emulator's clusters: consecutive blocks, one barrier, mapa to another
    block's shared variable), against PyTorch. A combine that skips a block's partial fails here."""
    from norm_graphs import norm_graph
    from segfuse.compiler.cuda.prepare import modules_without_device

    f = norm_graph(kind, dtype)
    shapes = {"x": (R, D), **({"w": (D,)} if kind in ("rmsnorm", "layernorm") else {}), **({"b": (D,)} if kind == "layernorm" else {})}
    (_, mod), = modules_without_device(f, PLANS.plan(f, shapes), f.bind(shapes))
    assert f"__cluster_dims__({split}, 1, 1)" in mod.source and all(ln.grid == R * split for ln in mod.launches)
    _check_norm(emulated, kind, dtype, R, D)


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("R,D", [(37, 300), (6, 4096), (5, 1001), (300, 2048)])
@pytest.mark.parametrize("limit", [None, 0])
def test_row_weights_in_registers(emulated, kind, dtype, R, D, limit):
    """The weights loaded once per thread before the row loop (CodegenOptions.row_register_weights;
    2-byte ones only while the rows do not fill the SMs): the kernel reads them from its registers,
    and agrees with PyTorch; with the limit at 0 it reads them per element, and agrees too."""
    from norm_graphs import norm_graph
    from segfuse.compiler.codegen.options import CodegenOptions
    from segfuse.compiler.cuda.prepare import modules_without_device
    from segfuse.compiler.limits import NOMINAL_SM_COUNT

    options = CodegenOptions() if limit is None else CodegenOptions(row_register_weights=limit)
    emulated[0].options = options
    f = norm_graph(kind, dtype)
    shapes = {"x": (R, D), "w": (D,), **({"b": (D,)} if kind == "layernorm" else {})}
    (_, mod), = modules_without_device(f, PLANS.plan(f, shapes), f.bind(shapes), options=options)
    weights = 0 if limit == 0 or (dtype == "bfloat16" and R > NOMINAL_SM_COUNT) else 2 if kind == "layernorm" else 1
    assert [f"wr{i}[sf_t]" in mod.source for i in range(3)] == [True] * weights + [False] * (3 - weights)
    _check_norm(emulated, kind, dtype, R, D)


@pytest.mark.parametrize("kind", ["softmax", "rmsnorm", "layernorm"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("R,D", [(7, 4096), (5, 1001)])
@pytest.mark.parametrize("reduce", ["three barriers", "one barrier", "butterfly"])
def test_row_loop(emulated, monkeypatch, kind, dtype, R, D, reduce):
    """A block looping over every row (a grid of one block: row_reduction.BLOCK_ROWS_PER_SM = 0),
    with CodegenOptions.row_one_barrier's reduction (sf_block_reduce1, two shared buffers alternating per
    row), its butterfly form (row_reduce_butterfly, sf_block_reduce1w) and neither, against PyTorch. (The emulator runs threads in rounds between switch
    points, so a buffer reused too early cannot show here; tests/gpu/test_row_reduction_gpu.py
    runs the same loop on the H200.)"""
    from norm_graphs import norm_graph
    from segfuse.compiler.codegen import row_reduction
    from segfuse.compiler.codegen.options import CodegenOptions
    from segfuse.compiler.cuda.prepare import modules_without_device

    monkeypatch.setattr(row_reduction, "BLOCK_ROWS_PER_SM", 0)
    options = CodegenOptions(row_one_barrier=reduce != "three barriers", row_reduce_butterfly=reduce == "butterfly")
    emulated[0].options = options
    f = norm_graph(kind, dtype)
    shapes = {"x": (R, D), **({"w": (D,)} if kind != "softmax" else {}), **({"b": (D,)} if kind == "layernorm" else {})}
    (_, mod), = modules_without_device(f, PLANS.plan(f, shapes), f.bind(shapes), options=options)
    assert ("sf_block_reduce1(acc" in mod.source) == (reduce == "one barrier")
    assert ("sf_block_reduce1w<" in mod.source) == (reduce == "butterfly")
    assert all(launch.grid == 1 for launch in mod.launches)
    _check_norm(emulated, kind, dtype, R, D)


@pytest.mark.parametrize("kind", ["rmsnorm", "layernorm"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("R,D", [(6, 4096), (5, 1001), (300, 2048), (37, 300), (1, 16400)])
def test_weights_loaded_after_the_row(emulated, kind, dtype, R, D):
    """CodegenOptions.row_weights_after_row: where each block (or cluster) has one row and the rows fit the
    SMs, the weights held in registers load inside the row loop after the row (a block a row, a row
    split over a cluster; vector and scalar variants), and agree with PyTorch. Without the knob, and
    for rows that fill the SMs (300 here, a warp a row at 300 x 300), they load before the loop.
    (Only the ordering changes, so `_check_norm` runs once, with the knob on.)"""
    import re

    from norm_graphs import norm_graph
    from segfuse.compiler.codegen.options import CodegenOptions
    from segfuse.compiler.cuda.prepare import modules_without_device
    from segfuse.compiler.limits import NOMINAL_SM_COUNT

    stores = re.compile(r"wr\d+\[sf_i[^\]]*\] = ")  # (a weight register written: its load)
    f = norm_graph(kind, dtype)
    shapes = {"x": (R, D), "w": (D,), **({"b": (D,)} if kind == "layernorm" else {})}

    def kernels(options):
        (_, mod), = modules_without_device(f, PLANS.plan(f, shapes), f.bind(shapes), options=options)
        return mod.source.split('extern "C"')[1:]

    for late in (False, True):
        ks = kernels(CodegenOptions(row_weights_after_row=late))
        held = [k for k in ks if stores.search(k)]
        # (bfloat16 rows that fill the SMs keep their weights out of registers: nothing to place)
        assert bool(held) == (dtype == "float32" or R <= NOMINAL_SM_COUNT), "weights in registers"
        for k in held:
            before = len(stores.findall(k.split(" row = ", 1)[0]))
            assert (before == 0) == (late and R <= NOMINAL_SM_COUNT), (late, before)
    _check_norm(emulated, kind, dtype, R, D)


@pytest.mark.parametrize("kind", ["softmax", "log_softmax"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("R,D", [(37, 300), (6, 4096), (5, 1001), (2, 40000)])
def test_composite_softmax_rows_in_registers(emulated, kind, dtype, R, D):
    """The `softmax` / `log_softmax` ops expand with a -inf pad before their amax (rows that may be
    empty); the pad is amax's identity, so the kernel reads the row in place from registers (a warp
    a row, a block, a cluster) and agrees with PyTorch, -inf and NaN rows included."""
    from norm_graphs import norm_graph
    from segfuse.compiler.cuda.prepare import modules_without_device

    f = norm_graph(kind, dtype, True)
    (_, mod), = modules_without_device(f, PLANS.plan(f, {"x": (R, D)}), f.bind({"x": (R, D)}))
    assert "xr0[sf_t]" in mod.source and "-sf_inf()" in mod.source
    _check_norm(emulated, kind, dtype, R, D, composite=True)


def _padded_reductions(fill: float, op: str):
    from segfuse.compiler.builder import FusionDefinition

    with FusionDefinition(f"pad_{op}") as fd:
        x = fd.define_tensor("x", shape=["R", "D"], dtype="float32")
        p = fd.ops.pad(x, [0, 2], fill)
        red = getattr(fd.ops, op)(p, [1], True)
        fd.add_output(fd.ops.exp(x - red), "y")
    return fd.fusion()


@pytest.mark.parametrize("fill,op,in_place", [(float("-inf"), "amax", True), (0.0, "amax", False), (0.0, "sum", True),
                                              (0.0, "mean", True), (1.0, "sum", False)])
@pytest.mark.parametrize("R,D", [(6, 4096), (2, 40000)])
def test_reductions_of_padded_rows(emulated, fill, op, in_place, R, D):
    """A reduction of a row padded at its end reads the row in place from registers only when the
    fill is the reduction's identity (-inf for amax, 0 for sum and mean, whose count still includes
    the pad); any other fill keeps the row in shared memory or global memory. Against the NumPy
    interpreter, either way."""
    from segfuse.compiler.cuda.prepare import modules_without_device

    f = _padded_reductions(fill, op)
    plan = PLANS.plan(f, {"x": (R, D)})
    assert [s.kind.value for s in plan.segments] == ["row_reduction"]
    (_, mod), = modules_without_device(f, plan, f.bind({"x": (R, D)}))
    assert ("xr0[sf_t]" in mod.source) == in_place
    rt, Array = emulated
    ins = {"x": (np.random.default_rng(R).standard_normal((R, D)) * 3).astype(np.float32)}
    got, _ = rt.run(f, on_device(ins, Array), plan)
    got, want = np.array(got["y"]), run_graph(f, copy.deepcopy(ins))["y"]
    if op == "sum":
        # exp(x - s) carries the float32 rounding of s (|s| up to ~600 here) as a relative error:
        # 2.3e-5 between two summation orders (a block of 512 threads against NumPy's pairwise sum,
        # CI 2026-12-02). A pad read wrongly moves s by a whole element (|x| ~ 3), far past 2e-4.
        np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=2e-4, atol=2e-5,
                                   err_msg=f"{op} of a pad of {fill}")
    else:
        _close(got, want, f"{op} of a pad of {fill}")


def _check_norm(emulated, kind, dtype, R, D, composite=False):
    import ml_dtypes
    import torch
    from norm_graphs import norm_graph, norm_inputs, torch_norm

    rt, Array = emulated
    f = norm_graph(kind, dtype, composite)
    ins = norm_inputs(kind, R, D, dtype, seed=R + D, special=True)
    plan = PLANS.plan(f, {k: np.shape(v) for k, v in ins.items()})
    assert [s.kind.value for s in plan.segments] == ["row_reduction"]
    got = np.array(rt.run(f, on_device(ins, Array), plan)[0]["y"])
    got = (got.view(ml_dtypes.bfloat16) if dtype == "bfloat16" else got).astype(np.float32)
    tdt = torch.float32 if dtype == "float32" else torch.bfloat16
    want = torch_norm(kind, {k: torch.from_numpy(np.asarray(v).astype(np.float32)).to(tdt) for k, v in ins.items()})
    tol = 2e-2 if dtype == "bfloat16" else 1e-4
    np.testing.assert_allclose(got, want.float().numpy(), rtol=tol, atol=tol, equal_nan=True)


def _row_graphs():
    """Row regions beyond the norms: a softmax over two dims with a per-row output (registers), and
    a region whose outputs pad the row (read along the row: shared memory)."""
    from segfuse.compiler.builder import FusionDefinition

    with FusionDefinition("two_dim_rows") as fd:
        x = fd.define_tensor("x", shape=["R", "A", "B"], dtype="float32")
        z = x - fd.ops.amax(x, [1, 2], True)
        fd.add_output(fd.ops.exp(z) / fd.ops.sum(fd.ops.exp(z), [1, 2], True), "y")
        fd.add_output(fd.ops.sum(x, [1, 2], False), "rs")
    two = fd.fusion()
    with FusionDefinition("padded_rows") as fd:
        x = fd.define_tensor("x", shape=["R", "D"], dtype="float32")
        fd.add_output(fd.ops.pad(x - fd.ops.mean(x, [1], True), [1, 1]), "y")
        fd.add_output(fd.ops.pad(x, [0, 2]) * 2.0, "y2")
    return {"two_dim_rows": (two, [(5, 12, 40), (3, 16, 100), (2, 8, 1001), (2, 8, 2100)], True),
            "padded_rows": (fd.fusion(), [(6, 700), (3, 4096)], False)}


@pytest.mark.parametrize("name", ["two_dim_rows", "padded_rows"])
def test_row_regions_in_registers_or_shared_memory(emulated, name):
    from segfuse.compiler.cuda.prepare import modules_without_device

    f, shapes, in_registers = _row_graphs()[name]
    rt, Array = emulated
    for shape in shapes:
        ins = {"x": (np.random.default_rng(len(shape)).standard_normal(shape) * 4).astype(np.float32)}
        plan = PLANS.plan(f, {"x": shape})
        assert [sg.kind.value for sg in plan.segments] == ["row_reduction"]
        (_, mod), = modules_without_device(f, plan, f.bind({"x": shape}))
        assert ("xr0[sf_t]" in mod.source) == in_registers, shape
        # (two rows of 8 x 2100: split over clusters of 8 blocks, the per-row sum stored by the first)
        assert ("__cluster_dims__(8, 1, 1)" in mod.source) == (shape == (2, 8, 2100)), shape
        got, _ = rt.run(f, on_device(ins, Array), plan)
        want = run_graph(f, copy.deepcopy(ins))
        for k in want:
            _close(np.array(got[k]), want[k], f"{name} {shape} output {k}")


@pytest.mark.parametrize("hist", [False, True], ids=["two launches", "histogram in the sort"])
@pytest.mark.parametrize("idt", ["int32", "int64"])
def test_whole_prologue_through_the_runtime(emulated, hist, idt):
    """The whole MoE prologue at T = 2500 (20000 keys: the library radix sort, 5 blocks) through
    CupyRuntime.run: the spread histogram kernel and the fused sort, or everything in the sort;
    then an id out of range raises the scatter's RunError and nothing is returned."""
    from segfuse.compiler.errors import RunError
    from segfuse.compiler.segmenter.cache import PlanCache

    rt, Array = emulated
    f = Fusion.from_json(prologue_graph(idt))
    ids = np.random.default_rng(9).integers(0, 256, (2500, K)).astype(idt)
    ids[:300] = 17  # a long run of ties
    plans = Engine("numpy", plan_cache=PlanCache(cap=dataclasses.replace(DEFAULT_CAPABILITY, fuse_sort_histograms=hist)))
    plan = plans.plan(f, {"topk_ids": ids.shape})
    assert plan.kernel_count == (1 if hist else 2)
    got, _ = rt.run(f, on_device({"topk_ids": ids}, Array), plan)
    want = _prologue_oracle(ids)
    for k in want:
        np.testing.assert_array_equal(np.array(got[k]).astype(np.int64), want[k], err_msg=k)
    prep = rt.prepared_for(f, on_device({"topk_ids": ids}, Array))
    assert prep.kernels == plan.kernel_count and not prep.fallbacks
    bad = ids.copy()
    bad[7, 2] = 999
    with pytest.raises(RunError, match="index 999 is out of bounds for dimension 0 with size 256"):
        rt.run(f, on_device({"topk_ids": bad}, Array), plan)


# ---- tests/test_property_graphs.py's random graphs, against PyTorch -------------------------


@pytest.mark.parametrize("name", sorted(pg.CONFIGS))
def test_property_graphs_against_torch(emulated, name):
    """The generator's graphs (PyTorch computes the expected values), every one planned and run on
    emulated kernels through the CUDA runtime; inputs updated in place (alias_of) checked too."""
    from hypothesis import given, settings
    from hypothesis import strategies as st
    from segfuse.compiler.errors import RunError

    rt, Array = emulated
    max_ops, kinds, big = pg.CONFIGS[name]
    ran = []

    @settings(max_examples=int(os.environ.get("SEGFUSE_EMU_GRAPHS", "12")), **pg.COMMON)
    @given(st.data())
    def run(data):
        g = pg.Gen(data, max_ops=max_ops, kinds=kinds, big=big)
        graph = g.build()
        f = Fusion.from_json(graph)
        dev = on_device(g.arrays, Array)
        plan = PLANS.plan(f, {k: np.shape(v) for k, v in g.arrays.items()})
        if g.expect_error:
            with pytest.raises(RunError):
                rt.run(f, dev, plan)
            return
        res, _ = rt.run(f, dev, plan)
        alias = {o["alias_of"]: o["name"] for o in graph["outputs"] if isinstance(o, dict)}
        for o in graph["outputs"]:
            k = o if isinstance(o, str) else o["name"]
            got = np.array(res[k])
            pg.assert_agrees(k, _as_ref(got, g.t[k]), g.t[k])
        for k, v in dev.items():
            if k in alias:
                pg.assert_agrees(f"{k} (in place)", _as_ref(np.array(v), g.t[alias[k]]), g.t[alias[k]])
        ran.append(1)

    run()
    assert ran


def _as_ref(got, ref):
    """bfloat16 results travel as uint16 bits: seen as bfloat16 when PyTorch's result is one."""
    import ml_dtypes
    import torch

    return got.view(ml_dtypes.bfloat16) if ref.value.dtype == torch.bfloat16 and got.dtype == np.uint16 else got


def test_every_sort_consumer_kind_and_a_zero_divisor(emulated):
    """The fused sort with every consumer kind (tests/corpus sort_consumers_graph: order itself, a
    narrowing cast, a pointwise scatter source, a literal scattered into a longer target that the
    phase-0 init fills) through CupyRuntime.run; then a division by a zero literal in the
    epilogue is reported through the error word."""
    from corpus import _graph, sort_consumers_graph
    from segfuse.compiler.errors import RunError

    rt, Array = emulated
    f = Fusion.from_json(sort_consumers_graph("int32", K))
    ids = np.random.default_rng(12).integers(0, 40, (2500, K)).astype(np.int32)
    plan = PLANS.plan(f, {"ids": ids.shape})
    assert plan.kernel_count == 1
    want = run_graph(f, {"ids": ids.copy()})
    got, _ = rt.run(f, on_device({"ids": ids}, Array), plan)
    for k in want:
        np.testing.assert_array_equal(np.array(got[k]), want[k], err_msg=k)
    ops = [{"op": "reshape", "out": "flat", "inputs": ["ids"], "shape": [-1]},
           {"op": "argsort", "out": "order", "inputs": ["flat"], "dim": 0, "descending": False, "stable": True},
           {"op": "floor_divide", "out": "q", "inputs": ["order", 0]}]
    g = Fusion.from_json(_graph("div0", [{"name": "ids", "dtype": "int64", "shape": ["T", K]}], ops, ["q"]))
    ids64 = ids.astype(np.int64)
    with pytest.raises(RunError, match="division by zero"):
        rt.run(g, on_device({"ids": ids64}, Array), PLANS.plan(g, {"ids": ids64.shape}))


STRIDED_CASES = [c for c in all_cases() if any(np.ndim(v) >= 2 for v in case_inputs(c).values())]


@pytest.mark.parametrize("case", STRIDED_CASES, ids=[c[0] for c in STRIDED_CASES])
def test_corpus_kernels_on_column_major_inputs(case, emulated):
    """The same graphs with every input of rank >= 2 in column-major order: the runtime generates
    kernels for those strides (codegen's strided index arithmetic), the values stay the same."""
    rt, Array = emulated
    name, g, _ = case
    f = Fusion.from_json(g)
    ins = case_inputs(case)
    want = run_graph(f, copy.deepcopy(ins))

    def column_major(v):
        if v.ndim < 2:
            return v.copy() if v.dtype.name == "bfloat16" else np.array(v).view(Array)
        t = np.asfortranarray(v)
        return t if v.dtype.name == "bfloat16" else t.view(Array)

    dev = {k: column_major(v) for k, v in ins.items()}
    got, _ = rt.run(f, dev, PLANS.plan(f, {k: np.shape(v) for k, v in ins.items()}))
    for k in want:
        _close(np.array(got[k]), want[k], f"{name}: {k}")


@pytest.mark.parametrize("deferred", [False, True])
def test_fast_path_and_graph_replays(emulated, deferred):
    """The per-signature fast path on emulated kernels: the first calls launch, later ones replay a
    captured "CUDA graph" of the same kernels on the same buffers while the input's data changes."""
    rt, Array = emulated
    f, ins = scan_chain(dtype="int64")
    n = ins["x"].shape[0]
    dev = {"x": np.array(ins["x"]).view(Array)}
    call = rt.prepared_call(f, dev, PLANS.plan(f, {"x": (n,)}), deferred=deferred)
    rng = np.random.default_rng(13)
    before = rt.graph_captures
    for k in range(5):
        dev["x"][...] = rng.integers(-3, 4, n)
        want = run_graph(f, {"x": np.array(dev["x"])})
        got = call(dev)
        for name in want:
            np.testing.assert_array_equal(np.array(got[name]), want[name], err_msg=f"call {k}: {name}")
        del got
    assert rt.graph_captures > before  # the later calls replayed a graph


def test_a_deferred_run_reports_its_bad_id_later(emulated):
    """errors="deferred" on emulated kernels: a run with an id out of range returns at once, its
    kernel writes its block of the error ring, and the next synchronize names the failure."""
    from segfuse.compiler.errors import DeferredRunError

    rt, Array = emulated
    f = Fusion.from_json(moe_graphs(idt="int64")[0][0])  # moe_problem_sizes: counts by scatter-add
    ids = np.random.default_rng(14).integers(0, 256, (4096, K))
    plan = PLANS.plan(f, {"topk_ids": ids.shape})
    good, _ = rt.run(f, on_device({"topk_ids": ids}, Array), plan, deferred=True)
    bad = ids.copy()
    bad[3, 3] = 300
    rt.run(f, on_device({"topk_ids": bad}, Array), plan, deferred=True)
    with pytest.raises(DeferredRunError, match="index 300 is out of bounds for dimension 0 with size 256"):
        rt.synchronize()
    np.testing.assert_array_equal(np.array(good["counts"]), np.bincount(ids.reshape(-1), minlength=256))
    rt.synchronize()  # reported once: the ring is clear again


def test_a_missing_barrier_shows():
    """Threads run one by one between switch points: a read of another thread's shared-memory
    write without a __syncthreads between them sees stale data here (as it may on the GPU)."""
    src = ('extern "C" __global__ void k(int* out, int sync) { __shared__ int s[64];\n'
           '  s[threadIdx.x] = threadIdx.x + 1; if (sync) __syncthreads();\n'
           '  out[threadIdx.x] = s[(threadIdx.x + 1) % 64]; }\n')
    mod = emu.compile_source(src)
    want = (np.arange(64) + 1) % 64 + 1
    for sync in (1, 0):
        out = np.zeros(64, np.int32)
        mod.launch("k", 1, 64, 0, [out, sync])
        assert np.array_equal(out, want) == bool(sync)
