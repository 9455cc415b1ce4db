"""CUDA graphs on the kernels-only fast path (`compiler/cuda/graphs.py`): a run whose kernel
parameters (tensor pointers) repeat the last run's is captured once and replayed after that.
Every result is checked against NumPy's reference (`run_graph`); the tests also change the
data inside buffers a graph has baked in, put bad ids into them (synchronous and deferred
errors), keep results alive (new buffers each run: no capture), and use threads."""

from __future__ import annotations

import threading

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from corpus import moe_graphs  # noqa: E402
from segfuse.compiler.cuda import graphs  # noqa: E402
from segfuse.compiler.cuda.runtime import get_runtime  # noqa: E402
from segfuse.compiler.engine import Engine  # noqa: E402
from segfuse.compiler.errors import DeferredRunError, RunError  # noqa: E402
from segfuse.compiler.ir import Fusion  # noqa: E402
from segfuse.compiler.numpy_backend import run_graph  # noqa: E402

pytestmark = pytest.mark.gpu


def _graph(i, idt="int64"):
    g, mk = moe_graphs(idt=idt)[i]
    return Fusion.from_json(g), mk


@pytest.fixture(autouse=True)
def graphs_on():
    rt = get_runtime()
    if not rt.use_graphs:
        pytest.skip(f"CUDA graphs are off here ({rt.graph_fallback_reason or 'SEGFUSE_CUDA_GRAPHS=0'})")


@pytest.mark.parametrize("mode", ["raise", "deferred"])
@pytest.mark.parametrize("T", [1, 128, 4096, 65536])
def test_replays_see_new_data_in_the_same_buffers(mode, T):
    """The histogram (checked: one kernel at every T; at 65536 its first phase spread over 64 blocks) run on one input buffer whose
    contents change between runs (written on the default stream): replays read the new ids."""
    f, mk = _graph(0)
    rt = get_runtime()
    eng = Engine("cupy", errors=mode)
    ids = cp.asarray(mk(T)(np.random.default_rng(0))["topk_ids"])
    before = rt.graph_captures
    for seed in range(8):
        host = mk(T)(np.random.default_rng(seed))
        ids[...] = cp.asarray(host["topk_ids"])  # same pointer, new data, legacy stream
        got = eng.run(f, {"topk_ids": ids}).outputs["counts"]
        np.testing.assert_array_equal(cp.asnumpy(got), run_graph(f, host)["counts"])
        del got  # the caller drops the result: its buffer is reused, so the parameters repeat
    eng.synchronize()
    if T < 65536:  # (at 65536 a 4 MiB intermediate comes from the pool, whose pointer may move)
        assert rt.graph_captures == before + 1


@pytest.mark.parametrize("gi", [1, 2, 3])
def test_the_other_moe_fusions_replay_right(gi):
    f, mk = _graph(gi)
    rt = get_runtime()
    eng = Engine("cupy")
    host = mk(128)(np.random.default_rng(gi))
    ins = {k: cp.asarray(v) for k, v in host.items()}
    want = run_graph(f, host)
    before = rt.graph_captures
    for _ in range(5):
        out = eng.run(f, ins).outputs
        for name, w in want.items():
            np.testing.assert_array_equal(cp.asnumpy(out[name]), w)
        del out
    assert rt.graph_captures == before + 1


def test_results_kept_alive_mean_new_buffers_and_no_capture():
    f, mk = _graph(0)
    rt = get_runtime()
    eng = Engine("cupy")
    host = mk(128)(np.random.default_rng(3))
    ins = {k: cp.asarray(v) for k, v in host.items()}
    want = run_graph(f, host)["counts"]
    eng.run(f, ins)
    before = rt.graph_captures
    kept = [eng.run(f, ins).outputs["counts"] for _ in range(6)]
    assert len({int(a.data.ptr) for a in kept}) == len(kept)
    for a in kept:
        np.testing.assert_array_equal(cp.asnumpy(a), want)
    assert rt.graph_captures == before


def test_a_bad_id_in_a_replayed_buffer_raises_and_the_next_runs_are_right():
    f, mk = _graph(0)
    eng = Engine("cupy")
    host = mk(128)(np.random.default_rng(4))
    ids = cp.asarray(host["topk_ids"])
    for _ in range(3):
        del_me = eng.run(f, {"topk_ids": ids}).outputs["counts"]
        del del_me
    ids[5, 3] = 256
    with pytest.raises(RunError, match=r"index 256 is out of bounds for dimension 0 with size 256"):
        eng.run(f, {"topk_ids": ids})
    ids[5, 3] = host["topk_ids"][5, 3]
    for _ in range(3):
        got = eng.run(f, {"topk_ids": ids}).outputs["counts"]
        np.testing.assert_array_equal(cp.asnumpy(got), run_graph(f, host)["counts"])
        del got


