"""The keys' histogram inside the fused radix sort (Capability.fuse_sort_histograms; planner:
compiler/segmenter/sort_epilogue.py, C: compiler/codegen/sort_epilogue.py `_histogram`): the
whole MoE prologue (tests/torch_graphs.py) in ONE launch, planned with the flag on, against
torch CPU for T in {4096, 16384, 65536, 5000 (not a multiple of a tile)} x {int32, int64}; all
ids equal (the sort's identity shortcut), two values, a few bins; an id out of range (256, -1)
fails the run with the scatter's index error and the GPU stays usable; the fast path and
errors="deferred" give the same results. They passed on the H200 on 2026-12-01 (tests/gpu/RESULTS.md), after
which the flag became the default; these plan with it on explicitly either way."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
torch = pytest.importorskip("torch")

from segfuse.compiler.cuda.runtime import get_runtime  # noqa: E402
from segfuse.compiler.engine import Engine  # noqa: E402
from segfuse.compiler.errors import DeferredRunError, RunError  # noqa: E402
from segfuse.compiler.ir import Fusion  # noqa: E402
from segfuse.compiler.segmenter.cache import PlanCache  # noqa: E402
from segfuse.compiler.segmenter.capability import DEFAULT_CAPABILITY  # noqa: E402
from torch_graphs import K, prologue_graph, torch_prologue  # noqa: E402

pytestmark = pytest.mark.gpu

HIST = PlanCache(cap=dataclasses.replace(DEFAULT_CAPABILITY, fuse_sort_histograms=True))
NAMES = ("counts", "offsets", "input_perm", "output_perm")


def _fusion(idt):
    g = prologue_graph(idt)
    return Fusion.from_json({**g, "name": f"{g['name']}_hist"})  # (its own fast-path signature)


def _check(f, ids: np.ndarray, eng, calls: int = 2):
    want = torch_prologue(torch.from_numpy(ids))
    for _ in range(calls):  # the second call takes the per-signature fast path
        got = eng.run(f, {"topk_ids": cp.asarray(ids)}).outputs
        for name, w in zip(NAMES, want):
            np.testing.assert_array_equal(cp.asnumpy(got[name]), w.numpy(), err_msg=f"{name} T={ids.shape[0]}")


@pytest.mark.parametrize("idt", ["int32", "int64"])
@pytest.mark.parametrize("T", [4096, 5000, 16384, 65536])
def test_whole_prologue_in_one_launch_equals_torch(T, idt):
    f = _fusion(idt)
    eng = Engine("cupy", plan_cache=HIST)
    ids = np.random.default_rng(T).integers(0, 256, (T, K)).astype(idt)
    _check(f, ids, eng)
    prep = get_runtime().prepared_for(f, {"topk_ids": cp.asarray(ids)})
    assert prep.kernels == 1, prep.fallbacks


@pytest.mark.parametrize("idt", ["int32", "int64"])
def test_ties_and_few_bins(idt):
    f = _fusion(idt)
    eng = Engine("cupy", plan_cache=HIST)
    rng = np.random.default_rng(4)
    T = 4096
    for ids in (np.zeros((T, K)), np.full((T, K), 255), rng.choice([3, 200], (T, K)), rng.integers(0, 5, (T, K))):
        _check(f, ids.astype(idt), eng, calls=1)


@pytest.mark.parametrize("bad", [256, -1, 1 << 20])
def test_an_id_out_of_range_fails_the_run(bad):
    f = _fusion("int64")
    eng = Engine("cupy", plan_cache=HIST)
    ids = np.random.default_rng(5).integers(0, 256, (4096, K))
    ids[100, 3] = bad
    with pytest.raises(RunError, match=f"index {bad} is out of bounds for dimension 0 with size 256"):
        eng.run(f, {"topk_ids": cp.asarray(ids)})
    _check(f, np.random.default_rng(6).integers(0, 256, (4096, K)), eng, calls=2)  # the GPU still works


def test_deferred_mode():
    f = _fusion("int32")
    eng = Engine("cupy", errors="deferred", plan_cache=HIST)
    ids = [np.random.default_rng(s).integers(0, 256, (16384, K)).astype(np.int32) for s in range(4)]
    outs = [eng.run(f, {"topk_ids": cp.asarray(x)}).outputs for x in ids]
    eng.synchronize()
    for x, got in zip(ids, outs):
        for name, w in zip(NAMES, torch_prologue(torch.from_numpy(x))):
            np.testing.assert_array_equal(cp.asnumpy(got[name]), w.numpy(), err_msg=name)
    bad = ids[0].copy()
    bad[0, 0] = 300
    eng.run(f, {"topk_ids": cp.asarray(bad)})
    with pytest.raises(DeferredRunError, match="index 300 is out of bounds"):
        eng.synchronize()
