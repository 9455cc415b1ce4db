"""Graphs and PyTorch oracles shared by the segfuse.torch tests (CPU and GPU): the whole MoE routing
prologue as one graph, and the same computation written with torch's own ops."""

from __future__ import annotations

from workloads import E, K, prologue_graph, torch_prologue  # noqa: F401  (shared with the benchmarks)

SCATTER_ADD = {"format": "segfuse.fusion/1", "name": "scatter_add_inplace",
               "inputs": [{"name": "dst", "dtype": "float32", "shape": ["M"]},
                          {"name": "index", "dtype": "int64", "shape": ["N"]},
                          {"name": "src", "dtype": "float32", "shape": ["N"]}],
               "ops": [{"op": "scatter", "out": "upd", "inputs": ["dst", "index", "src"], "dim": 0, "reduce": "add"}],
               "outputs": [{"name": "upd", "alias_of": "dst"}]}
