"""The argsort epilogue fusion on the GPU (compiler/codegen/sort_epilogue.py, the fused variant of
compiler/cuda/radix_sort.py): the MoE argsort fusion through Engine("cupy") against torch CPU
(stable argsort, floor division, scatter of arange) for T in {1, 128, 4096, 65536} x {int32, int64}
x both orders; all-equal ids (the kernel's identity shortcut), few distinct values, full-range and
negative ids (several passes); one launch at T = 4096 and 65536; every consumer kind (order itself,
a narrowing cast, a pointwise scatter source, a literal scattered into a longer target that the
phase-0 init fills); a division by a zero literal reported through the error word; a strided input;
and a direct fused call without a runtime thread state (its private error word)."""

from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
torch = pytest.importorskip("torch")

from corpus import _graph, moe_graphs, sort_consumers_graph  # noqa: E402
from segfuse.compiler.codegen import sort_epilogue as se  # noqa: E402
from segfuse.compiler.cuda import radix_sort  # noqa: E402
from segfuse.compiler.cuda.runtime import get_runtime  # noqa: E402
from segfuse.compiler.engine import Engine  # noqa: E402
from segfuse.compiler.errors import RunError  # noqa: E402
from segfuse.compiler.ir import Fusion  # noqa: E402
from segfuse.compiler.numpy_backend import run_graph  # noqa: E402
from segfuse.compiler.segmenter import segment  # noqa: E402
from segfuse.compiler.segmenter import sort_epilogue as sep  # noqa: E402

pytestmark = pytest.mark.gpu

K = 8


def moe(idt="int64", desc=True):
    g, _ = moe_graphs(idt=idt)[-1]
    ops = [dict(op, descending=desc) if op["op"] == "argsort" else op for op in g["ops"]]
    return Fusion.from_json({**g, "name": f"moe_argsort_{idt}_{int(desc)}", "ops": ops})


def oracle(ids: np.ndarray, desc: bool) -> dict:
    """torch: order = argsort(flat, stable), order // K, zeros.scatter(0, order, arange)."""
    flat = torch.from_numpy(np.ascontiguousarray(ids).reshape(-1))
    order = torch.argsort(flat, descending=desc, stable=True)
    n = flat.numel()
    outp = torch.zeros(n, dtype=torch.int64).scatter(0, order, torch.arange(n, dtype=torch.int64))
    return {"input_permutation": torch.div(order, K, rounding_mode="floor").numpy(), "output_permutation": outp.numpy()}


def run_moe(ids: np.ndarray, desc: bool, calls: int = 2):
    f = moe(ids.dtype.name, desc)
    want = oracle(ids, desc)
    eng = Engine("cupy")
    for _ in range(calls):  # the second call takes the per-signature fast path
        got = eng.run(f, {"topk_ids": cp.asarray(ids)}).outputs
        for k in want:
            np.testing.assert_array_equal(cp.asnumpy(got[k]), want[k], err_msg=f"{k} T={ids.shape[0]} desc={desc}")
    return f


@pytest.mark.parametrize("desc", [True, False])
@pytest.mark.parametrize("idt", ["int32", "int64"])
@pytest.mark.parametrize("T", [1, 128, 4096, 65536])
def test_moe_argsort_equals_torch(T, idt, desc):
    ids = np.random.default_rng(T + 7 * desc).integers(0, 256, (T, K)).astype(idt)
    run_moe(ids, desc)


@pytest.mark.parametrize("idt", ["int32", "int64"])
@pytest.mark.parametrize("T", [4096, 65536])
def test_ties_few_values_and_full_range(T, idt):
    rng = np.random.default_rng(T)
    info = np.iinfo(idt)
    cases = [np.zeros((T, K)), np.full((T, K), 255), rng.choice([3, 200], (T, K)),
             rng.integers(-5, 5, (T, K)), rng.integers(info.min, info.max, (T, K), endpoint=True)]
    for ids in cases:
        for desc in (True, False):
            run_moe(ids.astype(idt), desc, calls=1)


@pytest.mark.parametrize("T", [4096, 65536])
def test_one_launch(T):
    for idt in ("int32", "int64"):
        ids = np.random.default_rng(1).integers(0, 256, (T, K)).astype(idt)
        f = run_moe(ids, True, calls=1)
        prep = get_runtime().prepared_for(f, {"topk_ids": cp.asarray(ids)})
        assert prep.kernels == 1 and len(prep.steps) == 1, prep.fallbacks
        assert prep.steps[0].desc == sep.ROUTINE and not any("split" in x for x in prep.fallbacks)


def wide(idt):
    return Fusion.from_json(sort_consumers_graph(idt, K))


@pytest.mark.parametrize("idt", ["int32", "int64"])
@pytest.mark.parametrize("T", [4096, 65536])
def test_every_consumer_kind(T, idt):
    f = wide(idt)
    eng = Engine("cupy")
    for seed in (0, 1):
        ids = np.random.default_rng(seed).integers(0, 40 if seed else 256, (T, K)).astype(idt)
        want = run_graph(f, {"ids": ids.copy()})
        got = eng.run(f, {"ids": cp.asarray(ids)}).outputs
        for k in want:
            np.testing.assert_array_equal(cp.asnumpy(got[k]), want[k], err_msg=k)
    prep = get_runtime().prepared_for(f, {"ids": cp.asarray(ids)})
    assert prep.kernels == 1


def test_division_by_a_zero_literal_is_reported():
    ops = [{"op": "reshape", "out": "flat", "inputs": ["ids"], "shape": [-1]},
           {"op": "argsort", "out": "order", "inputs": ["flat"], "dim": 0, "descending": False, "stable": True},
           {"op": "floor_divide", "out": "q", "inputs": ["order", 0]}]
    f = Fusion.from_json(_graph("div0", [{"name": "ids", "dtype": "int64", "shape": ["T", K]}], ops, ["q"]))
    ids = cp.asarray(np.random.default_rng(0).integers(0, 256, (4096, K)))
    with pytest.raises(RunError, match="division by zero"):
        Engine("cupy").run(f, {"ids": ids})
    assert get_runtime().prepared_for(f, {"ids": ids}).kernels == 1


def test_strided_input():
    h = np.random.default_rng(2).integers(0, 256, (K, 4096)).astype(np.int64)
    ids = cp.asarray(h).T  # [4096, 8], not contiguous: the step reshapes with a copy
    want = oracle(h.T, True)
    got = Engine("cupy").run(moe("int64", True), {"topk_ids": ids}).outputs
    for k in want:
        np.testing.assert_array_equal(cp.asnumpy(got[k]), want[k], err_msg=k)


def test_direct_call_without_a_thread_state():
    T = 4096
    f = moe("int32", False)
    types = f.bind({"topk_ids": (T, K)}).types
    (seg,) = segment(f, f.bind({"topk_ids": (T, K)})).segments
    m = sep.match(f, seg.nodes, seg.inputs, seg.outputs, types)
    epi, params = se.render(f, m, types)
    h = np.random.default_rng(3).integers(0, 256, (T, K)).astype(np.int32)
    outs = [cp.empty(T * K, np.int64) for _ in params]
    assert radix_sort.argsort(cp, cp.asarray(h).reshape(-1), 0, False, epilogue=epi, outputs=outs) is None
    want = oracle(h, False)
    for name, a in zip(params, outs):
        np.testing.assert_array_equal(cp.asnumpy(a), want[name], err_msg=name)
