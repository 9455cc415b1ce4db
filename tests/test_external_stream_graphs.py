"""Runs on a caller's stream (segfuse.torch's CUDA path: the CUDA backend's `external_streams()`)
replay a CUDA graph of a kernels-only plan's launches when a call binds the same parameter bytes
as an earlier one (the caller's allocator handed out the same memory again, as torch's caching
allocator does for a call repeated on one stream); never while the caller captures a graph of its
own, and a call on other memory launches directly. Without a GPU: the stand-in of
tests/standin_kernels.py runs the runtime's real preparation and binding, its "kernels" evaluate
their segment with NumPy on the memory they were handed, and its streams record launches while
capturing. Results are checked against the NumPy interpreter (`run_graph`)."""

from __future__ import annotations

import numpy as np
import pytest
from cupy_standin import Array
from segfuse.compiler import Engine, Fusion, run_graph
from segfuse.compiler.cuda import arrays
from segfuse.compiler.cuda.external_stream import ExternalStreams, StreamState, _NoReuse
from segfuse.compiler.segmenter.capability import DEFAULT_CAPABILITY
from standin_kernels import StandinGPU, Stream

GRAPH = {"format": "segfuse.fusion/1", "name": "two_kernels",
         "inputs": [{"name": "x", "dtype": "float32", "shape": ["N"]}],
         "ops": [{"op": "cumsum", "out": "y", "inputs": ["x"], "dim": 0},
                 {"op": "cumsum", "out": "z", "inputs": ["y"], "dim": 0},
                 {"op": "add", "out": "w", "inputs": ["z", "y"]}],
         "outputs": ["w"]}
N = DEFAULT_CAPABILITY.single_block_max_elems + 517  # multi-block scans: one kernel each


class _SameMemory:
    """CuPy's `empty` as a caching allocator serving one call at a time: the k-th allocation of a
    call gets the same memory as the k-th of the call before."""

    def __init__(self, gpu):
        self.real, self.made, self.k = gpu.cp.empty, [], 0
        gpu.cp.empty = self

    def __call__(self, shape, dtype=np.float64):
        if self.k == len(self.made):
            self.made.append(self.real(shape, dtype))
        a = self.made[self.k]
        self.k += 1
        assert a.shape == (tuple(shape) if not isinstance(shape, int) else (shape,)) and a.dtype == np.dtype(dtype)
        return a

    def new_call(self):
        self.k = 0


@pytest.fixture
def setup(monkeypatch):
    gpu = StandinGPU()
    gpu.record_generate(monkeypatch)
    monkeypatch.setattr(arrays, "_ND", [Array])
    mem = _SameMemory(gpu)
    rt = gpu.runtime()
    f = Fusion.from_json(GRAPH)
    plan = Engine("numpy").plan(f, {"x": (N,)})
    prep = rt.prepare(f, {"x": (N,)}, {"x": f.inputs[0][1].dtype}, {"x": (1,)}, plan)
    ext = ExternalStreams.__new__(ExternalStreams)
    ext.rt = rt
    st = StreamState.__new__(StreamState)
    st.cp, st.params, st.buffers, st.ctxs, st.err_ptr, st.capture_stream = gpu.cp, {}, _NoReuse(), {}, 0, None
    st.ctr = gpu.cp.zeros(16, np.uint32)
    st.ctr_ptr = st.ctr.data.ptr
    st.bind(Stream())
    return gpu, mem, rt, f, prep, ext.launcher(prep), st


def _call(mem, launch, st, x, capturing=False):
    mem.new_call()
    env = {"x": x}
    launch(env, st, 0x1000, capturing)
    return np.array(env["w"])


def test_a_repeated_call_on_the_same_memory_replays_one_graph(setup):
    gpu, mem, rt, f, prep, launch, st = setup
    assert len(prep.steps) >= 2 and all(s.kind == "kernel" for s in prep.steps)
    x = np.zeros(N, np.float32).view(Array)
    rng = np.random.default_rng(3)
    launches = []
    for _call_index in range(4):  # the same input memory, new values each call
        x[:] = rng.integers(-4, 5, N)
        before = gpu.launches
        got = _call(mem, launch, st, x)
        launches.append(gpu.launches - before)
        np.testing.assert_allclose(got, run_graph(f, {"x": np.array(x)})["w"], rtol=1e-6)
    # the first call launches, the second captures (its launches recorded) and replays, later
    # calls replay the graph: no launch of their own
    assert launches[0] == launches[1] > 0 and launches[2:] == [0, 0]
    assert rt.graph_captures == 1


def test_calls_on_other_memory_or_inside_a_callers_capture_launch_directly(setup):
    gpu, mem, rt, f, prep, launch, st = setup
    x = (np.arange(N, dtype=np.float32) % 7 - 3).view(Array)
    for _ in range(2):
        _call(mem, launch, st, x)  # (a graph for x's memory)
    assert rt.graph_captures == 1
    other = (np.arange(N, dtype=np.float32) % 5 - 2).view(Array)  # another input pointer
    before = gpu.launches
    got = _call(mem, launch, st, other)
    assert gpu.launches > before and rt.graph_captures == 1
    np.testing.assert_allclose(got, run_graph(f, {"x": np.array(other)})["w"], rtol=1e-6)
    before = gpu.launches
    got = _call(mem, launch, st, x, capturing=True)  # the caller's capture records our launches
    assert gpu.launches > before and rt.graph_captures == 1
    np.testing.assert_allclose(got, run_graph(f, {"x": np.array(x)})["w"], rtol=1e-6)
