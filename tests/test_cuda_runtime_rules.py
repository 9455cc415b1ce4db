"""Rules of the CUDA runtime that need no GPU, on the CuPy stand-in: the one commit rule every run
path uses (compiler/commit.py through compiler/cuda/arrays.py: commit_outputs), the bounded prepared-entry cache, and that a
warm-up prepares the entry the first run finds (the Engine hands it its cached plan). The GPU
suite runs the same paths for real (tests/gpu/test_cupy_backend.py, test_fast_path.py)."""

from __future__ import annotations

import contextlib
import threading
import types
from collections import OrderedDict

import numpy as np
import pytest
from cupy_standin import Array
from segfuse.compiler.cuda import arrays, runtime
from segfuse.compiler.engine import Engine
from segfuse.compiler.ir import Fusion
from segfuse.compiler.numpy_backend import NumpyBackend
from segfuse.compiler.plan import Commit

STATE = types.SimpleNamespace(stream=contextlib.nullcontext())


class DeviceArray(Array):
    def get(self):  # CuPy's copy to the host
        return np.array(self)

    def copy(self, order="C"):
        return np.ndarray.copy(self, order).view(type(self))


def dev(values, dtype=np.float32):
    return np.array(values, dtype).view(DeviceArray)


def test_commit_copies_an_input_returned_as_an_output_and_writes_aliases_in_place():
    x, y = dev([1, 2, 3]), dev([4, 5, 6])
    new_x, made = dev([7, 8, 9]), dev([0, 1, 0])
    env = {"x": x, "y": y, "same": y, "upd": new_x, "made": made}
    outputs = (Commit("same", copy=True), Commit("upd", "x"), Commit("made"))
    res = arrays.commit_outputs(outputs, env, {"x": x, "y": y}, STATE, DeviceArray)
    # an output never exposes an input's buffer: a copy with the input's values
    assert res["same"] is not y and not np.shares_memory(res["same"], y)
    np.testing.assert_array_equal(res["same"], [4, 5, 6])
    # alias_of: the input itself is returned, holding the new values
    assert res["upd"] is x
    np.testing.assert_array_equal(x, [7, 8, 9])
    assert res["made"] is made  # a fresh result is returned as it is
    np.testing.assert_array_equal(y, [4, 5, 6])  # an input no output aliases is untouched


def test_commit_updates_a_host_input_through_a_copy():
    host = np.zeros(3, np.float32)
    uploaded = dev(host)
    new = dev([1.5, 2.5, 3.5])
    res = arrays.commit_outputs((Commit("upd", "h"),), {"upd": new}, {"h": host}, STATE, DeviceArray)
    assert uploaded is not new
    np.testing.assert_array_equal(host, [1.5, 2.5, 3.5])
    assert res["upd"] is new  # the device result is returned; the host array was written


GRAPH = {"format": "segfuse.fusion/1", "name": "double",
         "inputs": [{"name": "a", "dtype": "float32", "shape": ["N"]}],
         "ops": [{"op": "mul", "out": "b", "inputs": ["a", 2.0]}], "outputs": ["b"]}


class _Entry(types.SimpleNamespace):
    """A prepared entry's stand-in (the runtime ties its tokens' lifetime to it: weakly referenced)."""

    __slots__ = ("__weakref__",)


def _runtime(monkeypatch, capacity: int):
    """A CupyRuntime without a device whose preparation records what it prepares."""
    made = []

    def prepare_plan(rt, fusion, plan, bound, strides):
        made.append((plan, dict(bound.env)))
        return _Entry(plan=plan, env=dict(bound.env), tokens=[])

    monkeypatch.setattr(runtime, "prepare_plan", prepare_plan)
    monkeypatch.setattr(runtime, "PREPARED_ENTRIES", capacity)
    rt = runtime.CupyRuntime.__new__(runtime.CupyRuntime)
    rt._prepared, rt._plock = OrderedDict(), threading.Lock()
    return rt, made


def _prepare(rt, f, n, plan):
    return rt.prepare(f, {"a": (n,)}, {"a": f.inputs[0][1].dtype}, {"a": (1,)}, plan)


def test_prepared_entries_are_an_lru_of_bounded_size(monkeypatch):
    rt, made = _runtime(monkeypatch, 2)
    f = Fusion.from_json(GRAPH)
    plan = object()
    first = _prepare(rt, f, 4, plan)
    assert _prepare(rt, f, 4, plan) is first and len(made) == 1  # prepared once
    _prepare(rt, f, 5, plan)
    assert _prepare(rt, f, 4, plan) is first  # used again: now the most recent
    _prepare(rt, f, 6, plan)  # over capacity: drops the least recently used (N=5)
    assert len(rt._prepared) == 2 and len(made) == 3
    assert _prepare(rt, f, 4, plan) is first and len(made) == 3
    _prepare(rt, f, 5, plan)
    assert len(made) == 4  # N=5 was dropped, so it is prepared again
    assert [e.env["N"] for e in rt._prepared.values()] == [4, 5]  # least recent first; 6 dropped


def test_warmup_prepares_the_entry_a_run_with_the_same_plan_finds(monkeypatch):
    rt, made = _runtime(monkeypatch, 8)
    f = Fusion.from_json(GRAPH)
    plan = Engine("numpy").plan(f, {"a": (16,)})
    warm = rt.warmup(f, {"a": (16,)}, plan=plan)
    assert warm.plan is plan
    # a run of contiguous inputs of that shape, handed the same plan: the warm entry, no new one
    assert _prepare(rt, f, 16, plan) is warm and len(made) == 1


class _WarmupRecorder(NumpyBackend):
    name = "warmup-recorder"

    def __init__(self):
        self.seen = []

    def warmup(self, plan, fusion, shapes):
        self.seen.append(plan)


def test_engine_warmup_hands_the_backend_its_cached_plan():
    backend = _WarmupRecorder()
    eng = Engine(backend)
    f = Fusion.from_json(GRAPH)
    plan = eng.warmup(f, {"a": (32,)})
    assert backend.seen == [plan] and eng.plan(f, {"a": (32,)}) is plan


def test_the_runtime_runs_only_plans_it_is_handed(monkeypatch):
    """No plan, no preparation: the runtime never plans by itself (the Engine's cache does)."""
    rt, made = _runtime(monkeypatch, 8)
    f = Fusion.from_json(GRAPH)
    with pytest.raises(TypeError):
        rt.prepare(f, {"a": (4,)}, {"a": f.inputs[0][1].dtype}, {"a": (1,)})
    with pytest.raises(TypeError):
        rt.warmup(f, {"a": (4,)})
    assert made == []
