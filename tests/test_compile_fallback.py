"""A generated kernel that does not compile is never a failed run (issue 15, item 2): the CUDA
preparation (compiler/cuda/prepare.py) splits its segment per anchor, as for a segment the codegen
refuses; a piece that still does not compile runs as a CuPy routine or on the host. Each fallback is
recorded in the prepared entry and in the process's count (the server's segfuse_compile_fallbacks
metric), the source is logged once, and only where no lowering exists does preparing fail, with one
line. No GPU: compiles are injected to fail, NumPy stands in for CuPy, PyTorch is the oracle."""

from __future__ import annotations

import logging
import types

import numpy as np
import pytest
from helpers.graphs import topk_scatter
from helpers.torch_oracle import check_same, to_torch, topk_scatter_in_torch
from segfuse.compiler.codegen.options import CodegenOptions
from segfuse.compiler.cuda import prepare
from segfuse.compiler.cuda.arrays import contiguous_strides
from segfuse.compiler.cuda.nvrtc import CompileError
from segfuse.compiler.engine import Engine
from segfuse.compiler.ir import Fusion
from standin_kernels import Stream

TOPK_SCATTER = topk_scatter(64)


class NumpyCupy:
    """NumPy as CuPy for host and library steps: stable argsort (as CuPy's), asnumpy with a stream."""

    cuda = types.SimpleNamespace(driver=types.SimpleNamespace(launchKernel=None))

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def argsort(x, axis=-1):
        return np.argsort(x, axis=axis, kind="stable")

    @staticmethod
    def asnumpy(a, stream=None):
        return np.asarray(a)


class FakeFunction:
    kernel = types.SimpleNamespace(ptr=0)
    max_dynamic_shared_size_bytes = 0


class FakeCache:
    """The kernel cache's interface: `fails(source)` decides which sources do not compile."""

    def __init__(self, fails):
        self.fails, self.asked = fails, []
        self.stats = types.SimpleNamespace(compile_s=0.0)

    def get(self, source, codegen=None):
        self.asked.append(source)
        if self.fails(source, len(self.asked)):
            raise CompileError("NVRTC compilation failed", 'segfuse.cu(9): error: identifier "v0" is undefined',
                               source)
        return types.SimpleNamespace(get_function=lambda name: FakeFunction())


def runtime(fails):
    return types.SimpleNamespace(cp=NumpyCupy(), sm_count=132, cache=FakeCache(fails), options=CodegenOptions())


def prepared(rt, graph=TOPK_SCATTER):
    f = Fusion.from_json(graph)
    shapes = {i["name"]: tuple(i["shape"]) for i in graph["inputs"]}
    bound = f.bind(shapes)
    plan = Engine().plan(f, shapes)
    return f, prepare.prepare_plan(rt, f, plan, bound, {n: contiguous_strides(s) for n, s in shapes.items()})


@pytest.mark.parametrize("cols", [64, 1024])
def test_no_kernel_compiles_so_every_piece_runs_on_the_host_and_agrees_with_torch(cols):
    before = prepare.compile_fallbacks()
    rt = runtime(lambda src, n: True)
    f, prep = prepared(rt, topk_scatter(cols))
    assert len(prep.plan.segments) == (1 if cols == 64 else 2)
    assert prep.kernels == 0 and prep.modules == []  # nothing compiled, nothing counted as launched
    assert any("split into" in w and "does not compile" in w for w in prep.fallbacks), prep.fallbacks
    assert any(": host (" in w or ": library (" in w for w in prep.fallbacks), prep.fallbacks
    after = prepare.compile_fallbacks()
    assert after.get("split", 0) > before.get("split", 0)
    assert sum(after.values()) - sum(before.values()) >= 3  # the split, then each piece
    rng = np.random.default_rng(0)
    x = rng.integers(-3, 4, (128, cols)).astype(np.float32)  # ties: the stable order decides
    d = rng.standard_normal((128, cols)).astype(np.float32)
    env = {"x": x, "d": d.copy()}
    ctx = types.SimpleNamespace(stream=Stream(), state=types.SimpleNamespace(buffers={}))
    for step in prep.steps:
        step.run(env, ctx)
    want_o, want_v = topk_scatter_in_torch(to_torch(x), to_torch(d))
    check_same(np.asarray(env["o"]), want_o, "o")
    check_same(np.asarray(env["v"]), want_v, "v")
    np.testing.assert_array_equal(env["d"], d)  # the scatter's self, a graph input, is not written


@pytest.mark.parametrize("cols", [64, 1024])
def test_a_segment_whose_kernel_does_not_compile_is_split_into_kernels_that_do(cols):
    rt = runtime(lambda src, n: n == 1)  # only the first module asked for fails
    _, prep = prepared(rt, topk_scatter(cols))
    failed = rt.cache.asked[0]
    assert failed not in [m.source for _, m in prep.modules]  # not counted as compiled
    assert all(m.source in rt.cache.asked[1:] for _, m in prep.modules)
    kinds = [s.kind for s in prep.steps]
    assert "split" in kinds and prep.kernels >= 2
    (why,) = [w for w in prep.fallbacks if "split into" in w]
    assert "does not compile" in why and 'identifier "v0" is undefined' in why


def test_the_failing_source_is_logged_once(caplog):
    src = {}

    def fails(source, n):
        src.setdefault("first", source)
        return source == src["first"]

    with caplog.at_level(logging.WARNING, logger="segfuse.compiler"):
        prepared(runtime(fails))
        prepared(runtime(fails))  # a second preparation of the same failing kernel
    logged = [r for r in caplog.records if "does not compile" in r.getMessage()]
    assert len(logged) <= 1
    assert not logged or src["first"] in logged[0].getMessage()


def test_without_any_compiler_preparing_fails_with_one_line():
    rt = runtime(lambda src, n: True)

    def no_compiler(source, codegen=None):
        raise CompileError("no CUDA compiler: install the 'nvrtc' extra (cuda-bindings)")

    rt.cache.get = no_compiler
    with pytest.raises(CompileError) as e:
        prepared(rt)
    assert "\n" not in str(e.value) and "no lowering compiles" in str(e.value)


def test_the_metric_counts_fallbacks_by_lowering():
    from segfuse.server.metrics import Metrics

    prepared(runtime(lambda src, n: True))
    counts = prepare.compile_fallbacks()
    text = Metrics().render().decode()
    for lowering, n in counts.items():
        assert f'segfuse_compile_fallbacks_total{{lowering="{lowering}"}} {float(n)}' in text
