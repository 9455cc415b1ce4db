"""Graphs and PyTorch oracles shared by the segfuse.torch tests (CPU and GPU): the whole MoE routing
prologue as one graph, and the same computation written with torch's own ops."""

from __future__ import annotations

import torch

E, K = 256, 8


def prologue_graph(idt: str = "int64", E: int = E, K: int = K) -> dict:
    """counts per expert, expert offsets, and the sort permutations of the flattened top-k ids."""
    return {"format": "segfuse.fusion/1", "name": f"moe_prologue_{idt}",
            "inputs": [{"name": "topk_ids", "dtype": idt, "shape": ["T", K]}],
            "ops": [
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
                {"op": "scatter", "out": "output_perm", "inputs": ["z2", "order", "ar"], "dim": 0},
            ],
            "outputs": ["counts", "offsets", "input_perm", "output_perm"]}


def torch_prologue(ids: torch.Tensor, E: int = E, K: int = K):
    """The prologue with torch's ops (the oracle): counts, offsets, input and output permutations."""
    flat = ids.flatten()
    counts = torch.zeros(E, dtype=ids.dtype, device=ids.device).scatter_add_(0, flat.long(), torch.ones_like(flat))
    offsets = torch.nn.functional.pad(torch.cumsum(counts, 0), (1, 0))
    order = torch.argsort(flat, stable=True)
    inp = order // K
    outp = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=ids.device))
    return counts, offsets, inp, outp


SCATTER_ADD = {"format": "segfuse.fusion/1", "name": "scatter_add_inplace",
               "inputs": [{"name": "dst", "dtype": "float32", "shape": ["M"]},
                          {"name": "index", "dtype": "int64", "shape": ["N"]},
                          {"name": "src", "dtype": "float32", "shape": ["N"]}],
               "ops": [{"op": "scatter", "out": "upd", "inputs": ["dst", "index", "src"], "dim": 0, "reduce": "add"}],
               "outputs": [{"name": "upd", "alias_of": "dst"}]}
