"""Corpus cases of the ops issue 15 added (select, the composite reductions softmax, log_softmax,
logsumexp, var, std, var_mean, the scans cummax and cummin, scatter's reduce "mean" and index_reduce):
every dtype they take, reduced and kept dims, symbolic sizes, empty dims, special values (rows of
-inf, +inf, NaN; ties). Part of `corpus.all_cases` (the offline compile test, the kernel digests,
the GPU tests against the NumPy backend)."""

from __future__ import annotations

import numpy as np
from segfuse.compiler.dtypes import DType

from .util import _graph, rand

# (the composites' float16 kernels are bfloat16's with another conversion; the mean and index_reduce
# scatters' int16/int32 kernels int8's and int64's: fewer kernels for the offline compile test, every
# dtype stays in the CPU tests against torch)
FLOATS = (DType.float32, DType.bfloat16, DType.float64)
SCATTER_DTYPES = (DType.float32, DType.float16, DType.bfloat16, DType.float64, DType.int64, DType.int8, DType.uint8)


def _outs(ops) -> list[str]:
    return [n for o in ops for n in ([o["out"]] if isinstance(o["out"], str) else o["out"])]


def select_cases():
    out = []
    for dt in (DType.float32, DType.int64, DType.bool, DType.float16):
        ins = [{"name": "x", "dtype": dt.value, "shape": [4, 6, 5]}]
        ops = [{"op": "select", "out": "s0", "inputs": ["x"], "dim": 0, "index": 2},
               {"op": "select", "out": "s1", "inputs": ["x"], "dim": -1, "index": -1},
               {"op": "select", "out": "s2", "inputs": ["s1"], "dim": 1, "index": 0},
               {"op": "select", "out": "s3", "inputs": ["s2"], "dim": 0, "index": 3},  # 0-d
               {"op": "sum", "out": "r", "inputs": ["s0"], "dims": 1},
               {"op": "cast", "out": "c", "inputs": ["s1"], "dtype": "float32"}]
        out.append((f"select_{dt.value}", _graph(f"select_{dt.value}", ins, ops, _outs(ops)),
                    lambda rng, dt=dt: {"x": rand(rng, (4, 6, 5), dt)}))
    return out


def _composite_ops(long_rows: bool):
    ops = [{"op": "softmax", "out": "p1", "inputs": ["x"], "dim": 1},
           {"op": "log_softmax", "out": "lp", "inputs": ["x"], "dim": -2},
           {"op": "logsumexp", "out": "l1", "inputs": ["x"], "dims": [1]},
           {"op": "logsumexp", "out": "l02", "inputs": ["y"], "dims": [0, 2], "keepdim": True},
           {"op": "var", "out": "v1", "inputs": ["x"], "dims": 1},
           {"op": "std", "out": "sa", "inputs": ["x"]},
           {"op": "var_mean", "out": ["v02", "m02"], "inputs": ["y"], "dims": [0, 2], "correction": 0,
            "keepdim": True}]
    if long_rows:  # rows longer than a block (the block-wide reductions)
        ops += [{"op": "softmax", "out": "pl", "inputs": ["w"], "dim": 1},
                {"op": "std", "out": "sl", "inputs": ["w"], "dims": [1], "correction": 2}]
    return ops