def test_a_deferred_replay_failure_names_its_graph_once(spin):
    f, mk = _graph(0)
    eng = Engine("cupy", errors="deferred")
    host = mk(128)(np.random.default_rng(5))
    ids = cp.asarray(host["topk_ids"])
    for _ in range(4):  # captured at the second run; the rest replay
        out = eng.run(f, {"topk_ids": ids}).outputs["counts"]
        del out
    eng.synchronize()
    spin(200)  # the bad run below is queued behind it: its call cannot see its own failure
    ids[0, 0] = -7
    out = eng.run(f, {"topk_ids": ids}).outputs["counts"]  # a replay, with the bad id
    del out
    cp.cuda.Device().synchronize()
    with pytest.raises(DeferredRunError, match=r"an earlier run of graph 'moe_problem_sizes' failed: "
                                               r"scatter: index -7 is out of bounds"):
        eng.run(f, {"topk_ids": ids})  # (its own replay fails the same way, into the same block)
    eng.synchronize()  # reported once: nothing left
    ids[0, 0] = host["topk_ids"][0, 0]
    for _ in range(3):
        got = eng.run(f, {"topk_ids": ids}).outputs["counts"]
        np.testing.assert_array_equal(cp.asnumpy(got), run_graph(f, host)["counts"])
        del got
    eng.synchronize()
    st = get_runtime()._thread_state()
    assert not st.gblocks.any() and not st.ring.any()


def test_more_parameter_sets_than_a_call_keeps_graphs_for():
    """GRAPHS_PER_CALL + 2 input buffers, each run twice in a row: every pair captures, the
    oldest graphs are dropped (their error blocks return to the free list), results stay right."""
    f, mk = _graph(0)
    rt = get_runtime()
    eng = Engine("cupy", errors="deferred")
    eng.run(f, {"topk_ids": cp.asarray(mk(128)(np.random.default_rng(0))["topk_ids"])})
    st = rt._thread_state()
    free_before = len(st.graph_free)
    hosts = [mk(128)(np.random.default_rng(10 + k)) for k in range(graphs.GRAPHS_PER_CALL + 2)]
    bufs = [cp.asarray(h["topk_ids"]) for h in hosts]
    before = rt.graph_captures
    for _round in range(2):
        for h, b in zip(hosts, bufs):
            for _ in range(2):
                got = eng.run(f, {"topk_ids": b}).outputs["counts"]
                np.testing.assert_array_equal(cp.asnumpy(got), run_graph(f, h)["counts"])
                del got
    eng.synchronize()
    assert rt.graph_captures - before == 2 * len(hosts)  # each pair captured again in round 2
    assert len(st.graph_free) >= free_before - graphs.GRAPHS_PER_CALL


def test_threads_capture_and_replay_while_others_use_the_default_stream():
    """Three threads, each cycling through more input buffers than a call keeps graphs for (so
    they keep capturing), each also queuing work on the legacy default stream every run (which a
    capture on a blocking stream would make fail)."""
    f, mk = _graph(0)
    eng = Engine("cupy", errors="deferred")
    wrong, errors = [], []
    n_bufs = graphs.GRAPHS_PER_CALL + 2

    def worker(t):
        try:
            hosts = [mk(4096)(np.random.default_rng(100 * t + b)) for b in range(n_bufs)]
            bufs = [cp.asarray(h["topk_ids"]) for h in hosts]
            wants = [run_graph(f, h)["counts"] for h in hosts]
            for k in range(4 * n_bufs):
                b = (k // 2) % n_bufs
                scratch = bufs[b] + 0  # default-stream work while other threads capture
                got = eng.run(f, {"topk_ids": bufs[b]}).outputs["counts"]
                if not np.array_equal(cp.asnumpy(got), wants[b]):
                    wrong.append((t, k))
                del got, scratch
            eng.synchronize()
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors and not wrong
    assert get_runtime().use_graphs, get_runtime().graph_fallback_reason


@pytest.mark.parametrize("mode", ["raise", "deferred"])
@pytest.mark.parametrize("T", [1, 128])
@pytest.mark.parametrize("idt", ["int32", "int64"])
def test_the_replay_memo_never_hands_out_a_result_still_held(mode, T, idt, monkeypatch):
    """The whole MoE prologue (four outputs, two of them views of one buffer's neighbours) on one
    input buffer: runs whose results are dropped replay through the memo (graphs.graphed_call),
    runs whose results (or a view of one) are kept get new buffers; every result, kept ones
    checked again at the end, equals NumPy's for its own ids."""
    from segfuse.compiler.cuda.thread_state import RunCtx
    from torch_graphs import E, K, prologue_graph

    monkeypatch.setattr(graphs, "MEMO_WAIT", 2)  # (a miss stores no memo for 32 calls otherwise)
    f = Fusion.from_json(prologue_graph(idt))
    eng = Engine("cupy", errors=mode)
    rng = np.random.default_rng(T)
    ids = cp.asarray(rng.integers(0, E, (T, K)).astype(idt))
    kept = []
    for k in range(24):
        host = rng.integers(0, E, (T, K)).astype(idt)
        ids[...] = cp.asarray(host)
        out = eng.run(f, {"topk_ids": ids}).outputs
        want = run_graph(f, {"topk_ids": host})
        if k % 7 == 3:  # keep the result (or a view of one output) past later runs
            kept.append(({n: out[n] if k % 2 else out[n][: max(out[n].shape[0] // 2, 1)]
                          for n in out}, want))
        else:
            for name, w in want.items():
                np.testing.assert_array_equal(cp.asnumpy(out[name]), w, err_msg=f"run {k}: {name}")
        del out
    eng.synchronize()
    for held, want in kept:
        for name, a in held.items():
            np.testing.assert_array_equal(cp.asnumpy(a), want[name][: a.shape[0]], err_msg=name)
    st = get_runtime()._tls.st
    assert any(c.memo is not None for c in st.params.values() if isinstance(c, RunCtx))
