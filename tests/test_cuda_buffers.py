"""The CUDA runtime allocates by the plan's buffers (compiler/cuda/buffers.py), without a GPU: on
the stand-in of tests/standin_kernels.py (the runtime's real preparation, binding and run paths;
"kernels" evaluate their segment with NumPy on the memory the runtime handed them), a run makes
one allocation per plan buffer of the plan's size, the tensors the plan puts in one buffer are
views of one allocation, outputs never share memory with an intermediate or a later run, and
results equal the NumPy interpreter's (`run_graph`, an independent oracle) on every run path:
synchronous, deferred, the fast path and its CUDA-graph replays."""

from __future__ import annotations

import copy

import numpy as np
import pytest
from corpus import all_cases, case_inputs
from cupy_standin import Array
from helpers.plan_graphs import BIG_N, graphs, runnable, scan_chain
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from segfuse.compiler import Engine, Fusion, run_graph
from segfuse.compiler.cuda import arrays
from segfuse.compiler.dtypes import from_numpy
from segfuse.compiler.segmenter.shapes import nbytes as plan_nbytes
from standin_kernels import StandinGPU

PLANS = Engine("numpy")


@pytest.fixture
def gpu(monkeypatch):
    g = StandinGPU()
    g.record_generate(monkeypatch)
    monkeypatch.setattr(arrays, "_ND", [Array])  # the fast path's signature: stand-in arrays
    return g


def _dev(ins):
    """Device arrays of the inputs (bfloat16 ones stay host arrays: the runtime uploads them)."""
    return {k: np.array(v) if v.dtype.name == "bfloat16" else np.array(v).view(Array) for k, v in ins.items()}


def _host(a, like):
    h = np.array(a)
    return h.view(like.dtype) if like.dtype.name == "bfloat16" else h


def _allocation_of(a):
    """The allocation an array views (its outermost base)."""
    while isinstance(a, np.ndarray) and a.base is not None and isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _filled(gpu, rt, f, ins, plan, monkeypatch):
    """Run once; the env the plan's buffers filled, and the run's outputs."""
    from segfuse.compiler.cuda import buffers

    seen = {}
    real = buffers.DeviceBuffers.fill

    def fill(self, env, ctx):
        real(self, env, ctx)
        seen.update(env)

    monkeypatch.setattr(buffers.DeviceBuffers, "fill", fill)
    outs, _ = rt.run(f, _dev(ins), plan)
    monkeypatch.setattr(buffers.DeviceBuffers, "fill", real)
    return seen, outs


def _check_allocations(gpu, rt, f, ins, monkeypatch):
    shapes = {k: np.shape(v) for k, v in ins.items()}
    plan = PLANS.plan(f, shapes)
    types = dict(f.bind(shapes).types)
    for seg in plan.segments:  # (a private copy has its source's type)
        for c in seg.copies:
            types[c.dst] = types[c.src]
    before = len(gpu.allocations)
    env, outs = _filled(gpu, rt, f, ins, plan, monkeypatch)
    made = gpu.allocations[before:]
    owned = [b for b in plan.buffers if b.kind != "input"]
    by_buffer = {}
    for b in owned:
        allocs = {id(_allocation_of(env[t])) for t in b.tensors}
        assert len(allocs) == 1, f"buffer {b.id}: its tensors {b.tensors} are not views of one allocation"
        a = _allocation_of(env[b.tensors[0]])
        want = max(int(np.prod(types[t].shape)) * types[t].dtype.itemsize for t in b.tensors)
        assert want == plan_nbytes(types[b.tensors[0]])  # the plan's size (its first tensor's)
        if isinstance(b.nbytes, int):
            assert want == b.nbytes
        assert a.nbytes in (want, max(want, 1)), (b.id, a.nbytes, want)
        assert any(m is a for _, m in made), f"buffer {b.id} was not allocated by this run"
        by_buffer[b.id] = a
    assert len({id(a) for a in by_buffer.values()}) == len(owned)  # one allocation per buffer
    # outputs: fresh memory, never an intermediate's
    inter = [a for bid, a in by_buffer.items() if plan.buffers[bid].kind == "intermediate"]
    for name, v in outs.items():
        assert not any(np.shares_memory(v, a) for a in inter), name
    return plan, made


