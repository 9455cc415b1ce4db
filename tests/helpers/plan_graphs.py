"""Random graphs for plan execution: ops over float32 [N] / [M] tensors and int64 indices whose
plans reuse and alias buffers (scatters whose self has other uses, chains of scatters, in-place
`alias_of` outputs, views, scans, reductions, gathers), at sizes that give single-block and grid
plans."""

from __future__ import annotations

import copy

import numpy as np
from hypothesis import strategies as st
from segfuse.compiler import Fusion, RunError, run_graph
from segfuse.compiler.segmenter.capability import DEFAULT_CAPABILITY

BIG_N = DEFAULT_CAPABILITY.single_block_max_elems + 517  # multi-block kernels
SIZES_N = [0, 1, 2, 9, 40, BIG_N, BIG_N, BIG_N]  # grid plans as often as single-block ones
SIZES_M = [0, 1, 3, 17]

SCATTER_REDUCES = ["none", "add", "amax", "amin", "mul"]


@st.composite
def graphs(draw):
    """(graph dict, sizes): random ops over float32 [N] / [M] tensors and int64 indices."""
    pools = {"N": ["x", "y"], "M": ["src"], "idxM": ["idx"], "idxN": []}
    ops: list[dict] = []
    outputs: list = []
    aliased: set = set()
    n_ops = draw(st.integers(1, 7))

    def fresh():
        return f"t{len(ops)}"

    for _ in range(n_ops):
        kind = draw(st.sampled_from(["pointwise", "pointwise", "scatter", "scatter", "scatter", "index_add",
                                     "index_put", "gather", "scan", "sum", "full", "view", "argsort"]))
        out = fresh()
        if kind == "pointwise":
            a = draw(st.sampled_from(pools["N"]))
            b = draw(st.sampled_from(pools["N"] + [2.0, -1.5]))
            ops.append({"op": draw(st.sampled_from(["add", "mul", "maximum", "sub"])), "out": out, "inputs": [a, b]})
            pools["N"].append(out)
        elif kind == "scatter":
            self_t = draw(st.sampled_from(pools["N"]))
            use_perm = bool(pools["idxN"]) and draw(st.booleans())
            idx = draw(st.sampled_from(pools["idxN"] if use_perm else pools["idxM"]))
            src_pool = pools["N"] if use_perm else pools["M"]
            src = draw(st.sampled_from(src_pool + [3.0]))
            ops.append({"op": "scatter", "out": out, "inputs": [self_t, idx, src], "dim": 0,
                        "reduce": draw(st.sampled_from(SCATTER_REDUCES))})
            pools["N"].append(out)
            if self_t in ("x", "y") and self_t not in aliased and draw(st.booleans()):
                aliased.add(self_t)
                outputs.append({"name": out, "alias_of": self_t})
        elif kind == "index_add":
            ops.append({"op": "index_add", "out": out, "inputs": [draw(st.sampled_from(pools["N"])), "idx",
                                                                   draw(st.sampled_from(pools["M"]))], "dim": 0})
            pools["N"].append(out)
        elif kind == "index_put":
            ops.append({"op": "index_put", "out": out, "inputs": [draw(st.sampled_from(pools["N"])), "idx",
                                                                   draw(st.sampled_from(pools["M"] + [7.0]))],
                        "accumulate": draw(st.booleans())})
            pools["N"].append(out)
        elif kind == "gather":
            ops.append({"op": "gather", "out": out, "inputs": [draw(st.sampled_from(pools["N"])), "idx"], "dim": 0})
            pools["M"].append(out)
        elif kind == "scan":
            ops.append({"op": "cumsum", "out": out, "inputs": [draw(st.sampled_from(pools["N"]))], "dim": 0})
            pools["N"].append(out)
        elif kind == "sum":  # a 0-d result broadcast back: a read at other positions
            ops.append({"op": "sum", "out": out, "inputs": [draw(st.sampled_from(pools["N"]))]})
            ops.append({"op": "add", "out": out + "b", "inputs": [draw(st.sampled_from(pools["N"])), out]})
            pools["N"].append(out + "b")
        elif kind == "full":
            ops.append({"op": "full", "out": out, "inputs": [], "shape": ["N"], "value": 0.0, "dtype": "float32"})
            pools["N"].append(out)
        elif kind == "view":  # a pure view: writing through it must reach its base
            ops.append({"op": "reshape", "out": out, "inputs": [draw(st.sampled_from(pools["N"]))], "shape": [-1]})
            pools["N"].append(out)
        elif kind == "argsort":
            ops.append({"op": "argsort", "out": out, "inputs": [draw(st.sampled_from(pools["N"]))], "dim": 0,
                        "stable": True, "descending": draw(st.booleans())})
            pools["idxN"].append(out)
    made = [o["out"] for o in ops]
    taken = {o["name"] for o in outputs}
    plain = draw(st.lists(st.sampled_from(made), max_size=4, unique=True))
    outputs += [m for m in plain if m not in taken]
    if not outputs:
        outputs.append(made[-1])
    inputs = [{"name": "x", "dtype": "float32", "shape": ["N"]}, {"name": "y", "dtype": "float32", "shape": ["N"]},
              {"name": "idx", "dtype": "int64", "shape": ["M"]}, {"name": "src", "dtype": "float32", "shape": ["M"]}]
    graph = {"format": "segfuse.fusion/1", "name": "random", "inputs": inputs, "ops": ops, "outputs": outputs}
    return graph, draw(st.sampled_from(SIZES_N)), draw(st.sampled_from(SIZES_M))


