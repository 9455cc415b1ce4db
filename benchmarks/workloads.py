"""The graphs the GPU benchmarks run, and the PyTorch code each is timed against:

- `moe_graphs`: the four MoE routing fusions of nvFuser's SgLangMoETest (bench_gpu.py, bench_regions.py);
- `prologue_graph` / `torch_prologue`: the whole MoE routing prologue as one graph (bench_prologue.py,
  bench_torch_graph.py);
- `norm_graph` / `norm_inputs` / `torch_norm`: softmax, log_softmax, RMSNorm and LayerNorm over dim 1
  of [R, D] (bench_norms.py).

The tests use them too (pyproject's pytest `pythonpath`; tests/corpus, tests/norm_graphs.py and
tests/torch_graphs.py add what only tests need); nothing here imports the test tree."""

from __future__ import annotations

import numpy as np
from segfuse.compiler.builder import FusionDefinition

E, K = 256, 8  # the prologue's experts and top-k (DeepSeek-V3's routing)
EPS = 1e-6
NORMS = ("softmax", "log_softmax", "rmsnorm", "layernorm")


def _graph(name, inputs, ops, outputs) -> dict:
    return {"format": "segfuse.fusion/1", "name": name, "inputs": inputs, "ops": ops, "outputs": outputs}


# ---- the four MoE fusions ---------------------------------------------------------------------------
def moe_graphs(E=256, K=8, idt="int64"):
    """[(graph, inputs maker)] for the four MoE fusions with E experts and top-k K; a maker takes T
    and gives a function of a NumPy Generator returning the inputs."""
    ids = {"name": "topk_ids", "dtype": idt, "shape": ["T", K]}
    counts_in = {"name": "tokens_per_expert", "dtype": idt, "shape": [E]}
    ps = _graph("moe_problem_sizes", [ids], [
        {"op": "reshape", "out": "flat", "inputs": ["topk_ids"], "shape": [-1]},
        {"op": "full", "out": "zeros", "inputs": [], "shape": [E], "value": 0, "dtype": "int64"},
        {"op": "full_like", "out": "ones", "inputs": ["flat"], "value": 1, "dtype": "int64"},
        {"op": "scatter", "out": "counts", "inputs": ["zeros", "flat", "ones"], "dim": 0, "reduce": "add"}],
        ["counts"])
    eo = _graph("moe_expert_offsets", [counts_in], [
        {"op": "cumsum", "out": "cs", "inputs": ["tokens_per_expert"], "dim": 0},
        {"op": "pad", "out": "expert_offsets", "inputs": ["cs"], "pad": [1, 0]}], ["expert_offsets"])
    bs = _graph("moe_blockscale_offsets", [counts_in], [
        {"op": "cumsum", "out": "cs", "inputs": ["tokens_per_expert"], "dim": 0},
        {"op": "pad", "out": "expert_offsets", "inputs": ["cs"], "pad": [1, 0]},
        {"op": "ceil_div", "out": "blocks", "inputs": ["tokens_per_expert", 128]},
        {"op": "mul", "out": "rounded", "inputs": ["blocks", 128]},
        {"op": "cumsum", "out": "cs2", "inputs": ["rounded"], "dim": 0},
        {"op": "pad", "out": "blockscale_offsets", "inputs": ["cs2"], "pad": [1, 0]}],
        ["expert_offsets", "blockscale_offsets"])
    ar = _graph("moe_argsort", [ids], [
        {"op": "reshape", "out": "flat", "inputs": ["topk_ids"], "shape": [-1]},
        {"op": "argsort", "out": "order", "inputs": ["flat"], "dim": 0, "descending": True, "stable": True},
        {"op": "floor_divide", "out": "input_permutation", "inputs": ["order", K]},
        {"op": "full", "out": "z", "inputs": [], "shape": [f"T*{K}"], "value": 0, "dtype": "int64"},
        {"op": "iota", "out": "ar", "inputs": [], "length": f"T*{K}"},
        {"op": "scatter", "out": "output_permutation", "inputs": ["z", "order", "ar"], "dim": 0}],
        ["input_permutation", "output_permutation"])

    def ids_maker(T, dtn=idt):
        return lambda rng: {"topk_ids": rng.integers(0, E, (T, K)).astype(np.dtype(dtn))}

    def counts_maker(T, dtn=idt):
        return lambda rng: {"tokens_per_expert": rng.integers(0, T * K // E + 3, (E,)).astype(np.dtype(dtn))}

    return [(ps, ids_maker), (eo, counts_maker), (bs, counts_maker), (ar, ids_maker)]


# ---- the whole MoE prologue ---------------------------------------------------------------------------
def prologue_graph(idt: str = "int64", E: int = E, K: int = K) -> dict:
    """Counts per expert, expert offsets, and the sort permutations of the flattened top-k ids."""
    return _graph(f"moe_prologue_{idt}", [{"name": "topk_ids", "dtype": idt, "shape": ["T", K]}], [
        {"op": "reshape", "out": "flat", "inputs": ["topk_ids"], "shape": [-1]},
        {"op": "full", "out": "zeros", "inputs": [], "shape": [E], "value": 0, "dtype": idt},
        {"op": "full_like", "out": "ones", "inputs": ["flat"], "value": 1},
        {"op": "scatter", "out": "counts", "inputs": ["zeros", "flat", "ones"], "dim": 0, "reduce": "add"},
        {"op": "cumsum", "out": "csum", "inputs": ["counts"], "dim": 0},
        {"op": "pad", "out": "offsets", "inputs": ["csum"], "pad": [1, 0], "value": 0},
        {"op": "argsort", "out": "order", "inputs": ["flat"], "dim": 0, "stable": True},
        {"op": "floor_divide", "out": "input_perm", "inputs": ["order", K]},
        {"op": "full", "out": "z2", "inputs": [], "shape": [f"T*{K}"], "value": 0, "dtype": "int64"},
        {"op": "iota", "out": "ar", "inputs": [], "length": f"T*{K}"},
        {"op": "scatter", "out": "output_perm", "inputs": ["z2", "order", "ar"], "dim": 0}],
        ["counts", "offsets", "input_perm", "output_perm"])


def torch_prologue(ids, E: int = E, K: int = K):
    """The prologue with torch's ops: counts, offsets, input and output permutations."""
    import torch

    flat = ids.flatten()
    counts = torch.zeros(E, dtype=ids.dtype, device=ids.device).scatter_add_(0, flat.long(), torch.ones_like(flat))
    offsets = torch.nn.functional.pad(torch.cumsum(counts, 0), (1, 0))
    order = torch.argsort(flat, stable=True)
    inp = order // K
    outp = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=ids.device))
    return counts, offsets, inp, outp


