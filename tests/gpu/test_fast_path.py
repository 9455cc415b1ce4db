"""Engine.run's per-signature fast path (the second and later calls with CuPy inputs of one
shape/stride/dtype signature): the same results, errors and commit rules as the first call,
fresh output buffers per call, other signatures and threads kept apart."""

from __future__ import annotations

import threading

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from corpus import moe_graphs  # noqa: E402
from segfuse.compiler.engine import Engine  # noqa: E402
from segfuse.compiler.errors import RunError  # noqa: E402
from segfuse.compiler.ir import Fusion  # noqa: E402
from segfuse.compiler.numpy_backend import run_graph  # noqa: E402

pytestmark = pytest.mark.gpu

SCATTER = {"format": "segfuse.fusion/1", "name": "scatter_add_inplace",
           "inputs": [{"name": "dst", "dtype": "float32", "shape": ["M"]},
                      {"name": "index", "dtype": "int64", "shape": ["N"]},
                      {"name": "src", "dtype": "float32", "shape": ["N"]}],
           "ops": [{"op": "scatter", "out": "upd", "inputs": ["dst", "index", "src"], "dim": 0, "reduce": "add"},
                   {"op": "mul", "out": "twice", "inputs": ["upd", 2.0]}],
           "outputs": [{"name": "upd", "alias_of": "dst"}, "twice", "src"]}


def _check(got: dict, want: dict):
    for k, w in want.items():
        np.testing.assert_allclose(cp.asnumpy(got[k]), w, rtol=1e-5, atol=1e-5, err_msg=k)


@pytest.mark.parametrize("T", [1, 128, 4096])
@pytest.mark.parametrize("idt", ["int64", "int32"])
def test_moe_graphs_on_the_fast_path_match_numpy(T, idt):
    eng = Engine("cupy")
    for g, mk in moe_graphs(idt=idt):
        f = Fusion.from_json(g)
        results = []
        for seed in range(3):  # call 1 prepares, calls 2 and 3 take the fast path
            host = mk(T)(np.random.default_rng(seed))
            ins = {k: cp.asarray(v) for k, v in host.items()}
            res = eng.run(f, ins)
            want = run_graph(f, host)
            for k in want:
                np.testing.assert_array_equal(cp.asnumpy(res.outputs[k]), want[k], err_msg=f"{g['name']} {k}")
            results.append(res)
        assert results[1].cache_hits == 1 and results[1].timings_us["plan"] == 0.0  # the fast path ran
        # each call returns its own buffers: an earlier result is not overwritten by a later run
        for k in results[0].outputs:
            ptrs = {r.outputs[k].data.ptr for r in results}
            assert len(ptrs) == 3, k