@pytest.mark.parametrize("case", all_cases(), ids=[c[0] for c in all_cases()])
def test_corpus_runs_allocate_the_plans_buffers(case, gpu, monkeypatch):
    name, g, _ = case
    f = Fusion.from_json(g)
    ins = case_inputs(case)
    if "sort" in name or "topk" in name or "radix" in name:
        pytest.skip("the stand-in runs no library sorts")
    rt = gpu.runtime()
    _check_allocations(gpu, rt, f, ins, monkeypatch)
    got, _ = rt.run(f, _dev(ins), PLANS.plan(f, {k: np.shape(v) for k, v in ins.items()}))
    want = run_graph(f, copy.deepcopy(ins))
    for k, w in want.items():
        g = _host(got[k], w)
        if from_numpy(w.dtype).is_float:  # (the same NumPy references: equal up to rounding)
            g, w = g.astype(np.float64), w.astype(np.float64)
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=0, equal_nan=True, err_msg=f"{name}: {k}")


@pytest.mark.parametrize("reuse_bytes", [0, 1 << 20])
def test_a_reused_buffer_is_one_allocation_and_results_stay_right(gpu, monkeypatch, reuse_bytes):
    from segfuse.compiler.cuda import buffers

    monkeypatch.setattr(buffers, "_REUSE_BYTES", reuse_bytes)  # 0: every buffer per run, from the pool
    f, ins = scan_chain()
    rt = gpu.runtime()
    plan, made = _check_allocations(gpu, rt, f, ins, monkeypatch)
    tb = plan.tensor_buffer
    assert tb["c"] == tb["a"] and plan.buffers[tb["a"]].kind == "intermediate"  # the reuse is real
    assert tb["b"] != tb["a"] and plan.buffers[tb["b"]].kind == "intermediate"
    want = run_graph(f, copy.deepcopy(ins))
    for _ in range(3):  # the later runs reuse the same buffers (big ones: the pool's)
        got, _ = rt.run(f, _dev(ins), plan)
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])


def test_small_intermediates_are_allocated_once_per_thread_and_outputs_per_run(gpu, monkeypatch):
    f, ins = scan_chain()
    rt = gpu.runtime()
    plan = PLANS.plan(f, {"x": (BIG_N,)})
    inter = [b for b in plan.buffers if b.kind == "intermediate"]
    assert len(inter) >= 2 and any(len(b.tensors) > 1 for b in inter)
    want = run_graph(f, copy.deepcopy(ins))
    kept, n_allocs = [], []
    for _ in range(4):
        before = len(gpu.allocations)
        got, _ = rt.run(f, _dev(ins), plan)
        n_allocs.append(len(gpu.allocations) - before)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])
        kept.append(got)  # held: the next run's outputs must be new memory
    # held outputs are never handed out again; the intermediates were allocated once
    outs = [a for g in kept for a in g.values()]
    assert len({a.ctypes.data for a in outs}) == len(outs)
    assert n_allocs[1] == n_allocs[2] == n_allocs[3] < n_allocs[0]
    dropped = []
    for _ in range(3):  # results dropped at once: the small outputs' buffers come back
        before = len(gpu.allocations)
        got, _ = rt.run(f, _dev(ins), plan)
        dropped.append(len(gpu.allocations) - before)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name])
        del got
    assert dropped[-1] < n_allocs[1]


