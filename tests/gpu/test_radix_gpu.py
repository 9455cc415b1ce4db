"""The single-block radix sort (compiler/codegen/radix.py) against PyTorch on the CPU: stable
argsort / sort / topk of every integer dtype, ascending and descending, with many duplicates,
all-equal keys, negative keys, full-range int64, key ranges that cross byte boundaries or skip a
digit; and nvFuser's four MoE fusions at T=4096 (int64 and int32 ids) as one kernel launch (argsort up to
`Capability.radix_sort_max_row` keys; longer rows are library sorts)."""

from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
torch = pytest.importorskip("torch")

from corpus import moe_graphs  # noqa: E402
from segfuse.compiler.cuda.runtime import get_runtime  # noqa: E402
from segfuse.compiler.engine import Engine  # noqa: E402
from segfuse.compiler.ir import Fusion  # noqa: E402
from segfuse.compiler.segmenter.capability import DEFAULT_CAPABILITY  # noqa: E402
from segfuse.compiler.segmenter.reference import simple_plan  # noqa: E402

from .planned_runtime import PlannedRuntime  # noqa: E402

pytestmark = pytest.mark.gpu

K_TOP = 100
_BLOCK = []


def block_runtime():
    """Every graph as one single-block segment (forces the radix sort for any row length)."""
    if not _BLOCK:
        _BLOCK.append(PlannedRuntime(lambda f, types: simple_plan(f, types, small=1 << 62)))
    return _BLOCK[0]


def sort_graph(dtype: str, n: int) -> Fusion:
    ops = [{"op": "argsort", "out": "a", "inputs": ["x"], "dim": 0, "stable": True},
           {"op": "argsort", "out": "ad", "inputs": ["x"], "dim": 0, "descending": True, "stable": True},
           {"op": "sort", "out": ["sv", "si"], "inputs": ["x"], "dim": 0, "stable": True},
           {"op": "sort", "out": ["dv", "di"], "inputs": ["x"], "dim": 0, "descending": True, "stable": True},
           {"op": "topk", "out": ["tv", "ti"], "inputs": ["x"], "k": K_TOP, "dim": 0},
           {"op": "topk", "out": ["bv", "bi"], "inputs": ["x"], "k": K_TOP, "dim": 0, "largest": False}]
    return Fusion.from_json({"format": "segfuse.fusion/1", "name": "radix", "inputs": [
        {"name": "x", "dtype": dtype, "shape": [n]}], "ops": ops,
        "outputs": ["a", "ad", "sv", "si", "dv", "di", "tv", "ti", "bv", "bi"]})


def torch_oracle(x: np.ndarray) -> dict:
    t = torch.from_numpy(x)
    asc = torch.sort(t, stable=True)
    desc = torch.sort(t, descending=True, stable=True)
    # topk's tie order is unspecified in torch: segfuse keeps input order, i.e. the stable sort's prefix
    return {"a": asc.indices, "ad": desc.indices, "sv": asc.values, "si": asc.indices, "dv": desc.values,
            "di": desc.indices, "tv": desc.values[:K_TOP], "ti": desc.indices[:K_TOP],
            "bv": asc.values[:K_TOP], "bi": asc.indices[:K_TOP]}


def keys(kind: str, dtype: str, n: int, rng) -> np.ndarray | None:
    if dtype == "bool":
        return {"dups": rng.random(n) < 0.5, "equal": np.ones(n, bool)}.get(kind)
    info = np.iinfo(np.dtype(dtype))
    lo, hi = int(info.min), int(info.max)
    gen = {
        "dups": lambda: rng.integers(0, 8, n),  # few distinct keys: ranks inside long runs of ties
        "equal": lambda: np.full(n, min(hi, 5)),  # no pass at all: input order
        "full": lambda: rng.integers(lo, hi, n, endpoint=True, dtype=np.dtype(dtype)),
        "negative": lambda: rng.integers(max(lo, -1000), 0, n) if lo < 0 else None,
        "mixed_sign": lambda: rng.integers(max(lo, -300), min(hi, 300), n) if lo < 0 else None,
        "byte_boundary": lambda: rng.integers(250, min(hi, 262) + 1, n) if hi >= 262 else None,
        "skip_low_digit": lambda: rng.integers(0, 64, n) * 256 if hi >= 64 * 256 else None,  # digit 0 constant
        "wide40": lambda: rng.integers(-(2**40), 2**40, n) if hi >= 2**40 else None,  # 64-bit keys, 6 passes
        "moe": lambda: rng.integers(0, min(hi, 255) + 1, n),
    }[kind]()
    if gen is None:
        return None
    a = np.asarray(gen).astype(dtype)
    if kind == "full":
        a[rng.random(n) < 0.25] = a[3]  # duplicates at the extremes of the range too
        a[:7], a[7:14] = lo, hi
    return a


