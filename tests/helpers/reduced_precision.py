"""Reduced-precision cases (docs/graph-format.md): float16/bfloat16 floor_divide and scans near
overflow, each with its expected result computed with torch on the CPU in float32 (float64 for
float64) and rounded to the result dtype once, from the case's own data: never with segfuse's
code. tests/test_reduced_precision.py runs them on the CPU, tests/gpu/test_random_graphs_gpu.py
on the CuPy backend."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch
from segfuse.compiler import Fusion

from helpers.graphs import one_op
from helpers.torch_oracle import to_torch

HALF = {"float16": torch.float16, "bfloat16": torch.bfloat16}
TDT = {**HALF, "float32": torch.float32, "float64": torch.float64}


def half_array(dt: str, values) -> np.ndarray:
    """`values` as an array of dtype `dt` (ml_dtypes' bfloat16 for bfloat16)."""
    return np.asarray(values, dtype=np.float64).astype(ml_dtypes.bfloat16 if dt == "bfloat16" else dt)


def _opmath(dt: str) -> torch.dtype:
    return torch.float64 if dt == "float64" else torch.float32


# ---- floor_divide ----------------------------------------------------------------------------
def _floordiv_expected(dt: str, a, b) -> torch.Tensor:
    """floor_divide in float32 (float64), rounded once. A number or 0-d divisor is read at that
    precision; a number dividend is first rounded to the result dtype (PyTorch's promotion)."""
    w = _opmath(dt)
    ta = torch.as_tensor(a).to(TDT[dt]).to(w) if not isinstance(a, np.ndarray) else to_torch(a).to(w)
    tb = b if isinstance(b, (int, float)) else to_torch(b).to(w)
    return torch.floor_divide(ta, tb).to(TDT[dt])


def _wide(dt: str, n: int, seed: int) -> np.ndarray:
    """Both signs, magnitudes from 2^-8 to 2^12 (large quotients: where 16-bit steps go wrong)."""
    r = np.random.default_rng(seed)
    v = r.standard_normal(n) * np.exp2(r.integers(-8, 12, n))
    return half_array(dt, np.where(v == 0, 1.0, v))


def _floordiv_cases() -> dict:
    cases = {}
    for dt in HALF:
        a, b = _wide(dt, 4096, 1), _wide(dt, 4096, 2)
        cases[f"floordiv_{dt}_tensors"] = (["a", "b"], {"a": a, "b": b}, _floordiv_expected(dt, a, b))
        # issue 15: floor_divide(-3, x) on the H200's [2, 128, 1024] bfloat16 data (-3 // -0.0236)
        x = half_array(dt, np.random.default_rng(3).standard_normal((2, 128, 16)) * 3)
        x.reshape(-1)[:4] = half_array(dt, [-0.0236, 0.0058, -0.0118, 0.0291])
        cases[f"floordiv_{dt}_literal_dividend"] = ([-3, "x"], {"x": x}, _floordiv_expected(dt, -3, x))
        cases[f"floordiv_{dt}_literal_divisor"] = (["x", -1.5], {"x": x}, _floordiv_expected(dt, x, -1.5))
        d = np.asarray(-0.1)  # a 0-d float64 divisor: read at float32 precision, not rounded first
        cases[f"floordiv_{dt}_0d_divisor"] = (["x", "d"], {"x": x, "d": d}, _floordiv_expected(dt, x, d))
        # pytorch/pytorch#193754: 560 // 3 is 186 (torch's vectorized bfloat16 kernel: 187), and signs
        k = half_array(dt, [560, -560, 560, 2158, -2158, 86.5625, -86.5625])
        m = half_array(dt, [3, 3, -3, 3, 3, 28.859375, 28.859375])
        cases[f"floordiv_{dt}_known"] = (["k", "m"], {"k": k, "m": m}, _floordiv_expected(dt, k, m))
    special = [0.0, -0.0, 1.0, -1.0, 3.0, -2.5, 0.1, np.inf, -np.inf, np.nan, 1e-3]
    for dt in ("float16", "bfloat16", "float32", "float64"):
        p = np.array([(u, v) for u in special for v in special]).T
        a, b = half_array(dt, p[0]), half_array(dt, p[1])
        cases[f"floordiv_{dt}_special"] = (["a", "b"], {"a": a, "b": b}, _floordiv_expected(dt, a, b))
    for dt in ("float32", "float64"):  # floor(a / b) is one too high here (the quotient rounds up)
        a, b = half_array(dt, [1.0, -1.0, 1.588939]), half_array(dt, [0.1, 0.1, 0.02371551])
        cases[f"floordiv_{dt}_rounded_quotient"] = (["a", "b"], {"a": a, "b": b}, _floordiv_expected(dt, a, b))
    return {k: ("floor_divide", ops, ins, exp, {}) for k, (ops, ins, exp) in cases.items()}


# ---- scans near overflow -----------------------------------------------------------------------
def _scan_expected(op: str, dt: str, x: np.ndarray, dim: int) -> torch.Tensor:
    """The scan of the values widened to float32, rounded to the dtype. torch's CPU scan carries
    float32 in float64; the cases' partial results are exact in float32 and their magnitudes never
    fall after an overflow, so the wider carry changes nothing (its cast to float32 overflows
    where a float32 carry does)."""
    return getattr(torch, op)(to_torch(x).to(torch.float32), dim=dim).to(TDT[dt])


def _top(dt: str) -> int:
    """The exponent of the dtype's largest binade (bfloat16 shares float32's)."""
    return 15 if dt == "float16" else 127


def _overflowing_products(dt: str, rows: int, n: int, seed: int) -> np.ndarray:
    """Rows that reach the dtype's largest binade and overflow: factors of magnitude >= 1 (no
    partial product is larger than the prefix it belongs to, so every combining order gives the same
    result), both signs (+inf and -inf), at most 7 non-powers of two per row (exact in float32)."""
    r = np.random.default_rng(seed)
    e = _top(dt)
    x = r.choice([1.0, 2.0, 4.0, 1.0], (rows, n)) * r.choice([1.0, -1.0], (rows, n))
    x[:, 0], x[:, 1] = 2.0 ** (e // 2), 2.0 ** (e - e // 2 - 4) * r.choice([1.0, -1.0], rows)
    cols = r.integers(2, n, (rows, 7))
    x[np.arange(rows)[:, None], cols] *= r.choice([1.5, 1.25, 1.75, 1.0], (rows, 7))
    # near the maximum: 1.984375 * 1.0078125 * 2^e is finite in float32 and rounds to inf; the
    # largest value itself (bfloat16: 1.9921875 * 2^127, float16: 65504) stays
    x[0, :5] = [2.0 ** (e // 2), 2.0 ** (e - e // 2), 1.984375, 1.0, 1.0078125]
    x[1, :4] = [2.0 ** (e // 2), 2.0 ** (e - e // 2), 2.0 - 2.0 ** (-7 if dt == "bfloat16" else -10), 1.0]
    return half_array(dt, x)


def _overflowing_sums(dt: str, rows: int, n: int, seed: int) -> np.ndarray:
    """Rows of one sign each whose sums overflow the dtype (exact: few distinct exponents)."""
    r = np.random.default_rng(seed)
    e = _top(dt)
    x = r.choice([2.0 ** (e - 3), 2.0 ** (e - 2), 1.5 * 2.0 ** (e - 3), 0.0], (rows, n)) * r.choice([1.0, -1.0], (rows, 1))
    # 2^e + 2^(e-1) + ...: the largest value, then one that is finite in float32 and rounds to inf
    k = 8 if dt == "bfloat16" else 11
    x[0, :k + 1] = [2.0 ** (e - j) for j in range(k + 1)]
    return half_array(dt, x)


def _scan_cases() -> dict:
    cases = {}
    for dt in HALF:
        for op, x in (("cumprod", _overflowing_products(dt, 16, 24, 4)), ("cumsum", _overflowing_sums(dt, 16, 24, 5))):
            for dim in (-1, 0):
                xs = x if dim == -1 else np.ascontiguousarray(x.T)
                cases[f"{op}_{dt}_overflow_dim{dim}"] = (op, ["x"], {"x": xs}, _scan_expected(op, dt, xs, dim),
                                                         {"dim": dim})
    # float16 outputs overflow long before the float32 carry does: the carry keeps the value, later
    # outputs are finite again (torch's CUDA scan carries float16 and stays at inf)
    x = half_array("float16", [[256, 512, 2.0 ** -10, 4, 0.5], [60000, 60000, -60000, 1, -60000]])
    cases["cumprod_float16_back_from_overflow"] = ("cumprod", ["x"], {"x": x[:1]},
                                                   _scan_expected("cumprod", "float16", x[:1], -1), {"dim": -1})
    cases["cumsum_float16_back_from_overflow"] = ("cumsum", ["x"], {"x": x[1:]},
                                                  _scan_expected("cumsum", "float16", x[1:], -1), {"dim": -1})
    return cases


CASES = {**_floordiv_cases(), **_scan_cases()}


def same_bits(got, want: torch.Tensor) -> bool:
    """Equal values, NaN where NaN, and the same sign of zero (and of infinities)."""
    g = to_torch(np.asarray(got)).to(torch.float64)
    w = want.to(torch.float64)
    nan = torch.isnan(g) & torch.isnan(w)
    return g.shape == w.shape and bool((nan | ((g == w) & (torch.signbit(g) == torch.signbit(w)))).all())


def check(name: str, run) -> None:
    """`run(fusion, inputs) -> outputs` against the case's expected values, bit for bit."""
    op, operands, inputs, want, attrs = CASES[name]
    fusion = Fusion.from_json(one_op(op, inputs, operands, out="y", **attrs))
    got = np.asarray(run(fusion, {k: v.copy() for k, v in inputs.items()})["y"])
    assert str(got.dtype) == {torch.bfloat16: "bfloat16"}.get(want.dtype, str(want.dtype).replace("torch.", ""))
    if not same_bits(got, want):
        g, w = to_torch(got).double().flatten(), want.double().flatten()
        bad = torch.nonzero(~((g == w) | (torch.isnan(g) & torch.isnan(w)))).flatten()[:6].tolist()
        raise AssertionError(f"{name}: {len(bad)}+ elements differ, e.g. at {bad}: got {g[bad].tolist()}, "
                             f"expected {w[bad].tolist()}")
