"""Deferred device errors (`Engine(errors="deferred")`) without a GPU: the engine's option, and the
per-thread ring of error blocks (`ThreadState`) driven through a stand-in for CuPy whose "mapped
host memory" is ordinary host memory. A test plays the kernel by writing a block's words; what a
later call raises is checked against what was written. The GPU suite runs the same rules for real
(tests/gpu/test_deferred_errors_gpu.py)."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.error_blocks import GRAPH, _fail, _fake_cupy
from segfuse.compiler.cuda import thread_state as ts
from segfuse.compiler.engine import Engine
from segfuse.compiler.errors import DeferredRunError, RunError
from segfuse.compiler.ir import Fusion
from segfuse.compiler.numpy_backend import run_graph


@pytest.fixture
def state():
    return ts.ThreadState(_fake_cupy())


def test_engine_takes_the_error_mode_and_rejects_others():
    f = Fusion.from_json(GRAPH)
    i = np.array([0, 3, 3, 1])
    for mode in ("raise", "deferred"):
        eng = Engine("numpy", errors=mode)
        assert eng.errors == mode
        np.testing.assert_array_equal(eng.run(f, {"i": i}).outputs["c"], [1, 1, 0, 2])
        eng.synchronize()  # nothing is queued on the host backend
    with pytest.raises(ValueError, match="errors must be one of raise, deferred, not 'later'"):
        Engine("numpy", errors="later")


def test_the_host_backend_raises_at_once_in_either_mode():
    f = Fusion.from_json(GRAPH)
    with pytest.raises(RunError, match="index 9 is out of bounds") as e:
        Engine("numpy", errors="deferred").run(f, {"i": np.array([0, 9])})
    assert not isinstance(e.value, DeferredRunError)


def test_each_deferred_run_gets_its_own_block(state):
    f = Fusion.from_json(GRAPH)
    ptrs = [state.claim_slot(f) for _ in range(5)]
    step = ts.ERR_WORDS * 8
    assert ptrs == [state.sync_err_ptr + step * (k + 1) for k in range(5)]  # block 0 stays the synchronous one
    state.settle()  # no kernel wrote: nothing to raise, the runs may still be in flight
    assert len(state.pending) == 5 and state.stream.syncs == 0
    state.synchronize()  # drained without a failure: all forgotten
    assert state.pending == [] and state.stream.syncs == 1
    assert state.claim_slot(f) == ptrs[0]


def test_a_failed_run_is_raised_by_the_next_check_naming_its_graph_and_op(state):
    good, bad = Fusion.from_json(GRAPH), Fusion.from_json({**GRAPH, "name": "other"})
    state.claim_slot(good)
    p = state.claim_slot(bad)
    state.claim_slot(good)
    _fail(state, p, op_index=2, value=-7)
    with pytest.raises(DeferredRunError, match=r"ops\[2\].inputs\[1\]: an earlier run of graph 'other' failed: "
                                               r"scatter: index -7 is out of bounds for dimension 0 with size 4") as e:
        state.settle()
    assert e.value.later_failures == 0 and isinstance(e.value, RunError)
    assert state.stream.syncs == 1  # waited for the failing kernel to finish writing its words
    assert state.pending == [] and not state.ring.any()  # reported once, then a clean slate
    state.settle()
    state.synchronize()


def test_the_first_of_several_failures_is_reported_and_the_rest_counted(state):
    f = Fusion.from_json(GRAPH)
    ptrs = [state.claim_slot(f) for _ in range(6)]
    for k, v in ((4, 40), (1, 10), (5, 50)):
        _fail(state, ptrs[k], op_index=2, value=v)
    with pytest.raises(DeferredRunError, match="index 10 is out of bounds") as e:
        state.synchronize()
    assert e.value.later_failures == 2


def test_a_full_ring_drains_the_stream_before_reusing_blocks(state):
    f = Fusion.from_json(GRAPH)
    first = [state.claim_slot(f) for _ in range(ts.DEFERRED_SLOTS)]
    assert len(set(first)) == ts.DEFERRED_SLOTS and state.stream.syncs == 0
    again = state.claim_slot(f)
    assert state.stream.syncs == 1 and again == first[0] and len(state.pending) == 1
    # a failure among a full ring is raised when the ring drains, before a block is reused
    for _ in range(ts.DEFERRED_SLOTS - 1):
        p = state.claim_slot(f)
    _fail(state, p, op_index=2, value=99)
    with pytest.raises(DeferredRunError, match="index 99"):
        state.claim_slot(f)
    assert state.pending == [] and not state.ring.any()


def test_synchronous_blocks_are_untouched_by_deferred_runs(state):
    f = Fusion.from_json(GRAPH)
    p = state.claim_slot(f)
    _fail(state, p, op_index=2, value=5)
    assert not state.host.any()  # block 0, which synchronous runs reset and read, is separate
    with pytest.raises(DeferredRunError):
        state.settle()


def test_defers_only_runs_without_in_place_outputs(state):
    f = Fusion.from_json(GRAPH)
    assert ts.defers(f, state)
    inplace = Fusion.from_json({**GRAPH, "inputs": GRAPH["inputs"] + [{"name": "d", "dtype": "int64", "shape": [4]}],
                                "ops": [{"op": "full_like", "out": "one", "inputs": ["i"], "value": 1, "dtype": "int64"},
                                        {"op": "scatter", "out": "c", "inputs": ["d", "i", "one"], "dim": 0,
                                         "reduce": "add"}],
                                "outputs": [{"name": "c", "alias_of": "d"}]})
    assert not ts.defers(inplace, state)
    want = run_graph(inplace, {"i": np.array([1, 1]), "d": np.zeros(4, np.int64)})["c"]
    np.testing.assert_array_equal(want, [0, 2, 0, 0])
    state.mapped = False  # error words copied back from device memory: always checked at once
    assert not ts.defers(f, state)