def check(f, x, res):
    want = torch_oracle(x)
    for name, w in want.items():
        got = cp.asnumpy(res[name])
        np.testing.assert_array_equal(got, w.numpy(), err_msg=f"{name} (n={x.size}, {x.dtype})")


KINDS = ["dups", "equal", "full", "negative", "mixed_sign", "byte_boundary", "skip_low_digit", "wide40", "moe"]


@pytest.mark.parametrize("dtype", ["int64", "int32", "int16", "int8", "uint8", "bool"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("n", [2049, 40000])
def test_radix_sort_matches_torch(dtype, kind, n):
    rng = np.random.default_rng(n + len(kind))
    x = keys(kind, dtype, n, rng)
    if x is None:
        pytest.skip(f"{kind} keys do not fit {dtype}")
    f = sort_graph(dtype, n)
    rt = block_runtime()
    res, _ = rt.run(f, {"x": x})
    prep = _prep_of(rt, f, {"x": x})
    assert prep.kernels == 1 and [s.kind for s in prep.steps] == ["kernel"]
    check(f, x, res)


@pytest.mark.parametrize("dtype", ["int64", "int32", "uint8"])
def test_engine_plan_sorts_long_integer_rows_in_one_launch(dtype):
    """The real segmenter keeps sorts of up to radix_sort_max_row keys in one single-block segment;
    twice as long a row is a library sort (the multi-block radix sort), with the same results."""
    n = DEFAULT_CAPABILITY.radix_sort_max_row
    x = keys("full", dtype, n, np.random.default_rng(7))
    f = sort_graph(dtype, n)
    res = Engine("cupy").run(f, {"x": x}).outputs
    check(f, x, res)
    prep = _prep_of(get_runtime(), f, {"x": x})
    assert prep is not None and prep.kernels == 1, prep and [(s.kind, s.desc) for s in prep.steps]
    x2 = keys("full", dtype, 2 * n, np.random.default_rng(8))
    f2 = sort_graph(dtype, 2 * n)
    check(f2, x2, Engine("cupy").run(f2, {"x": x2}).outputs)
    prep2 = _prep_of(get_runtime(), f2, {"x": x2})
    assert prep2 is not None and any("library" in fb for fb in prep2.fallbacks), prep2 and prep2.fallbacks


def _prep_of(rt, f, ins):
    return rt.prepared_for(f, ins)


def _torch_moe(name, ids, counts, E, K):
    if name == "moe_problem_sizes":
        return {"counts": torch.bincount(ids.flatten().long(), minlength=E)}
    if name in ("moe_expert_offsets", "moe_blockscale_offsets"):
        out = {"expert_offsets": torch.nn.functional.pad(torch.cumsum(counts, 0), (1, 0))}
        if name == "moe_blockscale_offsets":
            rounded = (counts + 127) // 128 * 128
            out["blockscale_offsets"] = torch.nn.functional.pad(torch.cumsum(rounded, 0), (1, 0))
        return out
    order = torch.argsort(ids.flatten(), dim=0, descending=True, stable=True)
    outp = torch.zeros_like(order).scatter_(0, order, torch.arange(order.numel()))
    return {"input_permutation": order // K, "output_permutation": outp}


@pytest.mark.parametrize("idt", ["int64", "int32"])
@pytest.mark.parametrize("which", ["moe_problem_sizes", "moe_expert_offsets", "moe_blockscale_offsets", "moe_argsort"])
def test_moe_one_launch_matches_torch(idt, which):
    # argsort: the longest row one block sorts (radix_sort_max_row keys); the others at T = 4096
    E, K = 256, 8
    T = DEFAULT_CAPABILITY.radix_sort_max_row // K if which == "moe_argsort" else 4096
    g, mk = next((g, mk) for g, mk in moe_graphs(E=E, K=K, idt=idt) if g["name"] == which)
    f = Fusion.from_json(g)
    ins = mk(T)(np.random.default_rng(11))
    res = Engine("cupy").run(f, ins).outputs
    t = {k: torch.from_numpy(v) for k, v in ins.items()}
    want = _torch_moe(which, t.get("topk_ids"), t.get("tokens_per_expert"), E, K)
    for name, w in want.items():
        np.testing.assert_array_equal(cp.asnumpy(res[name]), w.numpy(), err_msg=f"{which} {idt} {name}")
    prep = _prep_of(get_runtime(), f, ins)
    assert prep.kernels == 1 and [s.kind for s in prep.steps] == ["kernel"], prep.fallbacks