def composite_cases():
    out = []
    for dt in FLOATS:
        ins = [{"name": "x", "dtype": dt.value, "shape": [4, 37]}, {"name": "y", "dtype": dt.value, "shape": [2, 3, 5]},
               {"name": "w", "dtype": dt.value, "shape": [3, 1500]}]
        ops = _composite_ops(long_rows=dt is DType.float32)
        out.append((f"comp_{dt.value}", _graph(f"comp_{dt.value}", ins, ops, _outs(ops)),
                    lambda rng, dt=dt: {"x": rand(rng, (4, 37), dt), "y": rand(rng, (2, 3, 5), dt),
                                        "w": rand(rng, (3, 1500), dt)}))
    # integers: softmax with dtype=, logsumexp in float32; symbolic sizes (N counted at run time)
    ins = [{"name": "i", "dtype": "int64", "shape": [4, 37]}, {"name": "b", "dtype": "bool", "shape": [3, 8]},
           {"name": "z", "dtype": "float32", "shape": ["R", "N"]}]
    ops = [{"op": "softmax", "out": "pi", "inputs": ["i"], "dim": 1, "dtype": "float32"},
           {"op": "log_softmax", "out": "lpi", "inputs": ["i"], "dim": 0, "dtype": "float16"},
           {"op": "logsumexp", "out": "li", "inputs": ["i"], "dims": 1},
           {"op": "logsumexp", "out": "lb", "inputs": ["b"], "dims": [0, 1]},
           {"op": "softmax", "out": "pz", "inputs": ["z"], "dim": 1},
           {"op": "logsumexp", "out": "lz", "inputs": ["z"], "dims": [0]},
           {"op": "var_mean", "out": ["vz", "mz"], "inputs": ["z"], "dims": 1},
           {"op": "std", "out": "sz", "inputs": ["z"], "correction": 3}]
    out.append(("comp_int_symbolic", _graph("comp_int_symbolic", ins, ops, _outs(ops)),
                lambda rng: {"i": rand(rng, (4, 37), DType.int64), "b": rand(rng, (3, 8), DType.bool),
                             "z": rand(rng, (5, 40), DType.float32)}))
    # special values: a row of -inf, a row with +inf, a row with NaN, a row of one repeated value;
    # and empty dims (softmax of an empty row is empty, logsumexp -inf, var NaN)
    ins = [{"name": "x", "dtype": "float32", "shape": [5, 6]}, {"name": "e", "dtype": "float32", "shape": [3, 0]}]
    ops = [{"op": "softmax", "out": "p", "inputs": ["x"], "dim": 1},
           {"op": "log_softmax", "out": "lp", "inputs": ["x"], "dim": 1},
           {"op": "logsumexp", "out": "l", "inputs": ["x"], "dims": 1},
           {"op": "var", "out": "v", "inputs": ["x"], "dims": [1]},
           {"op": "softmax", "out": "pe", "inputs": ["e"], "dim": 1},
           {"op": "logsumexp", "out": "le", "inputs": ["e"], "dims": [1]},
           {"op": "var_mean", "out": ["ve", "me"], "inputs": ["e"], "dims": 1}]
    out.append(("comp_special", _graph("comp_special", ins, ops, _outs(ops)), _special_inputs))
    return out


def _special_inputs(rng):
    x = rand(rng, (5, 6), DType.float32)
    x[0] = -np.inf
    x[1, 2] = np.inf
    x[2, 4] = np.nan
    x[3] = 1.5
    return {"x": x, "e": np.zeros((3, 0), np.float32)}


def cum_extreme_cases():
    """cummax/cummin over every dtype (small integers: many ties), rows longer than one block's
    1024 threads (the carry between chunks), a 0-d input, special floats, and indices that feed a
    gather and a scatter in the same graph."""
    out = []
    for dt in DType:
        ins = [{"name": "x", "dtype": dt.value, "shape": [3, 200]}, {"name": "w", "dtype": dt.value, "shape": [2, 2500]},
               {"name": "z", "dtype": dt.value, "shape": []}]
        ops = [{"op": "cummax", "out": ["mv", "mi"], "inputs": ["x"], "dim": 1},
               {"op": "cummin", "out": ["nv", "ni"], "inputs": ["x"], "dim": 0},
               {"op": "cummax", "out": ["wv", "wi"], "inputs": ["w"], "dim": -1},
               {"op": "cummin", "out": ["zv", "zi"], "inputs": ["z"], "dim": 0},
               {"op": "take_along_axis", "out": "g", "inputs": ["x", "mi"], "dim": 1}]
        out.append((f"cumext_{dt.value}", _graph(f"cumext_{dt.value}", ins, ops, _outs(ops)),
                    lambda rng, dt=dt: {"x": _ties(rng, (3, 200), dt), "w": _ties(rng, (2, 2500), dt),
                                        "z": rand(rng, (), dt)}))
    ins = [{"name": "x", "dtype": "float32", "shape": [4, 9]}, {"name": "d", "dtype": "float32", "shape": [4, 9]}]
    ops = [{"op": "cummax", "out": ["mv", "mi"], "inputs": ["x"], "dim": 1},
           {"op": "cummin", "out": ["nv", "ni"], "inputs": ["x"], "dim": 1},
           {"op": "full_like", "out": "zero", "inputs": ["d"], "value": 0},
           {"op": "scatter", "out": "hits", "inputs": ["zero", "mi", 1.0], "dim": 1, "reduce": "add"}]
    out.append(("cumext_special", _graph("cumext_special", ins, ops, _outs(ops)), _cum_special_inputs))
    return out


