"""Graphs several test files run: the MoE problem-size count, an in-place scatter, an elementwise
chain, a topk feeding a scatter, views, and builders for graphs of one op."""

from __future__ import annotations

import numpy as np
from segfuse.compiler import FusionDefinition

from helpers.processes import ROOT

MOE = ROOT / "examples" / "moe_problem_sizes.json"

MOE_PROBLEM_SIZES = {
    "format": "segfuse.fusion/1", "name": "moe_problem_sizes",
    "inputs": [{"name": "topk_ids", "dtype": "int64", "shape": ["T", "K"]}],
    "ops": [{"op": "reshape", "out": "flat", "inputs": ["topk_ids"], "shape": [-1]},
            {"op": "full", "out": "zeros", "shape": [16], "value": 0, "dtype": "int64"},
            {"op": "full_like", "out": "ones", "inputs": ["flat"], "value": 1},
            {"op": "scatter", "out": "counts", "inputs": ["zeros", "flat", "ones"], "dim": 0, "reduce": "add"}],
    "outputs": ["counts"],
}

# dst updated in place (alias_of): the server must be given dst as a buffer, and updates it.
SCATTER_ADD_INPLACE = {
    "format": "segfuse.fusion/1", "name": "scatter_add",
    "inputs": [{"name": "dst", "dtype": "float32", "shape": ["M"]},
               {"name": "index", "dtype": "int64", "shape": ["N"]},
               {"name": "src", "dtype": "float32", "shape": ["N"]}],
    "ops": [{"op": "scatter", "out": "dst_updated", "inputs": ["dst", "index", "src"], "dim": 0, "reduce": "add"}],
    "outputs": [{"name": "dst_updated", "alias_of": "dst"}],
}

ELEMENTWISE_CHAIN = {
    "format": "segfuse.fusion/1", "name": "elementwise_chain",
    "inputs": [{"name": n, "dtype": "float32", "shape": ["N"]} for n in "abc"],
    "ops": [{"op": "gt", "out": "positive", "inputs": ["a", 0]},
            {"op": "mul", "out": "ab", "inputs": ["a", "b"]},
            {"op": "add", "out": "ab_c", "inputs": ["ab", "c"]},
            {"op": "exp", "out": "exp_c", "inputs": ["c"]},
            {"op": "mul", "out": "half_exp_c", "inputs": ["exp_c", 0.5]},
            {"op": "where", "out": "out", "inputs": ["positive", "ab_c", "half_exp_c"]}],
    "outputs": ["out"],
}


def counts_of(ids, experts: int = 16) -> np.ndarray:
    """The MoE graph's oracle: how many of `ids` name each expert."""
    return np.bincount(np.asarray(ids).ravel(), minlength=experts).astype(np.int64)


def declare(inputs) -> list[dict]:
    """Input declarations from (name, dtype, shape) triples, or from {name: array}."""
    if isinstance(inputs, dict):
        return [{"name": n, "dtype": str(a.dtype), "shape": list(a.shape)} for n, a in inputs.items()]
    return [{"name": n, "dtype": str(d), "shape": list(s)} for n, d, s in inputs]


def graph(inputs, ops: list[dict], outputs: list, name: str = "g") -> dict:
    """A segfuse.fusion/1 graph; `inputs` as for `declare`, or declarations already."""
    decl = inputs if inputs and isinstance(inputs, list) and isinstance(inputs[0], dict) else declare(inputs)
    return {"format": "segfuse.fusion/1", "name": name, "inputs": decl, "ops": ops, "outputs": outputs}


def one_op(op: str, inputs, operands: list, out=None, n_out: int = 1, name: str | None = None, **attrs) -> dict:
    """A graph of the one op `op` over `operands` (input names or literals) with its attributes;
    `inputs` as for `declare`. Its output is `out` (a name, or a list of names), by default "out"
    or, for `n_out` outputs, out0, out1, ...; every output is a graph output."""
    if out is None:
        out = "out" if n_out == 1 else [f"out{i}" for i in range(n_out)]
    outs = [out] if isinstance(out, str) else list(out)
    return graph(inputs, [{"op": op, "out": out if isinstance(out, str) else outs, "inputs": list(operands),
                           **attrs}], outs, name or f"test_{op}")


def topk_scatter(cols: int) -> dict:
    """topk along dim 0 whose indices feed a scatter along dim 0. The
    scatter's self, a graph input, gets a private copy: inside the one block of a small graph
    (cols=64), made by the topk's segment for the scatter's segment at [128, 1024]."""
    return {"format": "segfuse.fusion/1", "name": "topk_scatter",
            "inputs": [{"name": n, "dtype": "float32", "shape": [128, cols]} for n in ("x", "d")],
            "ops": [{"op": "topk", "out": ["v", "i"], "inputs": ["x"], "k": 4, "dim": 0},
                    {"op": "mul", "out": "w", "inputs": ["v", 2.0]},
                    {"op": "scatter", "out": "o", "inputs": ["d", "i", "w"], "dim": 0}],
            "outputs": ["o", "v"]}


def view_only():
    """flat = reshape(x): a graph of one view."""
    with FusionDefinition("view_only") as fd:
        x = fd.define_tensor("x", ["A", "B"], "float32")
        fd.add_output(fd.ops.reshape(x, [-1]), "flat")
    return fd.fusion()


def view_of_kernel_output():
    """y = exp(x) is written by the kernel; r = reshape(y) is a view of it (both outputs)."""
    with FusionDefinition("view_of_output") as fd:
        x = fd.define_tensor("x", ["A", "B"], "float32")
        y = fd.ops.exp(x)
        fd.add_output(y, "y")
        fd.add_output(fd.ops.reshape(y, [-1]), "r")
        fd.add_output(fd.ops.unsqueeze(y, 0), "u")
    return fd.fusion()


FILL_N = 60_000  # fill_graph's output elements: 240 KB of float32, about 1 MB of JSON


def fill_graph(n: int = FILL_N, name: str = "fill") -> dict:
    """y = full([n], 1.5) + x: a small request that makes a large output."""
    return {"format": "segfuse.fusion/1", "name": name,
            "inputs": [{"name": "x", "dtype": "float32", "shape": [1]}],
            "ops": [{"op": "full", "out": "a", "shape": [n], "value": 1.5, "dtype": "float32"},
                    {"op": "add", "out": "y", "inputs": ["a", "x"]}],
            "outputs": ["y"]}


# fill_graph's input as a KServe v2 request lists it
FILL_INPUT = {"name": "x", "shape": [1], "datatype": "FP32", "data": [2.0]}
