"""A run's memory is bounded before anything is allocated: the plan knows every buffer's size, so a
run whose need (its buffers, scratch, the inputs it moves, the outputs it returns and their JSON
text) passes `max_run_bytes` is refused with 413 and never reaches the engine; a run within it
gives the right result. The estimate is checked against what the NumPy backend really allocates.
The GPU's free-memory check is tests/gpu/test_run_memory_bound_gpu.py."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest
from helpers.graphs import FILL_INPUT as X
from helpers.graphs import FILL_N, fill_graph
from helpers.service import assert_error, count_runs
from segfuse.compiler.engine import Engine
from segfuse.compiler.ir import Fusion
from segfuse.compiler.plan import bytes_needed
from segfuse.compiler.segmenter.cache import PlanCache

pytestmark = pytest.mark.anyio

N = FILL_N  # elements of the run's output


async def test_a_run_needing_more_than_max_run_bytes_is_413_and_never_runs(asgi_server, monkeypatch):
    async with asgi_server() as c:
        rt = c.app.state.server_state
        rt.settings.max_run_bytes = 2 << 20
        runs = count_runs(rt, monkeypatch)
        assert (await c.post("/v2/fusions", json=fill_graph())).status_code == 201
        r = await c.post("/v2/models/fill/infer", json={"inputs": [X]})  # y returned as JSON
        body = assert_error(r, 413, "max_run_bytes", "for outputs", f"limit of {2 << 20} bytes")
        assert "binary data" in body["error"]
        assert runs == []
        # the same run returning y as binary data, or storing it, needs less and fits
        r = await c.post("/v2/models/fill/infer", json={"inputs": [X], "outputs": [
            {"name": "y", "parameters": {"binary_data": True}}]})
        assert r.status_code == 200, r.text
        n = int(r.headers["inference-header-content-length"])
        np.testing.assert_array_equal(np.frombuffer(r.content[n:], np.float32), np.full(N, 3.5, np.float32))
        r = await c.post("/v2/models/fill/infer", json={"inputs": [X], "outputs": [
            {"name": "y", "parameters": {"buffer": "y"}}]})
        assert r.status_code == 200, r.text
        r = await c.get("/v2/buffers/y", headers={"accept": "application/octet-stream"})
        np.testing.assert_array_equal(np.frombuffer(r.content, np.float32), np.full(N, 3.5, np.float32))
        assert len(runs) == 2


async def test_a_refused_run_stores_nothing_and_reserves_nothing(asgi_server):
    async with asgi_server() as c:
        rt = c.app.state.server_state
        rt.settings.max_run_bytes = 64 << 10
        assert (await c.post("/v2/fusions", json=fill_graph())).status_code == 201
        r = await c.post("/v2/models/fill/infer", json={"inputs": [X], "outputs": [
            {"name": "y", "parameters": {"buffer": "y"}}]})
        assert_error(r, 413, "max_run_bytes", '"loc": ["inputs"]')
        assert (await c.get("/v2/buffers")).json()["buffers"] == []
        assert rt.store.reserved_bytes == 0
        assert rt.executor.admitted == 0


async def test_a_small_request_for_a_4_gib_json_output_is_413_before_allocating(asgi_server, monkeypatch):
    """The report's case: about 400 bytes of request asking for 2^30 float32 as JSON (4 GiB of
    data, far more of text) on the default limits."""
    graph = fill_graph(1 << 30, "huge")
    async with asgi_server() as c:
        runs = count_runs(c.app.state.server_state, monkeypatch)
        r = await c.post("/v2/execute", json={"graph": graph, "inputs": [X]})
        assert_error(r, 413, "max_run_bytes", f"limit of {16 << 30} bytes")
        assert runs == []


GRAPHS = {
    "pointwise_and_sum": ({"inputs": [{"name": "x", "dtype": "float32", "shape": ["N"]}],
                           "ops": [{"op": "exp", "out": "a", "inputs": ["x"]}, {"op": "mul", "out": "b", "inputs": ["a", "x"]},
                                   {"op": "add", "out": "c", "inputs": ["b", 1.0]}, {"op": "sum", "out": "s", "inputs": ["c"]}],
                           "outputs": ["c", "s"]}, lambda rng: {"x": rng.random(1 << 20, dtype=np.float32)}),
    "scatter_counts": ({"inputs": [{"name": "ids", "dtype": "int64", "shape": ["T", "K"]}],
                        "ops": [{"op": "reshape", "out": "flat", "inputs": ["ids"], "shape": [-1]},
                                {"op": "full", "out": "zeros", "shape": [16], "value": 0, "dtype": "int64"},
                                {"op": "full_like", "out": "ones", "inputs": ["flat"], "value": 1},
                                {"op": "scatter", "out": "counts", "inputs": ["zeros", "flat", "ones"], "dim": 0,
                                 "reduce": "add"}],
                        "outputs": ["counts"]}, lambda rng: {"ids": rng.integers(0, 16, (1 << 17, 8))}),
    "argsort_gather": ({"inputs": [{"name": "x", "dtype": "float32", "shape": ["N"]}],
                        "ops": [{"op": "argsort", "out": "i", "inputs": ["x"]},
                                {"op": "gather", "out": "g", "inputs": ["x", "i"], "dim": 0}],
                        "outputs": ["g"]}, lambda rng: {"x": rng.random(1 << 20, dtype=np.float32)}),
    "broadcast": ({"inputs": [{"name": "x", "dtype": "float32", "shape": [1]}],
                   "ops": [{"op": "expand", "out": "e", "inputs": ["x"], "shape": [1 << 20]},
                           {"op": "mul", "out": "m", "inputs": ["e", 2.0]}],
                   "outputs": ["m"]}, lambda rng: {"x": np.ones(1, np.float32)}),
}


@pytest.mark.parametrize("name", GRAPHS)
def test_the_estimate_covers_what_the_numpy_backend_allocates(name):
    """tracemalloc (NumPy reports its allocations to it) measures the run's peak: the plan's count
    is at least that (Python's own objects aside) and not wildly more (4x)."""
    spec, make = GRAPHS[name]
    f = Fusion.from_json({"format": "segfuse.fusion/1", "name": name, **spec})
    inputs = make(np.random.default_rng(0))
    shapes = {k: v.shape for k, v in inputs.items()}
    engine = Engine("numpy", plan_cache=PlanCache())
    need = bytes_needed(engine.plan(f, shapes), f.bind(shapes).types, host_arrays=True)
    tracemalloc.start()
    try:
        engine.run(f, inputs)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= need + (256 << 10), (peak, need)
    # not wildly more: the count allows two temporaries of the largest tensor at 8 bytes an element
    # for any op, which a scatter into a small `self` (scatter_counts) no longer makes
    assert need <= 4 * peak, (peak, need)
