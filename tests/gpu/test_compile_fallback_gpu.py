"""A kernel that does not compile on the GPU (issue 15, item 2): the run falls back (the segment
split per anchor, then a CuPy routine or the host) and its results agree with PyTorch; the
prepared entry lists the fallbacks; a server answers 200 and counts them in
segfuse_compile_fallbacks_total; with no compiler at all the error is one line. Compile failures
are injected into the kernel cache (generated modules only: sf_k_<hash>)."""

from __future__ import annotations

import re

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
torch = pytest.importorskip("torch")

from helpers.graphs import topk_scatter  # noqa: E402
from helpers.torch_oracle import check_same, to_torch, topk_scatter_in_torch  # noqa: E402
from segfuse.compiler.cuda import prepare  # noqa: E402
from segfuse.compiler.cuda.nvrtc import CompileError  # noqa: E402
from segfuse.compiler.cuda.runtime import get_runtime  # noqa: E402
from segfuse.compiler.ir import Fusion  # noqa: E402

from .planned_runtime import PlannedRuntime  # noqa: E402

pytestmark = pytest.mark.gpu
GENERATED = re.compile(r"sf_k_[0-9a-f]{16}_0")


def failing_get(real, fails):
    """The kernel cache's get, failing the generated sources `fails(source, n)` picks (n: the
    how-many-th generated source asked for)."""
    asked = []

    def get(source, *options):
        if GENERATED.search(source):
            asked.append(source)
            if fails(source, len(asked)):
                raise CompileError("NVRTC compilation failed", 'segfuse.cu(1): error: injected failure', source)
        return real(source, *options)

    return get


class FailingCache:
    """The process's kernel cache, but for the generated sources `fails` picks."""

    def __init__(self, real, fails):
        self.real, self.get = real, failing_get(real.get, fails)

    def __getattr__(self, name):
        return getattr(self.real, name)


def data(cols, seed=0):
    rng = np.random.default_rng(seed)
    return {"x": rng.integers(-3, 4, (128, cols)).astype(np.float32),  # ties: the stable order decides
            "d": rng.standard_normal((128, cols)).astype(np.float32)}


@pytest.mark.parametrize("cols", [64, 1024])
@pytest.mark.parametrize("which", ["first", "all"])
def test_runs_agree_with_torch_when_kernels_do_not_compile(cols, which):
    fails = (lambda s, n: n == 1) if which == "first" else (lambda s, n: True)
    rt = PlannedRuntime(cache=FailingCache(get_runtime().cache, fails))  # its own prepared entries
    f = Fusion.from_json({**topk_scatter(cols), "name": f"fallback_{which}_{cols}"})
    ins = data(cols)
    before = sum(prepare.compile_fallbacks().values())
    outs, info = rt.run(f, {k: v.copy() for k, v in ins.items()})
    want_o, want_v = topk_scatter_in_torch(to_torch(ins["x"]), to_torch(ins["d"]))
    check_same(cp.asnumpy(outs["o"]), want_o, "o")
    check_same(cp.asnumpy(outs["v"]), want_v, "v")
    assert any("does not compile" in w for w in info["fallbacks"]), info["fallbacks"]
    assert sum(prepare.compile_fallbacks().values()) > before
    outs, _ = rt.run(f, {k: v.copy() for k, v in ins.items()})  # the prepared entry again
    check_same(cp.asnumpy(outs["o"]), want_o, "o (warm)")


@pytest.mark.anyio
async def test_the_server_answers_200_and_counts_the_fallback(asgi_server, monkeypatch):
    cache = get_runtime().cache
    monkeypatch.setattr(cache, "get", failing_get(cache.get, lambda s, n: True))
    graph = {**topk_scatter(1024), "name": "fallback_server"}
    ins = data(1024, seed=1)
    async with asgi_server(backend="cupy") as c:
        assert (await c.post("/v2/fusions", json=graph)).status_code in (200, 201)
        r = await c.post("/v2/models/fallback_server/infer", json={"inputs": [
            {"name": k, "shape": list(v.shape), "datatype": "FP32", "data": v.ravel().tolist()} for k, v in ins.items()]})
        assert r.status_code == 200, r.text
        got = {o["name"]: np.array(o["data"], np.float32).reshape(o["shape"]) for o in r.json()["outputs"]}
        want_o, want_v = topk_scatter_in_torch(to_torch(ins["x"]), to_torch(ins["d"]))
        check_same(got["o"], want_o, "o")
        text = (await c.get("/metrics")).text
        assert re.search(r'segfuse_compile_fallbacks_total\{lowering="split"\} [1-9]', text), text


@pytest.mark.anyio
async def test_without_a_compiler_the_error_is_one_line(asgi_server, monkeypatch):
    def no_compiler(source):
        raise CompileError("no CUDA compiler: install the 'nvrtc' extra (cuda-bindings)")

    cache = get_runtime().cache
    real = cache.get
    monkeypatch.setattr(cache, "get", lambda s, *o: no_compiler(s) if GENERATED.search(s) else real(s, *o))
    graph = {**topk_scatter(1024), "name": "fallback_none"}
    ins = data(1024, seed=2)
    async with asgi_server(backend="cupy") as c:
        await c.post("/v2/fusions", json=graph)
        r = await c.post("/v2/models/fallback_none/infer", json={"inputs": [
            {"name": k, "shape": list(v.shape), "datatype": "FP32", "data": v.ravel().tolist()} for k, v in ins.items()]})
        assert r.status_code >= 400
        msg = r.json()["error"]
        assert "no lowering compiles" in msg and "\n" not in msg, msg
