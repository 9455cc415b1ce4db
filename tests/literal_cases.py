"""Number literals at the extremes of every dtype, in the places a graph puts them into kernel
text: a fill (`full`, `full_like`), a pad value, and an operand of a pointwise op (mul, lt, gt).
Graphs per dtype and chunk of values; the oracle is PyTorch on the CPU (each output computed as torch computes it
from the same Python number). Shared by the emulated kernels (tests/test_literal_rendering.py)
and the GPU (tests/gpu/test_literal_extremes_gpu.py)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import torch
from helpers.torch_oracle import to_numpy

N = 5
FLOATS = ("float16", "bfloat16", "float32", "float64")
INTS = ("uint8", "int8", "int16", "int32", "int64")
DTYPES = ("bool", *INTS, *FLOATS)
TORCH = {"bool": torch.bool, "uint8": torch.uint8, "int8": torch.int8, "int16": torch.int16, "int32": torch.int32,
         "int64": torch.int64, "float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32,
         "float64": torch.float64}
INT64_MIN, INT64_MAX = -2**63, 2**63 - 1


def _float_extremes(dt: str) -> list:
    fi = ml_dtypes.finfo(np.dtype(ml_dtypes.bfloat16) if dt == "bfloat16" else np.dtype(dt))
    return [float(fi.min), float(fi.max), float(fi.tiny), -float(fi.tiny), float(fi.smallest_subnormal),
            -float(fi.smallest_subnormal), float(fi.eps)]


SPECIALS = [0.0, -0.0, math.inf, -math.inf, math.nan]
# every dtype's extremes (ints as Python ints), the float specials, both bools, and an int64 that a
# double cannot hold (2^53 + 1: torch converts a pad value through a double, a fill not)
CANDIDATES = ([True, False, 0, -1, 1, 2**53 + 1, 2**31 - 1, -2**31]
              + [v for dt in INTS for v in (int(np.iinfo(dt).min), int(np.iinfo(dt).max))]
              + [v for dt in FLOATS for v in _float_extremes(dt)] + SPECIALS)


def _fits(v, dt: str) -> bool:
    """torch.full accepts v for dt (no overflow), and an int dtype gets an int or bool."""
    if dt in INTS and isinstance(v, float):
        return False
    try:
        torch.full((N,), v, dtype=TORCH[dt])
    except RuntimeError:
        return False
    return True


BOOL_CANDIDATES = [True, False, 0, 1, 2, INT64_MIN, INT64_MAX, 0.5, -0.0, math.inf, math.nan]


def values(dt: str) -> list:
    out = []
    for v in BOOL_CANDIDATES if dt == "bool" else CANDIDATES:
        if _fits(v, dt) and not any(type(v) is type(w) and (v == w or v != v and w != w) and
                                    math.copysign(1, v) == math.copysign(1, w) for w in out):
            out.append(v)
    return out


def _pad_fits(v, dt: str) -> bool:
    """torch pads with the value as a double; one that leaves an int dtype's range as a double
    (2^63 - 1 becomes 2^63) torch does not refuse, segfuse does (tests/test_validation.py)."""
    if dt in INTS and not np.iinfo(dt).min <= float(v) <= np.iinfo(dt).max:
        return False
    try:
        torch.nn.functional.pad(torch.zeros(1, dtype=TORCH[dt]), (1, 1), value=v)
    except RuntimeError:
        return False
    return True


def _op_fits(fn) -> bool:
    try:
        fn()
    except RuntimeError:
        return False
    return True


CHUNK = 16  # values per graph: a kernel's parameters stay within the emulator's 128


def cases() -> list[tuple[str, int]]:
    """(dtype, chunk) of every graph."""
    return [(dt, c) for dt in DTYPES for c in range(-(-len(values(dt)) // CHUNK))]


def case(dt: str, chunk: int) -> tuple[dict, dict, dict]:
    """(graph, inputs as host arrays, expected outputs as torch tensors) for one dtype and its
    chunk of values."""
    x = torch.zeros(N, dtype=TORCH[dt])
    one = torch.ones(N, dtype=TORCH[dt])
    ops, want = [], {}

    def add(op: dict, expected: torch.Tensor) -> None:
        ops.append(op)
        want[op["out"]] = expected

    for k, v in enumerate(values(dt)[chunk * CHUNK:(chunk + 1) * CHUNK], start=chunk * CHUNK):
        add({"op": "full", "out": f"full_{k}", "shape": [N], "value": v, "dtype": dt},
            torch.full((N,), v, dtype=TORCH[dt]))
        add({"op": "full_like", "out": f"like_{k}", "inputs": ["x"], "value": v}, torch.full_like(x, v))
        if _pad_fits(v, dt):
            add({"op": "pad", "out": f"pad_{k}", "inputs": ["x"], "pad": [1, 1], "value": v},
                torch.nn.functional.pad(x, (1, 1), value=v))
        for name, fn, a in (("mul", torch.mul, one), ("lt", torch.lt, x), ("gt", torch.gt, one)):
            if _op_fits(lambda fn=fn, a=a, v=v: fn(a, v)):
                add({"op": name, "out": f"{name}_{k}", "inputs": ["one" if a is one else "x", v]}, fn(a, v))
    graph = {"format": "segfuse.fusion/1", "name": f"literals_{dt}_{chunk}",
             "inputs": [{"name": "x", "dtype": dt, "shape": [N]}, {"name": "one", "dtype": dt, "shape": [N]}],
             "ops": ops, "outputs": list(want)}
    return graph, {"x": to_numpy(x), "one": to_numpy(one)}, want


def assert_exact(got: np.ndarray, want: torch.Tensor, what: str) -> None:
    """Bit for bit, except that any NaN matches any NaN: -0.0 is not 0.0, a subnormal is not 0."""
    w = to_numpy(want)
    got = np.asarray(got)
    if w.dtype == ml_dtypes.bfloat16 and got.dtype != w.dtype:
        got = got.view(ml_dtypes.bfloat16)  # (bfloat16 travels as its bits)
    assert got.dtype == w.dtype and got.shape == w.shape, f"{what}: {got.dtype}{got.shape} != {w.dtype}{w.shape}"
    if w.dtype.kind == "f" or w.dtype == ml_dtypes.bfloat16:
        both_nan = np.isnan(got.astype(np.float64)) & np.isnan(w.astype(np.float64))
        bits = got.view(f"u{w.dtype.itemsize}") == w.view(f"u{w.dtype.itemsize}")
        ok = both_nan | bits
    else:
        ok = got == w
    assert ok.all(), f"{what}: got {got.tolist()}, PyTorch {w.tolist()}"