def test_fast_path_keeps_alias_of_and_error_rules():
    f = Fusion.from_json(SCATTER)
    eng = Engine("cupy")
    rng = np.random.default_rng(0)
    M, N = 300, 5000
    for call in range(3):
        dst_h = rng.standard_normal(M).astype(np.float32)
        idx_h = rng.integers(0, M, N)
        src_h = rng.standard_normal(N).astype(np.float32)
        dst, idx, src = cp.asarray(dst_h), cp.asarray(idx_h), cp.asarray(src_h)
        want = run_graph(f, {"dst": dst_h.copy(), "index": idx_h, "src": src_h})
        res = eng.run(f, {"dst": dst, "index": idx, "src": src})
        _check(res.outputs, want)
        assert res.outputs["upd"] is dst  # alias_of: the caller's array, updated in place
        np.testing.assert_allclose(cp.asnumpy(dst), want["upd"], rtol=1e-5, atol=1e-5)
        assert res.outputs["src"] is not src and res.outputs["src"].data.ptr != src.data.ptr  # never an input's buffer
        if call:
            assert res.timings_us["plan"] == 0.0
    # an out-of-range index on the fast path: RunError naming it, the in-place input untouched
    dst_h = rng.standard_normal(M).astype(np.float32)
    idx_h = rng.integers(0, M, N)
    idx_h[N // 2] = M + 7
    dst = cp.asarray(dst_h)
    with pytest.raises(RunError, match=str(M + 7)):
        eng.run(f, {"dst": dst, "index": cp.asarray(idx_h), "src": cp.asarray(rng.standard_normal(N).astype(np.float32))})
    np.testing.assert_array_equal(cp.asnumpy(dst), dst_h)
    # and the next run on the same path is fine
    idx_h[N // 2] = 0
    src_h = rng.standard_normal(N).astype(np.float32)
    want = run_graph(f, {"dst": dst_h.copy(), "index": idx_h, "src": src_h})
    _check(eng.run(f, {"dst": dst, "index": cp.asarray(idx_h), "src": cp.asarray(src_h)}).outputs, want)


def test_another_stride_signature_takes_its_own_path():
    g = {"format": "segfuse.fusion/1", "name": "fast_strides", "inputs": [{"name": "x", "dtype": "float32", "shape": ["N"]}],
         "ops": [{"op": "mul", "out": "y", "inputs": ["x", 3.0]}, {"op": "add", "out": "z", "inputs": ["y", 1.0]}],
         "outputs": ["z"]}
    f = Fusion.from_json(g)
    eng = Engine("cupy")
    base = cp.arange(2000, dtype=cp.float32)
    for x in (base[:1000], base[:1000], base[::2], base[::2], base[1:1001]):
        got = eng.run(f, {"x": x}).outputs["z"]
        np.testing.assert_allclose(cp.asnumpy(got), cp.asnumpy(x) * 3 + 1)


def test_threads_share_an_engine_safely():
    graph, mk = moe_graphs()[0]
    f = Fusion.from_json(graph)
    eng = Engine("cupy")
    eng.run(f, {k: cp.asarray(v) for k, v in mk(128)(np.random.default_rng(0)).items()})
    _count_in_threads(eng, f, mk, T=128, threads=8, calls=30)


def _count_in_threads(eng, f, mk, T: int, threads: int, calls: int):
    """`threads` threads each run the expert histogram `calls` times on one Engine, checking each
    result against NumPy (an assertion in a thread is collected and raised here)."""
    errors = []

    def worker(seed):
        try:
            for i in range(calls):
                host = mk(T)(np.random.default_rng(seed * 100 + i))
                out = eng.run(f, {k: cp.asarray(v) for k, v in host.items()}).outputs["counts"]
                np.testing.assert_array_equal(cp.asnumpy(out), run_graph(f, host)["counts"])
        except Exception as e:  # reported below: an assertion in a thread would be lost
            errors.append(e)

    pool = [threading.Thread(target=worker, args=(s,)) for s in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert not errors, errors[0]


def test_results_the_caller_keeps_are_never_reused():
    """Small buffers are reused once the caller has dropped them; anything still referenced (the
    result, a view of it, a torch tensor sharing it) keeps its values."""
    graph, mk = moe_graphs()[1]  # expert offsets: counts [256] -> offsets [257]
    f = Fusion.from_json(graph)
    eng = Engine("cupy")
    kept, views = [], []
    for seed in range(12):
        host = mk(128)(np.random.default_rng(seed))
        want = run_graph(f, host)["expert_offsets"]
        out = eng.run(f, {k: cp.asarray(v) for k, v in host.items()}).outputs["expert_offsets"]
        np.testing.assert_array_equal(cp.asnumpy(out), want)
        if seed % 3 == 0:
            kept.append((out, want))
        elif seed % 3 == 1:
            views.append((out[5:], want[5:]))
        del out  # the third kind is dropped: its buffer may serve the next run
    for got, want in kept + views:
        np.testing.assert_array_equal(cp.asnumpy(got), want)


@pytest.mark.parametrize("fast", [False, True])
def test_runs_that_cannot_fail_return_before_the_gpu_finishes(fast, spin):
    """A plan without checks (expert offsets) returns once launched; one that checks indices
    (the expert histogram) waits for its kernel to learn the outcome. Either way the results are
    ordered before later work on the default stream."""
    eng = Engine("cupy")
    for g, mk in moe_graphs()[:2]:
        f = Fusion.from_json(g)
        host = mk(128)(np.random.default_rng(1))
        ins = {k: cp.asarray(v) for k, v in host.items()}
        if fast:
            eng.run(f, ins)
            eng.run(f, ins)
        else:  # compile first (loading a module may wait for the GPU); the run takes the general path
            eng.warmup(f, {k: v.shape for k, v in ins.items()})
        cp.cuda.Device().synchronize()
        spin(300)
        out = eng.run(f, ins).outputs
        waited = cp.cuda.Stream.null.done
        assert waited is (g["name"] == "moe_problem_sizes"), g["name"]
        # read on the default stream right away: ordered after the run's kernels
        for k, w in run_graph(f, host).items():
            np.testing.assert_array_equal(cp.asnumpy(out[k]), w, err_msg=k)


def test_async_results_used_on_the_default_stream_then_dropped():
    """Results of runs that do not wait, consumed by default-stream work (CuPy and torch) and then
    dropped so the next run reuses their buffers: every consumer saw its own run's values."""
    torch = pytest.importorskip("torch")
    graph, mk = moe_graphs()[2]  # blockscale offsets: two outputs, no checks
    f = Fusion.from_json(graph)
    eng = Engine("cupy")
    sums, tsums, wants = [], [], []
    for seed in range(40):
        host = mk(4096)(np.random.default_rng(seed))
        out = eng.run(f, {k: cp.asarray(v) for k, v in host.items()}).outputs
        sums.append(out["expert_offsets"].sum() + out["blockscale_offsets"][-1])
        tsums.append(torch.as_tensor(out["blockscale_offsets"], device="cuda").sum())
        want = run_graph(f, host)
        wants.append((want["expert_offsets"].sum() + want["blockscale_offsets"][-1], want["blockscale_offsets"].sum()))
        del out
    for s, t, (ws, wt) in zip(sums, tsums, wants):
        assert int(s) == int(ws) and int(t) == int(wt)


def test_a_bad_index_after_async_runs_still_raises_and_the_next_run_is_fine():
    hist, mk = moe_graphs()[0]
    offs, mk2 = moe_graphs()[1]
    fh, fo = Fusion.from_json(hist), Fusion.from_json(offs)
    eng = Engine("cupy")
    good = mk(128)(np.random.default_rng(0))
    bad = dict(good)
    bad["topk_ids"] = good["topk_ids"].copy()
    bad["topk_ids"][3, 5] = 256
    counts = {k: cp.asarray(v) for k, v in mk2(128)(np.random.default_rng(0)).items()}
    for _ in range(3):
        eng.run(fo, counts)  # no checks: returns at once
        with pytest.raises(RunError, match="index 256 is out of bounds"):
            eng.run(fh, {k: cp.asarray(v) for k, v in bad.items()})
        got = eng.run(fh, {k: cp.asarray(v) for k, v in good.items()}).outputs["counts"]
        np.testing.assert_array_equal(cp.asnumpy(got), run_graph(fh, good)["counts"])


@pytest.mark.parametrize("idt", ["int64", "int32"])
def test_multi_block_histogram_repeats_and_reports_bad_ids(idt):
    """MoE problem sizes at T=4096 run as a multi-block histogram whose last block (a ticket
    counter, zeroed again by that block) writes the counts: repeated runs, runs after an error and
    runs on two threads all count right."""
    graph, mk = moe_graphs(idt=idt)[0]
    f = Fusion.from_json(graph)
    eng = Engine("cupy")
    for seed in range(4):
        host = mk(4096)(np.random.default_rng(seed))
        got = eng.run(f, {k: cp.asarray(v) for k, v in host.items()}).outputs["counts"]
        np.testing.assert_array_equal(cp.asnumpy(got), run_graph(f, host)["counts"])
    for pos, bad_id in (((0, 0), 300), ((4095, 7), -1), ((2000, 3), 256)):
        host = mk(4096)(np.random.default_rng(9))
        host["topk_ids"][pos] = bad_id
        with pytest.raises(RunError, match=f"index {bad_id} is out of bounds"):
            eng.run(f, {k: cp.asarray(v) for k, v in host.items()})
        host = mk(4096)(np.random.default_rng(10))
        got = eng.run(f, {k: cp.asarray(v) for k, v in host.items()}).outputs["counts"]
        np.testing.assert_array_equal(cp.asnumpy(got), run_graph(f, host)["counts"])
    _count_in_threads(eng, f, mk, T=4096, threads=2, calls=20)
