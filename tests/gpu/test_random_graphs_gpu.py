"""The random graphs of tests/test_property_graphs.py (helpers/random_graphs.py) on the GPU, against PyTorch.

CI runs the generator's graphs on the NumPy backend with a fixed seed (and compiles their kernels,
tests/compile_check.py); here every graph runs on `Engine("cupy")` and must agree with the
generator's PyTorch translation, as on the CPU, without a single kernel falling back for not
compiling. Fresh seeds: Hypothesis draws a new one per run; `--hypothesis-seed=N` replays one.
SEGFUSE_RANDOM_GRAPHS sets the examples per configuration (default 200); run with -rP to see how
many graphs each configuration ran.
"""

from __future__ import annotations

import json
import os

import ml_dtypes
import numpy as np
import pytest

cp = pytest.importorskip("cupy")
torch = pytest.importorskip("torch")

from helpers import random_graphs as pg  # noqa: E402
from helpers import reduced_precision as rp  # noqa: E402
from helpers.graphs import one_op  # noqa: E402
from helpers.torch_oracle import to_torch  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from segfuse.compiler import Engine, Fusion, RunError  # noqa: E402
from segfuse.compiler.cuda import prepare  # noqa: E402

pytestmark = pytest.mark.gpu

EXAMPLES = int(os.environ.get("SEGFUSE_RANDOM_GRAPHS", "200"))
FRESH = {**pg.COMMON, "derandomize": False}  # a new seed per run, unless --hypothesis-seed

CONFIGS = pg.CONFIGS  # the CI tests' configurations (tests/test_property_graphs.py)


def host(a, ref) -> np.ndarray:
    h = cp.asnumpy(a)
    return h.view(ml_dtypes.bfloat16) if ref.value.dtype == torch.bfloat16 and h.dtype == np.uint16 else h


def check_gpu(gen, graph: dict, engine: Engine) -> None:
    fusion = Fusion.from_json(graph)
    outs = [o if isinstance(o, str) else o["name"] for o in graph["outputs"]]
    alias = {o["alias_of"]: o["name"] for o in graph["outputs"] if isinstance(o, dict)}
    for _ in range(2):  # cold (prepared here), then warm
        inputs = {k: v.copy() for k, v in gen.arrays.items()}
        if gen.expect_error:
            with pytest.raises(RunError):
                engine.run(fusion, inputs)
            return
        res = engine.run(fusion, inputs).outputs
        assert list(res) == outs
        for k in outs:
            pg.assert_agrees(k, host(res[k], gen.t[k]), gen.t[k])
        for k, v in inputs.items():
            if k in alias:
                pg.assert_agrees(f"{k} (updated in place by {alias[k]})", v, gen.t[alias[k]])
            else:
                np.testing.assert_array_equal(v, gen.arrays[k])


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_random_graphs_agree_with_torch_on_the_gpu(name):
    max_ops, kinds, big = CONFIGS[name]
    engine = Engine("cupy")
    ran = []
    before = prepare.compile_fallbacks()

    @settings(max_examples=EXAMPLES, **FRESH)
    @given(st.data())
    def run(data):
        g = pg.Gen(data, max_ops=max_ops, kinds=kinds, big=big)
        graph = g.build()
        try:
            check_gpu(g, graph, engine)
        except AssertionError as e:  # the graph and inputs, to replay it without Hypothesis
            inputs = {k: [str(v.dtype), list(v.shape), v.ravel().tolist()] for k, v in g.arrays.items()}
            raise AssertionError(f"{e}\ngraph: {json.dumps(graph)}\ninputs: {json.dumps(inputs)}") from None
        assert prepare.compile_fallbacks() == before, f"a kernel did not compile: {prepare.compile_fallbacks()}"
        ran.append(1)

    run()
    print(f"{name}: {len(ran)} random graphs agree with PyTorch on the GPU")
    assert ran


# ---- reduced-precision arithmetic (tests/test_reduced_precision.py's cases on the GPU) ----------


def _on_gpu(engine: Engine, want_dtype):
    def run(fusion, inputs):
        out = engine.run(fusion, inputs).outputs
        h = cp.asnumpy(out["y"])
        return {"y": h.view(ml_dtypes.bfloat16) if want_dtype == torch.bfloat16 and h.dtype == np.uint16 else h}

    return run


@pytest.mark.parametrize("name", sorted(rp.CASES))
def test_reduced_precision_cases_on_the_gpu(name):
    # float16/bfloat16 floor_divide in float32 rounded once, scans near overflow, bit for bit
    before = prepare.compile_fallbacks()
    rp.check(name, _on_gpu(Engine("cupy"), rp.CASES[name][3].dtype))
    assert prepare.compile_fallbacks() == before


@pytest.mark.parametrize("dt", ["bfloat16", "float16"])
def test_floor_divide_of_16_bit_tensors_agrees_with_torch_cuda(dt):
    """torch's CUDA floor_divide of two 16-bit tensors (BinaryDivFloorKernel.cu) runs its formula's
    fmod, subtraction and division in float and holds only the floor in the 16-bit type: for
    bfloat16 that is segfuse's float32-rounded-once rule on every pair; float16 may differ by one
    ulp where |a / b| > 2048 (the rounded floor meets the +1 fix-up). Random finite bit patterns."""
    tdt = rp.HALF[dt]
    r = np.random.default_rng(15)
    bits = r.integers(0, 1 << 16, (2, 1 << 20)).astype(np.uint16)
    a, b = (bits[k].view(ml_dtypes.bfloat16 if dt == "bfloat16" else np.float16) for k in range(2))
    keep = np.isfinite(a.astype(np.float32)) & np.isfinite(b.astype(np.float32)) & (b.astype(np.float32) != 0)
    a, b = a[keep], b[keep]
    f = Fusion.from_json(one_op("floor_divide", {"a": a, "b": b}, ["a", "b"], out="y"))
    got = to_torch(_on_gpu(Engine("cupy"), tdt)(f, {"a": a, "b": b})["y"]).double()
    theirs = torch.floor_divide(to_torch(a).cuda(), to_torch(b).cuda()).cpu().double()
    same = (got == theirs) | (torch.isnan(got) & torch.isnan(theirs))
    q = (to_torch(a).double() / to_torch(b).double()).abs()
    if dt == "bfloat16":
        assert bool(same.all()), f"{int((~same).sum())} of {same.numel()} differ from torch's CUDA floor_divide"
    else:
        bad = ~same
        ulp = torch.exp2(torch.floor(torch.log2(theirs.abs().clamp(min=1))) - 10)
        assert bool((q[bad] > 2048).all()) and bool(((got - theirs).abs()[bad] <= ulp[bad]).all())
    print(f"{dt}: {int((~same).sum())} of {same.numel()} pairs differ from torch's CUDA floor_divide")
