"""Scatter graphs that two bugs broke, with inputs and PyTorch answers, for the emulator's tests
(tests/test_scatter_kernels_emulated.py) and the GPU's (tests/gpu/test_scatter_gpu.py)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch


def private_copy_graph() -> dict:
    """The first case as found: `i` is the index of one scatter and the self of another, so the
    second scatters into a copy of `i` that a grid segment makes; its result is read by a gather
    in the same single-block segment."""
    return {"format": "segfuse.fusion/1", "name": "private_copy_scatter",
            "inputs": [{"name": "x", "dtype": "bool", "shape": [128, 1024]},
                       {"name": "i", "dtype": "int64", "shape": [1, 1]},
                       {"name": "v", "dtype": "int64", "shape": [1, 1]},
                       {"name": "j", "dtype": "int64", "shape": [1, 1]},
                       {"name": "k", "dtype": "int64", "shape": [1, 1]}],
            "ops": [{"op": "scatter", "out": "s", "inputs": ["x", "i", True], "dim": 0},
                    {"op": "cast", "out": "c", "inputs": ["x"], "dtype": "bool"},
                    {"op": "scatter", "out": "a", "inputs": ["i", "j", "v"], "dim": 0, "reduce": "add"},
                    {"op": "gather", "out": "g", "inputs": ["a", "k"], "dim": 0}],
            "outputs": ["g", "c", "s"]}


def private_copy_inputs(seed: int) -> dict:
    r = np.random.default_rng(seed)
    return {"x": r.random((128, 1024)) < 0.5, "i": r.integers(0, 128, (1, 1)), "v": r.integers(-9, 9, (1, 1)),
            "j": np.zeros((1, 1), np.int64), "k": np.zeros((1, 1), np.int64)}


def private_copy_want(ins: dict) -> dict:
    t = {n: torch.from_numpy(a) for n, a in ins.items()}
    a = t["i"].scatter_add(0, t["j"], t["v"])
    return {"g": a.gather(0, t["k"]).numpy(), "c": ins["x"], "s": t["x"].scatter(0, t["i"], True).numpy()}


NP16 = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
T16 = {"float16": torch.float16, "bfloat16": torch.bfloat16}


def wide_graph(dt: str, n_out: int, n_dom: int, reduce: str, include_self: bool, then: bool) -> dict:
    """y = x.scatter_reduce(0, idx, src, reduce, include_self) of a 16-bit x; with `then`, y is an
    intermediate and the graph returns y * 2 (exact in every float type)."""
    red = {"format": "segfuse.fusion/1", "name": f"wide_{dt}_{reduce}_{int(include_self)}_{int(then)}",
           "inputs": [{"name": "x", "dtype": dt, "shape": [n_out]}, {"name": "idx", "dtype": "int64", "shape": [n_dom]},
                      {"name": "src", "dtype": dt, "shape": [n_dom]}],
           "ops": [{"op": "scatter", "out": "y", "inputs": ["x", "idx", "src"], "dim": 0, "reduce": reduce,
                    "include_self": include_self}],
           "outputs": ["y"]}
    if then:
        red["ops"].append({"op": "mul", "out": "z", "inputs": ["y", 2]})
        red["outputs"] = ["z"]
    return red


def wide_inputs(dt: str, n_out: int, n_dom: int, reduce: str, seed: int) -> dict:
    r = np.random.default_rng(seed)
    hot = r.integers(0, max(1, n_out // 16), n_dom)  # most sources on a few targets
    idx = np.where(r.random(n_dom) < 0.75, hot, r.integers(0, n_out, n_dom)).astype(np.int64)
    if reduce == "mul":  # factors near 1: products of thousands stay in range, each rounding matters
        src, x = 1 + r.uniform(-1 / 64, 1 / 64, n_dom), r.uniform(0.5, 2, n_out)
    else:
        src, x = r.uniform(0.5, 1.5, n_dom), r.standard_normal(n_out) * 4
    return {"x": x.astype(NP16[dt]), "idx": idx, "src": src.astype(NP16[dt])}


def wide_want(ins: dict, reduce: str, include_self: bool, then: bool, dt: str) -> np.ndarray:
    """In float64, rounded to the 16-bit type once (float32's accumulation is within a rounding)."""
    x, src = (torch.from_numpy(ins[k].astype(np.float64)) for k in ("x", "src"))
    y = x.scatter_reduce(0, torch.from_numpy(ins["idx"]), src, "sum" if reduce == "add" else "prod",
                         include_self=include_self)
    y = y.to(T16[dt]).double()
    return (y * 2 if then else y).numpy()


def ulps(got: np.ndarray, want: np.ndarray, dt: str) -> np.ndarray:
    """|got - want| in units of the 16-bit type's spacing at want."""
    w = want.astype(NP16[dt])
    spacing = np.spacing(w) if dt == "float16" else np.spacing(w.astype(np.float32)) * 65536  # (8 significand bits)
    return np.abs(got.astype(np.float64) - want) / np.abs(spacing.astype(np.float64))




def check_wide(out: np.ndarray, ins: dict, dt: str, reduce: str, include_self: bool, then: bool) -> None:
    """A 16-bit result within one rounding of the float64 answer (the bug left them up to 27 ulps off)."""
    out = out.view(NP16[dt]) if out.dtype != NP16[dt] else out  # (bfloat16 comes back as uint16 bits)
    off = ulps(out, wide_want(ins, reduce, include_self, then, dt), dt)
    assert off.max() <= 1, f"{int((off > 1).sum())} of {off.size} elements more than one rounding off (max {off.max():.1f} ulps)"


# (n_out, n_dom): one block (the target in shared memory); a single-block segment whose first phase
# 4 blocks share (segmenter/spread.py); a grid with per-block histograms (n_dom >= 8 n_out, >= 4096);
# a grid with global atomics (a target too large to privatize)
SIZES = {"single block": (64, 3000), "single block, 4 blocks": (64, 32768), "grid, histograms": (256, 40000),
         "grid, global atomics": (20000, 40000)}
# (dtype, size, reduce, include_self, then): test_16bit_scatter_sums_round_once's cases
WIDE_CASES = [(dt, size, reduce, inc, then) for dt in ("float16", "bfloat16") for size in SIZES
              for reduce, inc, then in (("add", True, False), ("add", True, True), ("add", False, False), ("mul", True, False))]
