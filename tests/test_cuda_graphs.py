"""The fast path's CUDA-graph logic (`compiler/cuda/graphs.py`) without a GPU: when a run is
captured, when a graph is replayed, which error block a run writes and which failure a later
call raises, eviction, and what happens when a capture fails. A stand-in for CuPy records
"launches"; a stand-in kernel computes the histogram with NumPy when it runs (directly, or when
its graph is replayed) and writes the error words, as a real kernel would, into whatever block
its launch was given. The expected counts come from `np.bincount`. The GPU suite runs the real
thing (tests/gpu/test_cuda_graphs_gpu.py)."""

from __future__ import annotations

import ctypes
import threading
import types
import weakref

import numpy as np
import pytest
from cupy_standin import Array, Graph, fake_cupy
from segfuse.compiler.cuda import arrays, graphs
from segfuse.compiler.cuda import runtime as rtmod
from segfuse.compiler.cuda import thread_state as ts
from segfuse.compiler.errors import DeferredRunError, RunError
from segfuse.compiler.ir import Fusion
from segfuse.compiler.plan import Commit

BINS = 4
GRAPH = {"format": "segfuse.fusion/1", "name": "hist",
         "inputs": [{"name": "i", "dtype": "int64", "shape": ["N"]}],
         "ops": [{"op": "full", "out": "z", "inputs": [], "shape": [BINS], "value": 0, "dtype": "int64"},
                 {"op": "full_like", "out": "one", "inputs": ["i"], "value": 1, "dtype": "int64"},
                 {"op": "scatter", "out": "c", "inputs": ["z", "i", "one"], "dim": 0, "reduce": "add"}],
         "outputs": ["c"]}


class _Stream:
    """A stream that runs launches at once, or records them while capturing."""

    count = 0

    def __init__(self, non_blocking=False):
        _Stream.count += 1
        self.ptr = 1000 + _Stream.count
        self.non_blocking = non_blocking
        self.recording = None
        self.syncs = 0
        self.fail_capture = False

    def synchronize(self):
        assert self.recording is None, "a capturing stream cannot be synchronized"
        self.syncs += 1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def begin_capture(self):
        assert self.non_blocking, "captures must not use a blocking stream"
        self.recording = []

    def end_capture(self):
        work, self.recording = self.recording, None
        if self.fail_capture:
            raise RuntimeError("cudaErrorStreamCaptureInvalidated")
        return Graph(work)


def _fake_cupy():
    return fake_cupy(_Stream)


_LIVE: dict = {}  # address -> weak reference to the array there (what a pointer reaches)


def _hist_step(launches: list, binds: list):
    """A kernel step with the runtime's bind/fire protocol: parameters are the input's and the
    output's addresses and the error block; running writes the histogram, or the error words of
    the first bad index into the block it was launched with. A launch keeps addresses, not the
    arrays (a graph holds pointers), so output buffers are reused as on the GPU."""
    token = object()

    def bind(env, ctx):
        binds.append(1)
        st = ctx.state
        rec = st.params.get(token)
        if rec is None:
            rec = st.params[token] = [(ctypes.c_uint64 * 3)(), None, 0, True]
        out = st.buffers.get(token)
        if out is None or arrays.getrefcount(out) > arrays._FREE_REFS:
            out = st.buffers[token] = np.zeros(BINS, np.int64).view(Array)
        env["c"] = out
        for a in (env["i"], out):
            _LIVE[a.data.ptr] = weakref.ref(a)
        vals = rec[0]
        vals[0], vals[1], vals[2] = env["i"].data.ptr, out.data.ptr, 0
        return rec

    def fire(rec, err_ptr, sp):
        vals = rec[0]
        vals[2] = err_ptr
        p_in, p_out = vals[0], vals[1]

        def run():
            ins, out = _LIVE[p_in](), _LIVE[p_out]()
            bad = (ins < 0) | (ins >= BINS)
            out[...] = np.bincount(ins[~bad], minlength=BINS)
            if bad.any():
                w = (ctypes.c_int64 * ts.ERR_WORDS).from_address(err_ptr)
                if w[0] == 0:
                    w[0], w[1], w[2], w[3], w[4] = 1, 2, int(ins[bad][0]), 0, BINS

        launches.append(sp)
        stream = _STREAMS[sp]
        if stream.recording is not None:
            stream.recording.append(run)
        else:
            run()

    def run(env, ctx):
        fire(bind(env, ctx), ctx.state.err_ptr, ctx.sp)

    run.bind, run.fire = bind, fire
    return run


_STREAMS: dict = {}


