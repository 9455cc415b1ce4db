"""`Engine("cupy", errors="deferred")` on the GPU: runs whose kernels check data return once
launched; a failure is raised by a later call on the same thread or by `Engine.synchronize()`
(`DeferredRunError` naming the graph, op and index); the GPU stays usable and later results are
right; runs that update an input in place are still checked before they return."""

from __future__ import annotations

import threading

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from corpus import moe_graphs  # noqa: E402
from helpers.graphs import SCATTER_ADD_INPLACE  # noqa: E402
from segfuse.compiler.cuda import thread_state as ts  # noqa: E402
from segfuse.compiler.engine import Engine  # noqa: E402
from segfuse.compiler.errors import DeferredRunError, RunError  # noqa: E402
from segfuse.compiler.ir import Fusion  # noqa: E402
from segfuse.compiler.numpy_backend import run_graph  # noqa: E402

pytestmark = pytest.mark.gpu

def _hist(idt="int64"):
    g, mk = moe_graphs(idt=idt)[0]
    return Fusion.from_json(g), mk


def _bad(mk, T, seed, pos, value):
    host = mk(T)(np.random.default_rng(seed))
    host["topk_ids"][pos] = value
    return host


@pytest.mark.parametrize("T", [1, 128, 4096, 65536])
@pytest.mark.parametrize("idt", ["int64", "int32"])
def test_deferred_runs_match_numpy(T, idt):
    f, mk = _hist(idt)
    eng = Engine("cupy", errors="deferred")
    outs, wants = [], []
    for seed in range(5):  # the first call prepares, later ones take the fast path
        host = mk(T)(np.random.default_rng(seed))
        outs.append(eng.run(f, {k: cp.asarray(v) for k, v in host.items()}).outputs["counts"])
        wants.append(run_graph(f, host)["counts"])
    eng.synchronize()
    for got, want in zip(outs, wants):
        np.testing.assert_array_equal(cp.asnumpy(got), want)


@pytest.mark.parametrize("fast", [False, True])
def test_a_checked_run_returns_before_the_gpu_finishes(fast, spin):
    f, mk = _hist()
    host = mk(128)(np.random.default_rng(1))
    ins = {k: cp.asarray(v) for k, v in host.items()}
    eng = Engine("cupy", errors="deferred")
    if fast:
        eng.run(f, ins)
        eng.run(f, ins)
    else:
        eng.warmup(f, {k: v.shape for k, v in ins.items()})
    cp.cuda.Device().synchronize()
    spin(300)
    out = eng.run(f, ins).outputs["counts"]
    assert not cp.cuda.Stream.null.done  # returned while the spin kernel still held the GPU
    np.testing.assert_array_equal(cp.asnumpy(out), run_graph(f, host)["counts"])  # ordered after it
    eng.synchronize()


@pytest.mark.parametrize("T", [128, 4096])
def test_a_bad_id_is_raised_by_the_next_call_and_the_gpu_stays_usable(T):
    f, mk = _hist()
    eng = Engine("cupy", errors="deferred")
    for seed in range(2):
        host = mk(T)(np.random.default_rng(seed))
        eng.run(f, {k: cp.asarray(v) for k, v in host.items()})
    bad = _bad(mk, T, 5, (T - 1, 7), 256)
    eng.run(f, {k: cp.asarray(v) for k, v in bad.items()})  # returns: the failure is not known yet
    cp.cuda.Device().synchronize()
    good = mk(T)(np.random.default_rng(6))
    with pytest.raises(DeferredRunError, match=r"ops\[3\].inputs\[1\]: an earlier run of graph 'moe_problem_sizes' "
                                               r"failed: scatter: index 256 is out of bounds for dimension 0 with size 256"):
        eng.run(f, {k: cp.asarray(v) for k, v in good.items()})
    # reported once; the next runs are right
    for seed in range(7, 10):
        host = mk(T)(np.random.default_rng(seed))
        got = eng.run(f, {k: cp.asarray(v) for k, v in host.items()}).outputs["counts"]
        np.testing.assert_array_equal(cp.asnumpy(got), run_graph(f, host)["counts"])
    eng.synchronize()


def test_synchronize_raises_a_pending_failure_once(spin):
    f, mk = _hist()
    eng = Engine("cupy", errors="deferred")
    good = {k: cp.asarray(v) for k, v in mk(4096)(np.random.default_rng(0)).items()}
    bad1 = {k: cp.asarray(v) for k, v in _bad(mk, 4096, 1, (0, 0), -1).items()}
    bad2 = {k: cp.asarray(v) for k, v in _bad(mk, 4096, 2, (9, 1), 300).items()}
    eng.run(f, good)
    eng.run(f, good)  # the fast path is set up
    eng.synchronize()
    spin(300)  # both bad runs are queued before either runs, so neither call can see a failure
    eng.run(f, bad1)
    eng.run(f, bad2)
    assert not cp.cuda.Stream.null.done
    with pytest.raises(DeferredRunError, match="index -1 is out of bounds") as e:
        eng.synchronize()
    assert e.value.later_failures == 1
    eng.synchronize()  # nothing left


