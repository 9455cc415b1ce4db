"""Grid scatter kernels on the GPU against PyTorch on the CPU: the vectorized privatized histogram
(few bins), the L2-windowed global-atomic passes (many bins; window sizes forced small so small
inputs make several windows), duplicates under every reduce, 32- and 64-bit indices, misaligned and
strided views (the scalar fallback), include_self=False, and out-of-range indices (error reported,
in-place target untouched); two finds of the random graphs (tests/scatter_cases.py): a scatter into
a private copy read in the same block, 16-bit sums and products rounded once."""

from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
torch = pytest.importorskip("torch")

import scatter_cases as cases  # noqa: E402
from corpus import scatter_graph  # noqa: E402
from segfuse.compiler.codegen import scatter as sc  # noqa: E402
from segfuse.compiler.engine import Engine  # noqa: E402
from segfuse.compiler.errors import RunError  # noqa: E402
from segfuse.compiler.ir import Fusion  # noqa: E402
from segfuse.compiler.segmenter.reference import simple_plan  # noqa: E402

from .planned_runtime import PlannedRuntime  # noqa: E402

pytestmark = pytest.mark.gpu

TORCH_REDUCE = {"add": "sum", "mul": "prod", "amax": "amax", "amin": "amin"}


def graph(dt="float32", idt="int64", reduce="add", include_self=True, alias=False, rank=1):
    return Fusion.from_json(scatter_graph(dt, idt, reduce, include_self, alias, rank))


def data(bins, n, dt="float32", idt="int64", reduce="add", seed=0, lead=()):
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, bins, lead + (n,)).astype(idt)
    idx.reshape(-1)[: min(n, 64)] = 3  # a hot bin: many duplicates in one warp
    if reduce == "mul":  # products of +-1 and a few 2s stay exact in every dtype
        v = rng.choice(np.array([1, -1, 1, 1, 2] + [1] * 200), lead + (n,))
        d = rng.choice(np.array([1, -1, 3]), lead + (bins,))
    elif np.dtype(dt).kind == "f":
        v = rng.standard_normal(lead + (n,))
        d = rng.standard_normal(lead + (bins,))
    else:
        v = rng.integers(-50, 50, lead + (n,))
        d = rng.integers(-50, 50, lead + (bins,))
    return d.astype(dt), idx, v.astype(dt)


def want(d, idx, v, reduce, include_self=True):
    if d.dtype == np.float16:  # the exact result (the kernels accumulate wider than float16)
        d, v = d.astype(np.float64), v.astype(np.float64)
    t = torch.from_numpy(d.copy())
    r = t.scatter_reduce_(-1, torch.from_numpy(idx.astype(np.int64)), torch.from_numpy(v), TORCH_REDUCE[reduce],
                          include_self=include_self)
    return r.numpy()


def check(got, w, dt, n_per_bin=1):
    got = cp.asnumpy(got)
    assert got.shape == w.shape and got.dtype == np.dtype(dt)
    if np.dtype(dt).kind == "f":
        tol = 1e-5 * max(1.0, n_per_bin ** 0.5) * (100 if dt == "float16" else 1)
        np.testing.assert_allclose(got.astype(np.float64), w.astype(np.float64), rtol=tol, atol=tol * 10)
    else:
        np.testing.assert_array_equal(got, w)


def fresh_runtime(grid=False):
    """A runtime with its own prepared cache (the scatter tunables are read at codegen time)."""
    return PlannedRuntime((lambda f, types: simple_plan(f, types, small=-1)) if grid else None)


# ---- privatized histogram (vector variant and scalar fallback) -------------------------------

@pytest.mark.parametrize("dt,reduce,idt", [
    ("float32", "add", "int64"), ("float32", "amax", "int64"), ("float32", "amin", "int64"), ("float32", "mul", "int64"),
    ("int32", "add", "int64"), ("int64", "add", "int64"), ("float64", "add", "int64"), ("float16", "amax", "int64"),
    ("int32", "mul", "int64"), ("float32", "add", "int32"), ("int32", "amin", "int32"), ("float16", "add", "int32")])
