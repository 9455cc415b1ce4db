"""`Engine.run_batch`: several runs launched back to back with one wait, each with its own outcome.

The NumPy backend runs the batch for real (a failing run fails alone, the others' outputs match
the independent NumPy reference). The GPU bookkeeping (`ThreadState.begin_batch/end_batch`: one
error block per run, nothing raised between runs, each failure named by its run) is driven
through the CuPy stand-in, a test playing the kernel by writing a block's words. The GPU suite
runs the same batches on CuPy (tests/gpu/test_run_batch_gpu.py)."""

from __future__ import annotations

import numpy as np
import pytest
from cupy_standin import fake_cupy
from helpers.error_blocks import GRAPH, _fail, _Stream
from segfuse.compiler.cuda import thread_state as ts
from segfuse.compiler.engine import Engine, RunResult
from segfuse.compiler.errors import DeferredRunError, RunError
from segfuse.compiler.ir import Fusion
from segfuse.compiler.numpy_backend import NumpyBackend


def _hist(ids, n=4):
    return np.bincount(np.asarray(ids), minlength=n)


def test_numpy_batch_each_run_its_own_outcome():
    f = Fusion.from_json(GRAPH)
    batch = [np.array([0, 3, 3]), np.array([1, 9]), np.array([2, 2, 0, 1]), np.array([-5])]
    out = Engine("numpy").run_batch([(f, {"i": i}) for i in batch])
    assert len(out) == 4
    assert isinstance(out[0], RunResult) and isinstance(out[2], RunResult)
    np.testing.assert_array_equal(out[0].outputs["c"], _hist([0, 3, 3]))
    np.testing.assert_array_equal(out[2].outputs["c"], _hist([2, 2, 0, 1]))
    assert isinstance(out[1], RunError) and "index 9 is out of bounds" in str(out[1])
    assert isinstance(out[3], RunError) and "index -5 is out of bounds" in str(out[3])


def test_numpy_batch_of_nothing_and_of_other_failures():
    f = Fusion.from_json(GRAPH)
    assert Engine("numpy").run_batch([]) == []
    out = Engine("numpy").run_batch([(f, {"wrong": np.array([0])}), (f, {"i": np.array([1])})])
    assert "wrong" in str(out[0]) or "i" in str(out[0])
    np.testing.assert_array_equal(out[1].outputs["c"], _hist([1]))


@pytest.fixture
def state():
    return ts.ThreadState(fake_cupy(_Stream))


def test_batch_names_each_failed_run_and_waits_once(state):
    good, bad = Fusion.from_json(GRAPH), Fusion.from_json({**GRAPH, "name": "other"})
    state.begin_batch()
    ptrs = {}
    for owner, f in enumerate([good, bad, good, bad]):
        state.owner = owner
        ptrs[owner] = state.claim_slot(f)
        state.settle()  # what a run does after launching: inside a batch it never raises
    _fail(state, ptrs[1], op_index=2, value=7)
    _fail(state, ptrs[3], op_index=2, value=-1)
    syncs = state.stream.syncs
    failures = state.end_batch()
    assert state.stream.syncs == syncs + 1
    assert sorted(failures) == [1, 3]
    assert all(type(e) is RunError for e in failures.values())  # this run's own error, not "an earlier run"
    assert "index 7 is out of bounds" in str(failures[1]) and "index -1 is out of bounds" in str(failures[3])
    assert state.batch is None and state.pending == [] and not state.ring.any()
    state.synchronize()  # nothing left over for later runs


def test_a_replayed_graph_block_fails_the_runs_that_replayed_it(state):
    f = Fusion.from_json(GRAPH)
    state.begin_batch()
    blk = state.graph_free.pop()
    state.graph_owner[blk] = f
    state.owner = 0
    state.claim_slot(f)
    state.owner = 1
    state.graph_replayed(blk)
    words = state.gblocks[blk]
    words[0], words[1], words[2], words[3], words[4] = 1, 2, 12, 0, 4
    failures = state.end_batch()
    assert list(failures) == [1] and "index 12" in str(failures[1])
    assert state.graph_runs == 0 and not state.gblocks.any()


def test_a_clean_batch_reports_nothing(state):
    f = Fusion.from_json(GRAPH)
    state.begin_batch()
    for owner in range(ts.DEFERRED_SLOTS):
        state.owner = owner
        state.claim_slot(f)
    with pytest.raises(RuntimeError, match="at most"):
        state.claim_slot(f)  # Engine.run_batch never asks for more (it splits longer batches)
    assert state.end_batch() == {}


def test_an_earlier_deferred_failure_is_raised_before_the_batch(state):
    f = Fusion.from_json(GRAPH)
    p = state.claim_slot(f)
    _fail(state, p, op_index=2, value=3)
    with pytest.raises(DeferredRunError, match="index 3"):
        state.begin_batch()
    state.begin_batch()  # reported once: the next batch starts clean
    assert state.end_batch() == {}


class _BatchRecorder(NumpyBackend):
    """The NumPy backend with a GPU backend's batch bookkeeping recorded: runs per batch at most
    2, and the first batch's end reports run 1 as failed."""

    name = "batch-recorder"
    batch_size = 2

    def __init__(self):
        self.calls = []

    def begin_batch(self):
        self.calls.append("begin")

    def batch_owner(self, index):
        self.calls.append(index)

    def end_batch(self):
        self.calls.append("end")
        return {1: RunError([])} if self.calls.count("end") == 1 else {}


def test_engine_run_batch_drives_the_backends_batches():
    """The engine's side of a GPU batch: begin, an owner per run, end once per chunk of at most
    the backend's batch size; failures from end replace results."""
    f = Fusion.from_json(GRAPH)
    backend = _BatchRecorder()
    out = Engine(backend).run_batch([(f, {"i": np.array([k % 4])}) for k in range(3)])
    assert backend.calls == ["begin", 0, 1, "end", "begin", 0, "end"]
    assert isinstance(out[1], RunError)
    np.testing.assert_array_equal(out[0].outputs["c"], _hist([0]))
    np.testing.assert_array_equal(out[2].outputs["c"], _hist([2]))


def test_on_launched_sees_each_run_and_its_failure_is_that_runs():
    f = Fusion.from_json(GRAPH)
    seen = []

    def on_launched(i, result):
        seen.append((i, result.outputs["c"].tolist()))
        if i == 2:
            raise ValueError("copy failed")

    batch = [np.array([0]), np.array([7]), np.array([1, 1]), np.array([3])]
    out = Engine("numpy").run_batch([(f, {"i": i}) for i in batch], on_launched=on_launched)
    assert seen == [(0, _hist([0]).tolist()), (2, _hist([1, 1]).tolist()), (3, _hist([3]).tolist())]
    assert isinstance(out[1], RunError) and isinstance(out[2], ValueError)
    np.testing.assert_array_equal(out[3].outputs["c"], _hist([3]))