def _ties(rng, shape, dt: DType):
    """Values from a few integers (many equal values), in any dtype."""
    return rand(rng, shape, dt) if dt is DType.bool else rng.integers(0 if dt is DType.uint8 else -3, 4, shape).astype(dt.np)


def _cum_special_inputs(rng):
    x = rand(rng, (4, 9), DType.float32, -2, 3).round()
    x[0, 3], x[0, 6] = np.nan, np.nan
    x[1, :4] = -np.inf
    x[2, 5] = np.inf
    return {"x": x, "d": np.zeros((4, 9), np.float32)}


def scatter_mean_cases(n_src=64, m=10):
    """scatter with reduce "mean" (duplicates, include_self both ways, a 2-D scatter of a number,
    an empty index of another rank) and index_reduce with every reduce, along dims 0 and 1, int64
    and int32 indices. (Names start with "sc": float sums accumulate in an unspecified order.)"""
    out = []
    for dt in SCATTER_DTYPES:  # (PyTorch has no mean or index_reduce for bool)
        ins = [{"name": "s", "dtype": dt.value, "shape": [m]}, {"name": "i", "dtype": "int64", "shape": [n_src]},
               {"name": "v", "dtype": dt.value, "shape": [n_src]}, {"name": "t", "dtype": dt.value, "shape": [4, 9]},
               {"name": "j", "dtype": "int32", "shape": [4, 5]}, {"name": "e", "dtype": "int64", "shape": [2, 0]}]
        ops = [{"op": "scatter", "out": "mi", "inputs": ["s", "i", "v"], "dim": 0, "reduce": "mean"},
               {"op": "scatter", "out": "mx", "inputs": ["s", "i", "v"], "dim": 0, "reduce": "mean", "include_self": False},
               {"op": "scatter", "out": "m2", "inputs": ["t", "j", 3], "dim": 1, "reduce": "mean", "include_self": False},
               {"op": "scatter", "out": "me", "inputs": ["s", "e", "v"], "dim": 0, "reduce": "mean"}]
        out.append((f"sc_mean_{dt.value}", _graph(f"sc_mean_{dt.value}", ins, ops, _outs(ops)),
                    lambda rng, dt=dt: {"s": rand(rng, (m,), dt, -2, 3), "i": rng.integers(0, m, n_src),
                                        "v": rand(rng, (n_src,), dt, -9, 10), "t": rand(rng, (4, 9), dt),
                                        "j": rng.integers(0, 9, (4, 5)).astype(np.int32),
                                        "e": np.zeros((2, 0), np.int64)}))
        ins = [{"name": "s", "dtype": dt.value, "shape": [6, 5]}, {"name": "i", "dtype": "int64", "shape": [8]},
               {"name": "v", "dtype": dt.value, "shape": [8, 5]}, {"name": "q", "dtype": dt.value, "shape": [4, 6]},
               {"name": "k", "dtype": "int32", "shape": [3]}, {"name": "w", "dtype": dt.value, "shape": [4, 3]}]
        # every reduce, include_self both ways and dims 0 and -1 among them (each combination: the GPU tests)
        ops = [{"op": "index_reduce", "out": out, "inputs": ["s", "i", "v"] if dim == 0 else ["q", "k", "w"], "dim": dim,
                "reduce": out.split("_")[0], "include_self": inc}
               for out, dim, inc in (("mul_0", 0, True), ("mean_0", 0, False), ("mean_1", -1, True),
                                     ("amax_0", 0, False), ("amin_1", -1, True), ("add_0", 0, False))]
        out.append((f"sc_index_reduce_{dt.value}", _graph(f"sc_index_reduce_{dt.value}", ins, ops, _outs(ops)),
                    lambda rng, dt=dt: {"s": _unit(rng, (6, 5), dt), "i": rng.integers(0, 6, 8), "v": _unit(rng, (8, 5), dt),
                                        "q": _unit(rng, (4, 6), dt), "k": rng.integers(0, 6, 3).astype(np.int32),
                                        "w": _unit(rng, (4, 3), dt)}))
    return out


def _unit(rng, shape, dt: DType):
    """Values whose products stay exact in every dtype: 1, -1, 2, -2 (and 0 for integers)."""
    vals = np.array([1, -1, 2, -2] + ([0] if not dt.is_float else []))
    if dt is DType.uint8:
        vals = np.array([1, 2, 0, 3])
    return vals[rng.integers(0, len(vals), shape)].astype(dt.np)


def all_op_cases():
    return select_cases() + composite_cases() + cum_extreme_cases() + scatter_mean_cases()