def test_histogram_matches_torch(dt, reduce, idt):
    bins, n = 256, (1 << 18) + 3  # n % 4 != 0: the scalar tail after the vector groups
    d, idx, v = data(bins, n, dt, idt, reduce)
    f = graph(dt, idt, reduce)
    got = Engine("cupy").run(f, {"dst": cp.asarray(d), "i": cp.asarray(idx), "v": cp.asarray(v)}).outputs["o"]
    check(got, want(d, idx, v, reduce), dt, n // bins)


@pytest.mark.parametrize("reduce", ["add", "amax"])
def test_histogram_without_self(reduce):
    bins, n = 300, 1 << 16
    d, idx, v = data(bins, n, "float32", "int64", reduce, seed=1)
    idx[idx == 7] = 8  # bin 7 gets no source and keeps its value
    got = Engine("cupy").run(graph(reduce=reduce, include_self=False),
                             {"dst": cp.asarray(d), "i": cp.asarray(idx), "v": cp.asarray(v)}).outputs["o"]
    check(got, want(d, idx, v, reduce, include_self=False), "float32", n // bins)


@pytest.mark.parametrize("offset", [1, 2, 8])
def test_histogram_misaligned_and_offset_views(offset):
    """Views whose pointers are not 32-byte aligned (the scalar kernel) and are (the vector one)."""
    bins, n = 256, (1 << 18) + 1
    d, idx, v = data(bins, n + offset, "float32", "int64", "add", seed=2)
    gi, gv = cp.asarray(idx)[offset:], cp.asarray(v)[offset:]
    got = Engine("cupy").run(graph(), {"dst": cp.asarray(d), "i": gi, "v": gv}).outputs["o"]
    check(got, want(d, idx[offset:], v[offset:], "add"), "float32", n // bins)


def test_histogram_strided_and_2d():
    d, idx, v = data(256, 1 << 18, "float32", "int64", "add", seed=3)
    gi = cp.asarray(idx)[::2]
    gv = cp.asarray(v)[::2]
    got = Engine("cupy").run(graph(), {"dst": cp.asarray(d), "i": gi, "v": gv}).outputs["o"]
    check(got, want(d, idx[::2], v[::2], "add"), "float32", 512)
    d, idx, v = data(64, 1 << 14, "float32", "int64", "add", seed=4, lead=(3,))
    got = Engine("cupy").run(graph(rank=2), {"dst": cp.asarray(d), "i": cp.asarray(idx), "v": cp.asarray(v)}).outputs["o"]
    check(got, want(d, idx, v, "add"), "float32", 256)


# ---- L2-windowed global atomics ----------------------------------------------------------------

# grid=True: the grid-mode plan, where each window is initialized in-kernel right before its pass
@pytest.mark.parametrize("nw,grid,dt,idt,reduce", [
    (1, False, "float32", "int64", "add"), (3, False, "float32", "int64", "add"), (8, False, "float32", "int64", "add"),
    (1, True, "float32", "int64", "add"), (3, True, "float32", "int64", "add"), (8, True, "float32", "int32", "amax"),
    (3, False, "int32", "int64", "add"), (3, True, "int64", "int32", "amin"), (3, False, "float64", "int64", "mul")])
def test_windowed_matches_torch(monkeypatch, nw, grid, dt, idt, reduce):
    bins, n = 50_001, (1 << 17) + 3
    itemsize = np.dtype(dt).itemsize
    monkeypatch.setattr(sc, "WINDOW_BYTES", -(-bins * itemsize // nw))
    monkeypatch.setattr(sc, "WINDOW_MIN_SOURCES", 1)
    d, idx, v = data(bins, n, dt, idt, reduce, seed=nw)
    idx[-7:] = [0, bins - 1, 0, bins - 1, 12_345, 12_345, 40_000]  # both ends, duplicates in the tail
    rt = fresh_runtime(grid)
    res, _ = rt.run(graph(dt, idt, reduce), {"dst": cp.asarray(d), "i": cp.asarray(idx), "v": cp.asarray(v)})
    check(res["o"], want(d, idx, v, reduce), dt, 4)


@pytest.mark.parametrize("grid", [False, True], ids=["plan", "grid"])
def test_windowed_without_self_and_misaligned(monkeypatch, grid):
    bins, n = 40_000, 1 << 17
    monkeypatch.setattr(sc, "WINDOW_BYTES", bins * 4 // 4)
    monkeypatch.setattr(sc, "WINDOW_MIN_SOURCES", 1)
    rt = fresh_runtime(grid)
    d, idx, v = data(bins, n + 1, "float32", "int64", "amax", seed=5)
    res, _ = rt.run(graph(reduce="amax", include_self=False),
                    {"dst": cp.asarray(d), "i": cp.asarray(idx), "v": cp.asarray(v)})
    check(res["o"], want(d, idx, v, "amax", include_self=False), "float32")
    res, _ = rt.run(graph(), {"dst": cp.asarray(d), "i": cp.asarray(idx)[1:], "v": cp.asarray(v)[1:]})
    check(res["o"], want(d, idx[1:], v[1:], "add"), "float32", 4)


def test_default_windows_at_full_size():
    """The shipped tunables on a target larger than L2 (64 MiB, several windows)."""
    bins, n = 1 << 24, (1 << 22) + 2
    d, idx, v = data(bins, n, "float32", "int64", "add", seed=6)
    got = Engine("cupy").run(graph(), {"dst": cp.asarray(d), "i": cp.asarray(idx), "v": cp.asarray(v)}).outputs["o"]
    check(got, want(d, idx, v, "add"), "float32", 4)


# ---- out-of-range indices -------------------------------------------------------------------------

@pytest.mark.parametrize("bins,n", [(256, 1 << 16), (1 << 24, 1 << 21)], ids=["histogram", "windowed"])
@pytest.mark.parametrize("bad", [-1, "bins"])
def test_out_of_range_reports_and_leaves_target_untouched(bins, n, bad):
    bad = bins + 5 if bad == "bins" else bad
    d, idx, v = data(bins, n, "float32", "int64", "add", seed=7)
    idx[n // 2 + 1] = bad
    eng = Engine("cupy")
    dst = cp.asarray(d)
    with pytest.raises(RunError) as ei:
        eng.run(graph(alias=True), {"dst": dst, "i": cp.asarray(idx), "v": cp.asarray(v)})
    assert str(bad) in str(ei.value)
    np.testing.assert_array_equal(cp.asnumpy(dst), d)  # the in-place target is untouched
    with pytest.raises(RunError):
        eng.run(graph(), {"dst": dst, "i": cp.asarray(idx), "v": cp.asarray(v)})
    idx[n // 2 + 1] = 0  # the next run is fine
    got = eng.run(graph(), {"dst": dst, "i": cp.asarray(idx), "v": cp.asarray(v)}).outputs["o"]
    check(got, want(d, idx, v, "add"), "float32", max(1, n // bins))


# ---- finds of the random graphs on the H200, 2026-12-06 (tests/scatter_cases.py; the emulator runs
# the same cases in tests/test_scatter_kernels_emulated.py) --------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 2])
def test_scatter_into_a_private_copy_read_in_the_same_block(seed):
    ins = cases.private_copy_inputs(seed)
    res = Engine("cupy").run(Fusion.from_json(cases.private_copy_graph()), ins).outputs
    for name, w in cases.private_copy_want(ins).items():
        np.testing.assert_array_equal(cp.asnumpy(res[name]), w, err_msg=name)


@pytest.mark.parametrize("dt,size,reduce,include_self,then", cases.WIDE_CASES)
def test_16bit_scatter_sums_round_once(dt, size, reduce, include_self, then):
    n_out, n_dom = cases.SIZES[size]
    ins = cases.wide_inputs(dt, n_out, n_dom, reduce, seed=n_out + n_dom)
    f = Fusion.from_json(cases.wide_graph(dt, n_out, n_dom, reduce, include_self, then))
    out = cp.asnumpy(Engine("cupy").run(f, ins).outputs["z" if then else "y"])
    cases.check_wide(out, ins, dt, reduce, include_self, then)
