"""The NumPy plan executor: plans run segment by segment with real buffer aliasing give exactly
`run_graph`'s results on random graphs (scatters whose self has other uses, chains of scatters,
in-place `alias_of` outputs, views, scans, reductions, gathers), inputs stay untouched, and a
wrong plan shows up as wrong data or a PlanBug on the CPU."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from helpers.plan_graphs import BIG_N, graphs, make_inputs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from segfuse.compiler import Engine, Fusion, RunError, run_graph
from segfuse.compiler.plan_executor import PlanBug, execute
from segfuse.compiler.segmenter import segment

ENGINE = Engine()


def _fusion(graph):
    try:
        return Fusion.from_json(graph)
    except Exception:  # e.g. an input both returned and updated in place: not this test's business
        return None


@settings(max_examples=70, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs(), st.integers(0, 2**16))
def test_plan_execution_matches_run_graph(case, seed):
    graph, n, m = case
    f = _fusion(graph)
    if f is None:
        return
    ins = make_inputs(n, m, seed)
    ref_ins = copy.deepcopy(ins)
    try:
        want = run_graph(f, ref_ins)
    except RunError:
        with pytest.raises(RunError):
            ENGINE.run(f, ins)
        return
    before = copy.deepcopy(ins)
    got = ENGINE.run(f, ins).outputs
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=f"output {k}")
    aliased = {o.alias_of for o in f.outputs if o.alias_of}
    for k in ins:
        expected = ref_ins[k] if k in aliased else before[k]  # run_graph committed the aliases too
        np.testing.assert_array_equal(ins[k], expected, err_msg=f"input {k}")


def test_buffers_are_reused_after_last_use():
    graph = {"format": "segfuse.fusion/1", "inputs": [{"name": "x", "dtype": "float32", "shape": ["N"]}],
             "ops": [{"op": "cumsum", "out": "a", "inputs": ["x"], "dim": 0},
                     {"op": "cumsum", "out": "b", "inputs": ["a"], "dim": 0},
                     {"op": "cumsum", "out": "c", "inputs": ["b"], "dim": 0},
                     {"op": "cumsum", "out": "d", "inputs": ["c"], "dim": 0}],
             "outputs": ["d"]}
    f = Fusion.from_json(graph)
    plan = segment(f, f.bind({"x": (BIG_N,)}))
    assert len(plan.segments) == 4
    assert plan.tensor_buffer["c"] == plan.tensor_buffer["a"]  # a is dead once b is made
    assert plan.tensor_buffer["b"] != plan.tensor_buffer["a"]
    assert plan.frees == {"1": ["a"], "2": ["b"], "3": ["c"]}
    x = np.arange(BIG_N, dtype=np.float32) % 3
    np.testing.assert_array_equal(ENGINE.run(f, {"x": x}).outputs["d"], run_graph(f, {"x": x})["d"])


def _ordered_graph():
    graph = {"format": "segfuse.fusion/1",
             "inputs": [{"name": "x", "dtype": "float32", "shape": ["N"]},
                        {"name": "idx", "dtype": "int64", "shape": ["M"]}],
             "ops": [{"op": "add", "out": "a", "inputs": ["x", 1.0]},
                     {"op": "scatter", "out": "y", "inputs": ["a", "idx", 5.0], "dim": 0},
                     {"op": "mul", "out": "w", "inputs": ["a", 3.0]}],
             "outputs": ["y", "w"]}
    f = Fusion.from_json(graph)
    ins = {"x": np.zeros(BIG_N, np.float32), "idx": np.arange(8, dtype=np.int64)}
    return f, ins


def test_a_plan_reading_self_after_the_in_place_scatter_gives_wrong_data():
    """The executor's aliasing is real: move the reader of 'a' after the scatter that overwrites
    'a' in place, and the reader sees the scattered values."""
    f, ins = _ordered_graph()
    bound = f.bind({k: v.shape for k, v in ins.items()})
    plan = segment(f, bound)
    assert [s.nodes for s in plan.segments] == [[0, 2], [1]]
    assert plan.segments[1].aliases[0].mode == "ordered"
    want = run_graph(f, ins)
    good = execute(plan, f, bound.types, dict(ins))
    np.testing.assert_array_equal(good["w"], want["w"])
    bad = copy.deepcopy(plan)
    bad.segments[0].nodes, bad.segments[0].outputs = [0], ["a"]
    bad.segments[1].nodes, bad.segments[1].outputs = [1, 2], ["y", "w"]
    bad.segments[1].inputs = ["a", "idx"]
    got = execute(bad, f, bound.types, dict(ins))
    assert got["w"][0] == 15.0 and want["w"][0] == 3.0  # read after the in-place write


def test_inputs_are_write_protected_and_claimed_aliases_are_checked():
    f, ins = _ordered_graph()
    bound = f.bind({k: v.shape for k, v in ins.items()})
    plan = segment(f, bound)
    bad = copy.deepcopy(plan)  # pretend 'a' lives in x's buffer: the write hits a read-only input
    xb = plan.tensor_buffer["x"]
    for t, b in list(bad.tensor_buffer.items()):
        if b == plan.tensor_buffer["a"]:
            bad.tensor_buffer[t] = xb
    ro = {k: v.view() for k, v in ins.items()}
    for v in ro.values():
        v.flags.writeable = False
    with pytest.raises(ValueError):
        execute(bad, f, bound.types, ro)
    bad2 = copy.deepcopy(plan)
    bad2.segments[1].inputs = ["idx"]  # forgets an input
    with pytest.raises(PlanBug):
        execute(bad2, f, bound.types, dict(ins))


def test_run_error_leaves_inputs_and_aliases_untouched():
    graph = {"format": "segfuse.fusion/1",
             "inputs": [{"name": "cache", "dtype": "float32", "shape": ["N"]},
                        {"name": "idx", "dtype": "int64", "shape": ["M"]},
                        {"name": "j", "dtype": "int64", "shape": ["M"]}],
             "ops": [{"op": "index_put", "out": "c2", "inputs": ["cache", "idx", 1.0]},
                     {"op": "gather", "out": "g", "inputs": ["c2", "j"], "dim": 0}],
             "outputs": [{"name": "c2", "alias_of": "cache"}, "g"]}
    f = Fusion.from_json(graph)
    cache = np.zeros(BIG_N, np.float32)
    ins = {"cache": cache, "idx": np.array([1, 2], np.int64), "j": np.array([0, BIG_N + 3], np.int64)}
    with pytest.raises(RunError):  # the gather fails after index_put wrote in place
        ENGINE.run(f, ins)
    assert not cache.any()
    ins["j"] = np.array([1, 5], np.int64)
    out = ENGINE.run(f, ins).outputs
    assert cache[1] == cache[2] == 1.0 and out["c2"] is cache
    np.testing.assert_array_equal(out["g"], [1.0, 0.0])
