"""The plan's buffers on the GPU (compiler/cuda/buffers.py): every corpus graph, and graphs whose
plans reuse buffers (a chain of scans; random graphs of the plan executor's test), run on the real
GPU with reuse on, agree with the NumPy interpreter (`run_graph`); each run's tensors sit in one
device allocation per plan buffer (count, size, 256-byte alignment, views at offset 0), the
tensors the plan puts in one buffer in the same allocation; outputs share no memory with an
intermediate or with a later run's outputs; the fast path and its CUDA-graph replays reuse the
buffers with results still right."""

from __future__ import annotations

import copy

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from corpus import all_cases, case_inputs  # noqa: E402
from helpers.plan_graphs import BIG_N, graphs, runnable, scan_chain, unspecified_write  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from segfuse.compiler import Engine, Fusion, run_graph  # noqa: E402
from segfuse.compiler.cuda import buffers  # noqa: E402
from segfuse.compiler.cuda.runtime import CupyRuntime  # noqa: E402
from segfuse.compiler.dtypes import from_numpy  # noqa: E402

pytestmark = pytest.mark.gpu

CASES = all_cases()
PLANS = Engine("numpy")
TOL = {"float16": 2e-2, "bfloat16": 6e-2, "float32": 2e-5, "float64": 1e-10}


def _host(a, like):
    h = cp.asnumpy(a)
    return h.view(like.dtype) if like.dtype.name == "bfloat16" else h


def _close(got, want, what, loose=False):
    g = _host(got, want)
    assert g.shape == want.shape, what
    if from_numpy(want.dtype).is_float:
        tol = TOL[from_numpy(want.dtype).value] * (20 if loose else 1)
        np.testing.assert_allclose(g.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol,
                                   equal_nan=True, err_msg=what)
    else:
        np.testing.assert_array_equal(g, want, err_msg=what)


_REAL_FILL = buffers.DeviceBuffers.fill
_SEEN: dict = {}  # the env of the last fill (module-level: a prepared entry keeps the fill it was
                  # prepared with, so a later run of a cached entry calls an earlier patch's fill)


def _recording_fill(self, env, ctx):
    _REAL_FILL(self, env, ctx)
    _SEEN.clear()
    _SEEN.update(env)


def _run_seen(rt, f, ins, plan, monkeypatch):
    """One run: its outputs, and its env right after the plan's buffers were put in it."""
    _SEEN.clear()
    monkeypatch.setattr(buffers.DeviceBuffers, "fill", _recording_fill)
    try:
        outs, _ = rt.run(f, dict(ins), plan)
    finally:
        monkeypatch.setattr(buffers.DeviceBuffers, "fill", _REAL_FILL)
    return outs, dict(_SEEN)


def _check_run(rt, f, ins, monkeypatch, what, loose=False):
    shapes = {k: np.shape(v) for k, v in ins.items()}
    plan = PLANS.plan(f, shapes)
    types = dict(f.bind(shapes).types)
    for seg in plan.segments:
        for c in seg.copies:
            types[c.dst] = types[c.src]
    want = run_graph(f, copy.deepcopy(ins))
    outs, env = _run_seen(rt, f, ins, plan, monkeypatch)
    for k, w in want.items():
        _close(outs[k], w, f"{what}: {k}", loose)
    owned = [b for b in plan.buffers if b.kind != "input"]
    mems = {}
    for b in owned:
        ptrs = {env[t].data.mem.ptr for t in b.tensors}
        assert len(ptrs) == 1, f"{what}: buffer {b.id}'s tensors {b.tensors} are in {len(ptrs)} allocations"
        need = max(int(np.prod(types[t].shape)) * types[t].dtype.itemsize for t in b.tensors)
        a = env[b.tensors[0]]
        if need:
            assert a.data.ptr == a.data.mem.ptr and a.data.ptr % buffers.ALIGN == 0, (what, b.id)
            assert a.data.mem.size >= need, (what, b.id, a.data.mem.size, need)
        mems[b.id] = (ptrs.pop(), need)
    sized = [p for p, need in mems.values() if need]
    assert len(set(sized)) == len(sized), f"{what}: two plan buffers in one allocation"
    inter = {p for bid, (p, need) in mems.items() if need and plan.buffers[bid].kind == "intermediate"}
    for k, v in outs.items():
        assert v.size == 0 or v.data.mem.ptr not in inter, f"{what}: output {k} is in an intermediate's buffer"
    return plan, outs


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_corpus_runs_in_the_plans_buffers(case, monkeypatch):
    f = Fusion.from_json(case[1])
    ins = case_inputs(case)
    rt = CupyRuntime()
    _check_run(rt, f, ins, monkeypatch, case[0], loose=case[0].startswith(("sc", "red_")))


@pytest.mark.parametrize("reuse_bytes", [0, 1 << 20])
@pytest.mark.parametrize("n", [BIG_N, 1 << 20])
def test_reused_buffers_on_the_gpu(monkeypatch, reuse_bytes, n):
    monkeypatch.setattr(buffers, "_REUSE_BYTES", reuse_bytes)  # 0: every buffer per run (the pool's)
    f, ins = scan_chain(n, "int64")
    rt = CupyRuntime()
    plan, first = _check_run(rt, f, ins, monkeypatch, "chain", loose=True)
    tb = plan.tensor_buffer
    assert tb["c"] == tb["a"] != tb["b"]  # the plan reuses a's buffer for c
    for _ in range(3):  # later runs: the same buffers again (or the pool's), outputs new
        _, again = _check_run(rt, f, ins, monkeypatch, "chain", loose=True)
        for k, v in again.items():
            assert v.data.ptr != first[k].data.ptr  # the first run's outputs are still held


@pytest.mark.parametrize("deferred", [False, True])
def test_fast_path_and_graph_replays_on_reused_buffers(deferred):
    f, ins = scan_chain(dtype="int64")
    rt = CupyRuntime()
    plan = PLANS.plan(f, {"x": (BIG_N,)})
    dev = {"x": cp.asarray(ins["x"])}
    call = rt.prepared_call(f, dev, plan, deferred=deferred)
    rng = np.random.default_rng(3)
    held = []
    for k in range(8):
        x = rng.integers(-3, 4, BIG_N).astype(np.int64)
        dev["x"][...] = cp.asarray(x)  # the same input buffer, new data
        want = run_graph(f, {"x": x})
        got = call(dev)
        rt.synchronize()
        for name in want:
            _close(got[name], want[name], f"run {k}: {name}", loose=True)
        if k == 5:
            held.append((got, {n: cp.asnumpy(v) for n, v in got.items()}))
        del got
    for got, snap in held:  # a held result is never written by later runs (or graph replays)
        for n, v in got.items():
            np.testing.assert_array_equal(cp.asnumpy(v), snap[n])
    if all(s.launches_only for s in rt.prepared_for(f, dev).steps):
        assert rt.graph_captures >= 1


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(graphs(), st.integers(0, 2**16))
def test_random_plans_with_reuse_on_the_gpu(monkeypatch, case, seed):
    found = None if any(unspecified_write(op) for op in case[0]["ops"]) else runnable(case, seed)
    if found is None:
        return
    f, ins, _ = found
    rt = _RT.setdefault("rt", CupyRuntime())
    for _ in range(2):  # the second run on the buffers the first left
        _check_run(rt, f, ins, monkeypatch, "random")


_RT: dict = {}


