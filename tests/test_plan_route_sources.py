"""The plan route's CUDA sources are the modules a run compiles (issue 14): `GET /v2/fusions/{id}/plan`
asks the engine (`Engine.kernel_modules`) instead of running the code generator itself, so the
aliases, strides and splits of a real run's preparation are in what it shows.

The oracle is a run's own preparation on a CupyRuntime without a device: NumPy stands in for CuPy
and a kernel cache records every source the preparation compiles (the first two steps of
`CupyRuntime.run`: upload the inputs, prepare the cached plan at their shapes, dtypes and strides).
The GPU suite compiles and runs the same modules for real."""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from segfuse.compiler import Engine, Fusion
from segfuse.compiler.codegen.segment import NOMINAL_SM_COUNT, generate
from segfuse.compiler.cuda import radix_sort, runtime
from segfuse.compiler.cuda.arrays import to_device

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[1]

CASES = [  # example graph, symbol sizes, inputs of those sizes
    ("scatter_add", "M=64,N=1000", lambda r: {"dst": r.random(64, np.float32), "index": r.integers(0, 64, 1000),
                                             "src": r.random(1000, np.float32)}),
    ("moe_problem_sizes", "T=4096,K=8", lambda r: {"topk_ids": r.integers(0, 16, (4096, 8))}),
    ("moe_argsort", "T=4096", lambda r: {"topk_ids": r.integers(0, 16, (4096, 4))}),
    ("elementwise_chain", "N=100000", lambda r: {k: r.random(100000, np.float32) for k in "abc"}),
]


class _RecordingCache:
    """A kernel cache that compiles nothing: it records each source and hands out stub kernels."""

    def __init__(self):
        self.sources: list[str] = []
        self.stats = SimpleNamespace(compile_s=0.0, misses=0)

    def get(self, source, codegen=None):
        self.sources.append(source)
        return SimpleNamespace(get_function=lambda name: SimpleNamespace(kernel=SimpleNamespace(ptr=0)))


def _deviceless_runtime():
    rt = runtime.CupyRuntime.__new__(runtime.CupyRuntime)
    rt._prepared, rt._plock = OrderedDict(), threading.Lock()
    rt.cp = SimpleNamespace(ndarray=np.ndarray, asarray=np.asarray, empty=np.empty,
                            cuda=SimpleNamespace(driver=SimpleNamespace(launchKernel=None)))
    rt.sm_count, rt.cache = NOMINAL_SM_COUNT, _RecordingCache()
    return rt


def _run_compiles(fusion: Fusion, inputs: dict, plan) -> list[str]:
    """The sources a CupyRuntime run of `inputs` compiles (NumPy standing in for CuPy)."""
    rt = _deviceless_runtime()
    shapes, dtypes, strides, _ = to_device(rt.cp, fusion, inputs)  # as CupyRuntime.run does
    rt.prepare(fusion, shapes, dtypes, strides, plan)
    return rt.cache.sources


def _example(name) -> dict:
    return json.loads((ROOT / "examples" / f"{name}.json").read_text())


@pytest.mark.parametrize("name, shape, make", CASES, ids=[c[0] for c in CASES])
async def test_the_plan_route_shows_the_sources_a_run_compiles(asgi_server, monkeypatch, name, shape, make):
    monkeypatch.setattr(radix_sort, "prepare", lambda dtype, epilogue=None: None)  # (the fused sort's own kernel)
    graph = _example(name)
    async with asgi_server() as c:
        fid = (await c.post("/v2/fusions", json=graph)).json()["id"]
        r = await c.get(f"/v2/fusions/{fid}/plan", params={"shape": shape})
    assert r.status_code == 200, r.text
    shown = [k["source"] for k in r.json()["kernels"] if k["source"]]
    fusion = Fusion.from_json(graph)
    inputs = make(np.random.default_rng(0))
    plan = Engine("numpy").plan(fusion, {k: v.shape for k, v in inputs.items()})
    compiled = _run_compiles(fusion, inputs, plan)
    assert "\n".join(shown) == "\n".join(compiled)
    assert len(compiled) == sum(k["source"] is not None for k in r.json()["kernels"])  # one module a segment here
    assert name == "moe_argsort" or compiled  # (the MoE argsort is one fused library sort: no module)


def test_a_run_in_place_compiles_other_sources_than_the_plain_code_generator():
    """Why the route asks the engine: the in-place scatter of examples/scatter_add.json writes into
    its (staged) input, so a run compiles no init kernel; the code generator called on the segment
    alone, as the route did before, emits one (three kernels, not two)."""
    fusion = Fusion.from_json(_example("scatter_add"))
    inputs = CASES[0][2](np.random.default_rng(0))
    eng = Engine("numpy")
    shapes = {k: v.shape for k, v in inputs.items()}
    plan = eng.plan(fusion, shapes)
    (seg_id, module), = eng.kernel_modules(fusion, shapes)
    assert _run_compiles(fusion, inputs, plan) == [module.source]
    plain = generate(fusion, plan.segments[seg_id], fusion.bind(shapes).types)
    assert plain.source != module.source and len(plain.launches) == len(module.launches) + 1


def test_the_cupy_engine_answers_with_the_modules_its_runtime_prepared(monkeypatch):
    """On a GPU server the modules come from the runtime's prepared entry (compiled as warmup
    does): the entry a run of contiguous inputs then finds, so the route compiled what runs."""
    from segfuse.compiler.cuda import backend

    rt = _deviceless_runtime()
    monkeypatch.setattr(backend, "get_runtime", lambda: rt)
    fusion = Fusion.from_json(_example("scatter_add"))
    inputs = CASES[0][2](np.random.default_rng(0))
    shapes = {k: v.shape for k, v in inputs.items()}
    eng = Engine(backend.CupyBackend())
    plan = eng.plan(fusion, shapes)
    modules = eng.kernel_modules(fusion, shapes, plan)
    assert [m.source for _, m in modules] == rt.cache.sources == _run_compiles(fusion, inputs, plan)
    shapes_, dtypes, strides, _ = to_device(rt.cp, fusion, inputs)
    before = len(rt.cache.sources)
    assert rt.prepare(fusion, shapes_, dtypes, strides, plan).modules == modules  # the run's entry
    assert len(rt.cache.sources) == before  # found, not prepared again
