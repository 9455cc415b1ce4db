"""The Engine and its backends (compiler/backend.py): a backend is a class behind one interface,
found by name in the engine's registry ("auto" resolved there, below the server), and the Engine
hands it the plan of its own cache. Results are checked against the op-by-op NumPy interpreter
(`run_graph`)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from segfuse.compiler import Fusion, run_graph
from segfuse.compiler import engine as engine_mod
from segfuse.compiler.backend import Backend
from segfuse.compiler.engine import Engine, backend_unavailable, compile_fallbacks, resolve_backend
from segfuse.compiler.numpy_backend import NumpyBackend

GRAPH = {"format": "segfuse.fusion/1", "name": "affine",
         "inputs": [{"name": "x", "dtype": "float32", "shape": ["N"]}],
         "ops": [{"op": "mul", "out": "y", "inputs": ["x", 3.0]}, {"op": "add", "out": "z", "inputs": ["y", 1.0]}],
         "outputs": ["z"]}
NO_GPU = backend_unavailable("cupy") is not None


class _Recording(NumpyBackend):
    """The NumPy backend, recording the plans and error modes it is handed."""

    name = "recording"

    def __init__(self):
        self.ran = []

    def run(self, plan, fusion, bound, inputs, deferred=False):
        self.ran.append((plan, deferred))
        return super().run(plan, fusion, bound, inputs, deferred)


def test_an_engine_runs_its_cached_plan_on_the_backend_it_holds():
    backend = _Recording()
    eng = Engine(backend, errors="deferred")
    assert eng.device_backend is backend and eng.backend == "recording" and eng.device == "cpu"
    f = Fusion.from_json(GRAPH)
    x = np.arange(5, dtype=np.float32)
    first, second = eng.run(f, {"x": x}), eng.run(f, {"x": x})
    np.testing.assert_array_equal(second.outputs["z"], run_graph(f, {"x": x})["z"])
    assert (first.cache_misses, second.cache_hits) == (1, 1)
    plan = eng.plan(f, {"x": (5,)})
    assert backend.ran == [(plan, True), (plan, True)]  # the cache's plan, in the engine's error mode


def test_the_numpy_backend_is_the_processes_one_and_compiles_nothing():
    eng = Engine("numpy")
    assert isinstance(eng.device_backend, Backend) and eng.device_backend is Engine("numpy").device_backend
    assert not eng.compiles and eng.prepared(Fusion.from_json(GRAPH), {"x": np.zeros(3, np.float32)}) is None
    with pytest.raises(NotImplementedError):
        eng.kernel_time_us(Fusion.from_json(GRAPH), {"x": np.zeros(3, np.float32)})


def test_names_resolve_in_the_engines_registry():
    with pytest.raises(ValueError, match="unknown backend 'tpu' \\(available: cupy, numpy\\)"):
        Engine("tpu")
    assert resolve_backend("numpy") == "numpy"
    assert resolve_backend("auto") == ("numpy" if NO_GPU else "cupy")
    assert Engine("auto").backend == resolve_backend("auto")
    if NO_GPU:
        with pytest.raises(ValueError, match="cupy backend is not available here"):
            Engine("cupy")


def test_compile_fallbacks_are_summed_over_the_backends(monkeypatch):
    class _Fails(NumpyBackend):
        name = "fails"

        @classmethod
        def compile_fallbacks(cls):
            return {"host": 2, "split": 1}

    before = compile_fallbacks()
    monkeypatch.setitem(engine_mod.BACKEND_CLASSES, "fails", lambda: _Fails)
    after = compile_fallbacks()
    assert after == {k: before.get(k, 0) + {"host": 2, "split": 1}.get(k, 0) for k in set(before) | {"host", "split"}}


def test_the_cli_resolves_auto_without_the_server():
    """`segfuse warmup --backend auto` picks its engine from the compiler's registry: the server
    package is not imported for it."""
    code = ("import sys; from segfuse.cli.client_cmds import _engine; e = _engine('auto'); "
            "print(e.backend, sorted({m for m in sys.modules if m.startswith('segfuse.server')}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == [resolve_backend("auto"), "[]"]


def test_an_engines_codegen_options_reach_the_kernels_it_generates():
    """Options given to the Engine reach the code generator (row loads without evict-last hints
    here); the defaults keep the process's shared backend, other options get a backend of their own."""
    from norm_graphs import norm_graph
    from segfuse.compiler import CodegenOptions

    fusion = norm_graph("rmsnorm")
    shapes = {n: (32768, 4096) if n == "x" else (4096,) for n in fusion.input_names}
    default = Engine("numpy")
    plain = Engine("numpy", options=CodegenOptions(row_load_hints=False))
    assert Engine("numpy", options=CodegenOptions()).device_backend is default.device_backend
    assert plain.device_backend is not default.device_backend
    (_, hinted), = default.kernel_modules(fusion, shapes)
    (_, unhinted), = plain.kernel_modules(fusion, shapes)
    assert "evict_last" in hinted.source and "evict_last" not in unhinted.source
    assert unhinted.options == CodegenOptions(row_load_hints=False)


def test_options_for_a_backend_instance_go_to_the_instance():
    from segfuse.compiler import CodegenOptions
    from segfuse.compiler.numpy_backend import NumpyBackend

    with pytest.raises(ValueError, match="Backend instance"):
        Engine(NumpyBackend(), options=CodegenOptions(row_load_hints=False))
    assert Engine(NumpyBackend(CodegenOptions(row_load_hints=False))).device_backend.options.row_load_hints is False