def unspecified_write(op: dict) -> bool:
    """A write whose result with duplicate indices is unspecified (one of the duplicates wins, as
    in PyTorch; docs/graph-format.md): a GPU kernel may pick another than the NumPy interpreter."""
    return (op["op"] == "scatter" and op.get("reduce", "none") == "none") or \
        (op["op"] == "index_put" and not op.get("accumulate", False))


def make_inputs(n, m, seed):
    rng = np.random.default_rng(seed)
    # small integers as floats: exact sums, and ties for argsort's stability
    return {"x": rng.integers(-3, 4, n).astype(np.float32), "y": rng.integers(-3, 4, n).astype(np.float32),
            "idx": rng.integers(0, max(n, 1), m).astype(np.int64), "src": rng.integers(-3, 4, m).astype(np.float32)}


def scan_chain(n=BIG_N, dtype="float32"):
    """Four cumsums in a row (four segments): `c` reuses `a`'s buffer, `b` lives to the end. The GPU
    test takes int64, whose sums are exact in any order (x's periods sum to 0: no overflow)."""
    g = {"format": "segfuse.fusion/1", "name": "chain", "inputs": [{"name": "x", "dtype": dtype, "shape": ["N"]}],
         "ops": [{"op": "cumsum", "out": "a", "inputs": ["x"], "dim": 0},
                 {"op": "cumsum", "out": "b", "inputs": ["a"], "dim": 0},
                 {"op": "cumsum", "out": "c", "inputs": ["b"], "dim": 0},
                 {"op": "cumsum", "out": "d", "inputs": ["c"], "dim": 0},
                 {"op": "add", "out": "e", "inputs": ["d", "b"]}],
         "outputs": ["e", "d"]}
    x = np.arange(n) % 5 if dtype == "float32" else np.arange(n) % 5 - 2
    return Fusion.from_json(g), {"x": x.astype(dtype)}


def runnable(case, seed):
    """(fusion, inputs, run_graph's results) of a drawn case of `graphs`, or None when the graph
    is invalid or fails to run (the interpreter says which)."""
    graph, n, m = case
    try:
        f = Fusion.from_json(graph)
    except Exception:
        return None
    ins = make_inputs(n, m, seed)
    try:
        return f, ins, run_graph(f, copy.deepcopy(ins))
    except RunError:
        return None