# ---- row normalizations ---------------------------------------------------------------------------
def norm_graph(kind: str, dtype: str = "float32", shape=("R", "D")):
    """softmax, log_softmax, rmsnorm or layernorm over dim 1, computed in float32, rounded at the output."""
    with FusionDefinition(f"{kind}_{dtype}") as fd:
        x = fd.define_tensor("x", shape=list(shape), dtype=dtype)
        xf = x if dtype == "float32" else fd.ops.cast(x, "float32")
        if kind in ("softmax", "log_softmax"):
            z = xf - fd.ops.amax(xf, [1], True)
            s = fd.ops.sum(fd.ops.exp(z), [1], True)
            y = z - fd.ops.log(s) if kind == "log_softmax" else fd.ops.exp(z) / s
        else:
            w = fd.define_tensor("w", shape=[shape[1]], dtype=dtype)
            wf = w if dtype == "float32" else fd.ops.cast(w, "float32")
            if kind == "rmsnorm":
                y = xf * fd.ops.rsqrt(fd.ops.mean(xf * xf, [1], True) + EPS) * wf
            else:
                b = fd.define_tensor("b", shape=[shape[1]], dtype=dtype)
                bf = b if dtype == "float32" else fd.ops.cast(b, "float32")
                d = xf - fd.ops.mean(xf, [1], True)
                y = d * fd.ops.rsqrt(fd.ops.mean(d * d, [1], True) + EPS) * wf + bf
        fd.add_output(y if dtype == "float32" else fd.ops.cast(y, dtype), "y")
    return fd.fusion()


def torch_norm(kind: str, inputs: dict):
    """PyTorch's result (float32 math, rounded to the input's dtype), from torch tensors."""
    import torch

    x = inputs["x"]
    xf = x.float()
    if kind == "softmax":
        y = torch.softmax(xf, 1)
    elif kind == "log_softmax":
        y = torch.log_softmax(xf, 1)
    elif kind == "rmsnorm":
        y = xf * torch.rsqrt((xf * xf).mean(1, keepdim=True) + EPS) * inputs["w"].float()
    else:
        y = torch.nn.functional.layer_norm(xf, (x.shape[1],), inputs["w"].float(), inputs["b"].float(), EPS)
    return y.to(x.dtype)


def norm_inputs(kind: str, R: int, D: int, dtype: str = "float32", seed: int = 0):
    """NumPy inputs: x of [R, D], and the weights (and bias) of [D] that the norm takes."""
    import ml_dtypes

    rng = np.random.default_rng(seed)
    np_dt = np.float32 if dtype == "float32" else ml_dtypes.bfloat16
    out = {"x": (rng.standard_normal((R, D)) * 3).astype(np.float32).astype(np_dt)}
    if kind in ("rmsnorm", "layernorm"):
        out["w"] = rng.standard_normal(D).astype(np_dt)
    if kind == "layernorm":
        out["b"] = rng.standard_normal(D).astype(np_dt)
    return out