@pytest.mark.parametrize("deferred", [False, True])
def test_fast_path_and_graph_replays_reuse_buffers_correctly(gpu, monkeypatch, deferred):
    f, ins = scan_chain()
    rt = gpu.runtime()
    plan = PLANS.plan(f, {"x": (BIG_N,)})
    dev = _dev(ins)
    call = rt.prepared_call(f, dev, plan, deferred=deferred)
    rng = np.random.default_rng(3)
    for k in range(6):
        dev["x"][...] = rng.integers(-3, 4, BIG_N).astype(np.float32)  # same input buffer, new data
        want = run_graph(f, {"x": np.array(dev["x"])})
        got = call(dev)
        for name in want:
            np.testing.assert_array_equal(np.array(got[name]), want[name], err_msg=f"run {k}: {name}")
        del got
    if all(s.launches_only for s in rt.prepared_for(f, dev).steps):
        assert rt.graph_captures >= 1  # the later runs replayed a graph on the same buffers


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(graphs(), st.integers(0, 2**16))
def test_random_plans_on_the_cuda_path_match_run_graph(gpu, case, seed):
    assume(not any(o["op"] == "argsort" for o in case[0]["ops"]))  # (library sorts: the GPU suite)
    found = runnable(case, seed)
    if found is None:
        return
    f, ins, want = found
    rt = gpu.runtime()
    plan = PLANS.plan(f, {k: np.shape(v) for k, v in ins.items()})
    for _ in range(2):  # the second run on the buffers the first left
        dev = _dev(ins)
        got, _ = rt.run(f, dev, plan)
        for k in want:
            np.testing.assert_array_equal(np.array(got[k]), want[k], err_msg=f"output {k}")
        for o in f.outputs:
            if o.alias_of:
                np.testing.assert_array_equal(np.array(dev[o.alias_of]), want[o.name])


def _kept_keys(st) -> set:
    """The owner tokens under which a thread state keeps something (parameter blocks, run contexts,
    reusable buffers); the radix sort's launch state is keyed by a string and kept for good."""
    return {k for k in st.params if not isinstance(k, str)} | {k[0] for k in st.buffers if isinstance(k, tuple)}


def test_thread_state_keeps_nothing_of_evicted_entries_or_dropped_calls(gpu, monkeypatch):
    """Per-thread memory is bounded: what a prepared entry's steps keep in a thread's state
    (parameter blocks, cached intermediates, small outputs) goes once the LRU evicts the entry and
    nobody holds it, and a fast-path call's context (its CUDA graphs) once the caller drops it."""
    import gc

    from segfuse.compiler.cuda import runtime as rtmod

    monkeypatch.setattr(rtmod, "PREPARED_ENTRIES", 3)
    f, _ = scan_chain(dtype="int64")
    rt = gpu.runtime()
    sizes = [40 + 7 * i for i in range(12)]  # 12 shape classes through a 3-entry LRU
    calls = {}
    for i, n in enumerate(sizes):
        _, ins = scan_chain(n, "int64")
        plan = PLANS.plan(f, {"x": (n,)})
        want = run_graph(f, copy.deepcopy(ins))
        got, _ = rt.run(f, _dev(ins), plan)
        call = rt.prepared_call(f, _dev(ins), plan)
        got2 = call(_dev(ins))
        for name in want:
            np.testing.assert_array_equal(np.array(got[name]), want[name])
            np.testing.assert_array_equal(np.array(got2[name]), want[name])
        del got, got2
        if i >= len(sizes) - 2:
            calls[n] = call  # the caller keeps the last two calls
        del call
    gc.collect()
    st = rt._thread_state()
    live = {t for prep in rt._prepared.values() for t in prep.tokens}
    kept = _kept_keys(st)
    assert kept, "the runs kept nothing per thread (the test would prove nothing)"
    held = kept - live  # tokens of the calls the caller still holds (and of their entries)
    assert len(rt._prepared) == 3
    assert len(held) <= 2, f"{len(held)} owners' entries outlived them"
    for n, call in calls.items():  # the calls held still run, on their kept state
        _, ins = scan_chain(n, "int64")
        want = run_graph(f, copy.deepcopy(ins))
        got = call(_dev(ins))
        for name in want:
            np.testing.assert_array_equal(np.array(got[name]), want[name])
    del call
    calls.clear()
    gc.collect()
    assert _kept_keys(st) <= live  # dropped calls took their contexts with them