class _Setup:
    """One thread's state and one prepared fast-path call, as `prepared_call` builds them."""

    def __init__(self, defer: bool):
        cp = _fake_cupy()
        self.rt = rtmod.CupyRuntime.__new__(rtmod.CupyRuntime)
        self.rt.cp, self.rt.use_graphs, self.rt.graph_fallback_reason, self.rt.graph_captures = cp, True, "", 0
        self.st = ts.ThreadState(cp)
        _STREAMS[self.st.stream.ptr] = self.st.stream
        orig = cp.cuda.Stream

        def stream(non_blocking=False):
            s = orig(non_blocking)
            _STREAMS[s.ptr] = s
            return s

        cp.cuda.Stream = stream
        self.fusion = Fusion.from_json(GRAPH)
        self.launches: list = []
        self.binds: list = []
        prep = types.SimpleNamespace(steps=[types.SimpleNamespace(kind="kernel",
                                                                  run=_hist_step(self.launches, self.binds))],
                                     may_fail=True, outputs=(Commit("c"),))
        tls = threading.local()
        tls.st = self.st
        token = object()

        def new_ctx(st):
            ctx = st.params[token] = ts.RunCtx(self.rt, st)
            return ctx

        self.token = token
        self.call = graphs.graphed_call(self.rt, self.fusion, prep, defer, tls, lambda: self.st, token, new_ctx)

    def ctx(self):
        return self.st.params[self.token]

    def run(self, ids) -> np.ndarray:
        return np.array(self.call({"i": ids})["c"])  # a copy: the run's buffer is free again


def _ids(*v):
    return np.array(v, np.int64).view(Array)


@pytest.mark.parametrize("defer", [False, True])
def test_the_second_run_with_the_same_parameters_is_captured_and_later_ones_replay(defer):
    s = _Setup(defer)
    ids = _ids(0, 1, 1, 3)
    for k in range(5):
        ids[...] = [k % BINS, 1, 1, 3]  # same buffer, new data
        np.testing.assert_array_equal(s.run(ids), np.bincount(ids, minlength=BINS))
    assert s.rt.graph_captures == 1
    (graph, blk), = s.ctx().graphs.values()
    assert graph.launches == 4  # the capturing run and the three after it
    assert (blk is not None) == defer
    # the launches of the capture went to a non-blocking stream of the thread's own
    assert s.launches[1] == s.st.capture_stream.ptr != s.st.stream.ptr


def test_runs_on_new_buffers_each_time_launch_directly():
    s = _Setup(True)
    kept = []
    for k in range(4):
        ids = _ids(k % BINS, 2)
        kept.append(s.call({"i": ids})["c"])  # results kept: a new output buffer every run
        np.testing.assert_array_equal(kept[-1], np.bincount(ids, minlength=BINS))
    assert s.rt.graph_captures == 0 and not s.ctx().graphs
    assert len(s.st.pending) == 4  # each direct deferred run took a ring slot


def test_a_checked_replay_raises_its_own_failure_from_the_synchronous_block():
    s = _Setup(False)
    ids = _ids(0, 1, 2)
    s.run(ids)
    s.run(ids)  # captured
    ids[1] = 9
    with pytest.raises(RunError, match=r"scatter: index 9 is out of bounds for dimension 0 with size 4") as e:
        s.run(ids)
    assert not isinstance(e.value, DeferredRunError)
    ids[1] = 1
    np.testing.assert_array_equal(s.run(ids), [1, 1, 1, 0])  # the block was reset before this run


def test_a_deferred_replay_failure_is_raised_once_by_a_later_call_naming_the_graph():
    s = _Setup(True)
    ids = _ids(0, 1, 2)
    s.run(ids)
    s.run(ids)  # captured: later runs write the graph's own block
    (_graph, blk), = s.ctx().graphs.values()
    assert s.st.graph_owner[blk] is s.fusion and blk not in s.st.graph_free
    ids[2] = -3
    # the stand-in GPU runs at launch, so the failure is visible at once; still the failing call
    # returns (a deferred run checks before its launch, never its own failure) and the next raises
    s.run(ids)
    assert s.st.gblocks[blk, 0] != 0
    with pytest.raises(DeferredRunError, match=r"an earlier run of graph 'hist' failed: scatter: index -3") as e:
        s.run(ids)
    assert e.value.later_failures == 0
    assert not s.st.gblocks.any() and s.st.graph_runs == 0
    ids[2] = 2
    np.testing.assert_array_equal(s.run(ids), [1, 1, 1, 0])
    s.st.synchronize()  # nothing left to report


def test_a_failing_ring_run_is_reported_first_and_a_failing_replay_counted():
    s = _Setup(True)
    ids = _ids(0, 1)
    s.run(ids)  # direct: takes a ring slot
    s.run(ids)  # captured: replays write the graph's block
    ids[0] = 8
    s.run(ids)  # a replay that fails: it returns (a deferred run checks before its launch)
    slot = s.st.claim_slot(s.fusion)  # another run in flight...
    (ctypes.c_int64 * ts.ERR_WORDS).from_address(slot)[:] = [1, 2, 11, 0, BINS]  # ...that failed
    (graph, _blk), = s.ctx().graphs.values()
    replays = graph.launches
    with pytest.raises(DeferredRunError, match="index 11") as e:
        s.run(ids)  # the next call: the ring's failure first, the replay's counted; nothing launched
    assert e.value.later_failures == 1 and graph.launches == replays
    assert not s.st.ring.any() and not s.st.gblocks.any() and s.st.pending == []