def test_a_failure_among_more_runs_than_the_ring_holds():
    f, mk = _hist()
    eng = Engine("cupy", errors="deferred")
    n = ts.DEFERRED_SLOTS * 2 + 5
    host = mk(128)(np.random.default_rng(0))
    want = run_graph(f, host)["counts"]
    ins = {k: cp.asarray(v) for k, v in host.items()}
    bad = {k: cp.asarray(v) for k, v in _bad(mk, 128, 0, (3, 3), 1000).items()}
    raised_at = None
    outs = {}
    for k in range(n):
        try:
            outs[k] = eng.run(f, bad if k == ts.DEFERRED_SLOTS + 10 else ins).outputs["counts"]
        except DeferredRunError as e:
            assert "index 1000" in str(e)
            raised_at = k
    if raised_at is None:  # not visible to any later call: the final synchronization reports it
        with pytest.raises(DeferredRunError, match="index 1000"):
            eng.synchronize()
    else:
        assert raised_at > ts.DEFERRED_SLOTS + 10
        eng.synchronize()
    assert len(outs) == n - (raised_at is not None)
    for k, o in outs.items():
        if k != ts.DEFERRED_SLOTS + 10:
            np.testing.assert_array_equal(cp.asnumpy(o), want)


def test_in_place_updates_are_still_checked_before_returning():
    f = Fusion.from_json(SCATTER_ADD_INPLACE)
    eng = Engine("cupy", errors="deferred")
    rng = np.random.default_rng(0)
    M, N = 300, 5000
    dst_h = rng.standard_normal(M).astype(np.float32)
    idx_h = rng.integers(0, M, N)
    src_h = rng.standard_normal(N).astype(np.float32)
    for _ in range(3):
        dst = cp.asarray(dst_h)
        bad = idx_h.copy()
        bad[N // 3] = -M - 1
        with pytest.raises(RunError, match=f"index {-M - 1} is out of bounds") as e:
            eng.run(f, {"dst": dst, "index": cp.asarray(bad), "src": cp.asarray(src_h)})
        assert not isinstance(e.value, DeferredRunError)
        np.testing.assert_array_equal(cp.asnumpy(dst), dst_h)  # untouched
        got = eng.run(f, {"dst": dst, "index": cp.asarray(idx_h), "src": cp.asarray(src_h)}).outputs["dst_updated"]
        want = run_graph(f, {"dst": dst_h.copy(), "index": idx_h, "src": src_h})["dst_updated"]
        np.testing.assert_allclose(cp.asnumpy(got), want, rtol=1e-5, atol=1e-5)


def test_a_synchronous_engine_on_the_thread_reports_a_pending_deferred_failure():
    f, mk = _hist()
    lazy, strict = Engine("cupy", errors="deferred"), Engine("cupy")
    lazy.run(f, {k: cp.asarray(v) for k, v in _bad(mk, 128, 3, (1, 1), 512).items()})
    good = mk(128)(np.random.default_rng(4))
    with pytest.raises(DeferredRunError, match="index 512"):
        strict.run(f, {k: cp.asarray(v) for k, v in good.items()})
    got = strict.run(f, {k: cp.asarray(v) for k, v in good.items()}).outputs["counts"]
    np.testing.assert_array_equal(cp.asnumpy(got), run_graph(f, good)["counts"])


def test_threads_keep_their_own_deferred_failures():
    f, mk = _hist()
    eng = Engine("cupy", errors="deferred")
    errors, wrong = {}, []

    def worker(t):
        try:
            for k in range(30):
                host = _bad(mk, 128, 100 * t + k, (0, 0), 256 + t) if (t == 1 and k == 10) else \
                    mk(128)(np.random.default_rng(100 * t + k))
                out = eng.run(f, {x: cp.asarray(v) for x, v in host.items()}).outputs["counts"]
                if not (t == 1 and k == 10) and not np.array_equal(cp.asnumpy(out), run_graph(f, host)["counts"]):
                    wrong.append((t, k))
            eng.synchronize()
        except DeferredRunError as e:
            errors[t] = str(e)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not wrong
    assert list(errors) == [1] and "index 257" in errors[1]