def test_the_oldest_graph_goes_and_its_block_is_freed_after_its_runs_drained():
    s = _Setup(True)
    bufs = [_ids(k % BINS, 1) for k in range(graphs.GRAPHS_PER_CALL + 1)]
    free0 = len(s.st.graph_free)
    for b in bufs:
        s.run(b)
        s.run(b)
    assert s.rt.graph_captures == len(bufs)
    assert len(s.ctx().graphs) == graphs.GRAPHS_PER_CALL
    assert len(s.st.graph_free) == free0 - graphs.GRAPHS_PER_CALL  # the evicted graph's block came back
    assert s.st.stream.syncs >= 1  # its replays were waited for before its block was reused
    for b in bufs:
        np.testing.assert_array_equal(s.run(b), np.bincount(b, minlength=BINS))


def test_no_capture_once_every_graph_block_is_taken():
    s = _Setup(True)
    s.st.graph_free.clear()
    ids = _ids(1, 2)
    for _ in range(3):
        np.testing.assert_array_equal(s.run(ids), [0, 1, 1, 0])
    assert s.rt.graph_captures == 0 and not s.ctx().graphs


def test_a_failed_capture_turns_graphs_off_and_the_run_still_happens():
    s = _Setup(True)
    ids = _ids(3, 3)
    s.run(ids)
    s.st.capture_stream = _Stream(non_blocking=True)
    _STREAMS[s.st.capture_stream.ptr] = s.st.capture_stream
    s.st.capture_stream.fail_capture = True
    free0 = len(s.st.graph_free)
    np.testing.assert_array_equal(s.run(ids), [0, 0, 0, 2])  # launched directly instead
    assert not s.rt.use_graphs and "Invalidated" in s.rt.graph_fallback_reason
    assert len(s.st.graph_free) == free0  # the block it had taken is free again
    np.testing.assert_array_equal(s.run(ids), [0, 0, 0, 2])
    assert s.rt.graph_captures == 0


@pytest.mark.parametrize("defer", [False, True])
def test_a_replay_on_the_same_input_with_the_result_dropped_binds_nothing(defer):
    s = _Setup(defer)
    ids = _ids(0, 1, 1, 3)
    s.run(ids)
    s.run(ids)  # captured (and remembered)
    binds = len(s.binds)
    for k in range(4):
        ids[0] = k % BINS  # same buffer, new data: the replay computes it
        np.testing.assert_array_equal(s.run(ids), np.bincount(ids, minlength=BINS))
    assert len(s.binds) == binds  # the memo replayed the graph: no parameter block was bound
    (graph, _blk), = s.ctx().graphs.values()
    assert graph.launches == 5


@pytest.mark.parametrize("hold", ["result", "view"])
def test_a_result_the_caller_still_holds_is_never_overwritten(hold):
    s = _Setup(True)
    ids = _ids(0, 1, 1, 3)
    s.run(ids)
    s.run(ids)
    s.run(ids)
    out = s.call({"i": ids})["c"]
    kept = out if hold == "result" else out[1:]
    del out
    want = np.array(kept)
    binds = len(s.binds)
    ids[...] = [2, 2, 2, 2]
    np.testing.assert_array_equal(s.run(ids), [0, 0, 4, 0])
    np.testing.assert_array_equal(kept, want)  # the held buffer kept the earlier run's counts
    assert len(s.binds) == binds + 1  # the memo saw the reference and the run bound a new buffer


def test_new_input_buffers_miss_the_memo_and_compute_their_own_result():
    s = _Setup(False)
    a, b = _ids(0, 0, 1), _ids(3, 3, 3)
    s.run(a)
    s.run(a)
    s.run(a)
    np.testing.assert_array_equal(s.run(b), [0, 0, 0, 3])
    np.testing.assert_array_equal(s.run(a), [2, 1, 0, 0])


def test_a_run_holding_more_than_the_memo_limit_is_not_remembered(monkeypatch):
    monkeypatch.setattr(graphs, "MEMO_BYTES", 8)
    s = _Setup(False)
    ids = _ids(0, 1, 2)
    for _ in range(4):
        np.testing.assert_array_equal(s.run(ids), [1, 1, 1, 0])
    assert s.ctx().memo is None and s.ctx().memo_wait == -1
    assert len(s.binds) == 4


def test_a_failing_remembered_replay_raises_and_the_next_run_recovers():
    s = _Setup(False)
    ids = _ids(0, 1, 2)
    s.run(ids)
    s.run(ids)
    s.run(ids)
    assert s.ctx().memo is not None
    ids[0] = 7
    with pytest.raises(RunError, match="index 7"):
        s.run(ids)
    ids[0] = 3
    np.testing.assert_array_equal(s.run(ids), [0, 1, 1, 1])
