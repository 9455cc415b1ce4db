"""Reduced-precision arithmetic (docs/graph-format.md): float16/bfloat16 floor_divide and the scans
near overflow, issue 15's bfloat16 disagreements with PyTorch on the H200.

Every expected value is computed with torch on the CPU in float32 (float64 for float64) and rounded
to the result dtype once, from the cases' own data: never with segfuse's code. torch's own CPU
results for 16-bit operands differ from that rule where its kernels round intermediate steps (the
tests show that they do on this data). tests/gpu/test_random_graphs_gpu.py runs the same cases on
the CuPy backend (`CASES`, `check`).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
from segfuse.compiler import Engine, Fusion, run_graph
from test_property_graphs import to_numpy, to_torch

HALF = {"float16": torch.float16, "bfloat16": torch.bfloat16}
TDT = {**HALF, "float32": torch.float32, "float64": torch.float64}


def _np(dt: str, values) -> np.ndarray:
    return np.asarray(values, dtype=np.float64).astype(ml_dtypes.bfloat16 if dt == "bfloat16" else dt)


def _graph(op: str, operands: list, inputs: dict, **attrs) -> dict:
    return {"format": "segfuse.fusion/1", "name": f"rp_{op}",
            "inputs": [{"name": n, "dtype": str(a.dtype), "shape": list(a.shape)} for n, a in inputs.items()],
            "ops": [{"op": op, "out": "y", "inputs": operands, **attrs}], "outputs": ["y"]}


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
    return _np(dt, np.where(v == 0, 1.0, v))


def _floordiv_cases() -> dict:
    cases = {}
    for dt in HALF:
        a, b = _wide(dt, 4096, 1), _wide(dt, 4096, 2)
        cases[f"floordiv_{dt}_tensors"] = (["a", "b"], {"a": a, "b": b}, _floordiv_expected(dt, a, b))
        # issue 15: floor_divide(-3, x) on the H200's [2, 128, 1024] bfloat16 data (-3 // -0.0236)
        x = _np(dt, np.random.default_rng(3).standard_normal((2, 128, 16)) * 3)
        x.reshape(-1)[:4] = _np(dt, [-0.0236, 0.0058, -0.0118, 0.0291])
        cases[f"floordiv_{dt}_literal_dividend"] = ([-3, "x"], {"x": x}, _floordiv_expected(dt, -3, x))
        cases[f"floordiv_{dt}_literal_divisor"] = (["x", -1.5], {"x": x}, _floordiv_expected(dt, x, -1.5))
        d = np.asarray(-0.1)  # a 0-d float64 divisor: read at float32 precision, not rounded first
        cases[f"floordiv_{dt}_0d_divisor"] = (["x", "d"], {"x": x, "d": d}, _floordiv_expected(dt, x, d))
        # pytorch/pytorch#193754: 560 // 3 is 186 (torch's vectorized bfloat16 kernel: 187), and signs
        k = _np(dt, [560, -560, 560, 2158, -2158, 86.5625, -86.5625])
        m = _np(dt, [3, 3, -3, 3, 3, 28.859375, 28.859375])
        cases[f"floordiv_{dt}_known"] = (["k", "m"], {"k": k, "m": m}, _floordiv_expected(dt, k, m))
    special = [0.0, -0.0, 1.0, -1.0, 3.0, -2.5, 0.1, np.inf, -np.inf, np.nan, 1e-3]
    for dt in ("float16", "bfloat16", "float32", "float64"):
        p = np.array([(u, v) for u in special for v in special]).T
        a, b = _np(dt, p[0]), _np(dt, p[1])
        cases[f"floordiv_{dt}_special"] = (["a", "b"], {"a": a, "b": b}, _floordiv_expected(dt, a, b))
    for dt in ("float32", "float64"):  # floor(a / b) is one too high here (the quotient rounds up)
        a, b = _np(dt, [1.0, -1.0, 1.588939]), _np(dt, [0.1, 0.1, 0.02371551])
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
    return _np(dt, x)


def _overflowing_sums(dt: str, rows: int, n: int, seed: int) -> np.ndarray:
    """Rows of one sign each whose sums overflow the dtype (exact: few distinct exponents)."""
    r = np.random.default_rng(seed)
    e = _top(dt)
    x = r.choice([2.0 ** (e - 3), 2.0 ** (e - 2), 1.5 * 2.0 ** (e - 3), 0.0], (rows, n)) * r.choice([1.0, -1.0], (rows, 1))
    # 2^e + 2^(e-1) + ...: the largest value, then one that is finite in float32 and rounds to inf
    k = 8 if dt == "bfloat16" else 11
    x[0, :k + 1] = [2.0 ** (e - j) for j in range(k + 1)]
    return _np(dt, x)


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
    x = _np("float16", [[256, 512, 2.0 ** -10, 4, 0.5], [60000, 60000, -60000, 1, -60000]])
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
    fusion = Fusion.from_json(_graph(op, operands, inputs, **attrs))
    got = np.asarray(run(fusion, {k: v.copy() for k, v in inputs.items()})["y"])
    assert str(got.dtype) == {torch.bfloat16: "bfloat16"}.get(want.dtype, str(want.dtype).replace("torch.", ""))
    if not same_bits(got, want):
        g, w = to_torch(got).double().flatten(), want.double().flatten()
        bad = torch.nonzero(~((g == w) | (torch.isnan(g) & torch.isnan(w)))).flatten()[:6].tolist()
        raise AssertionError(f"{name}: {len(bad)}+ elements differ, e.g. at {bad}: got {g[bad].tolist()}, "
                             f"expected {w[bad].tolist()}")


@pytest.mark.parametrize("name", sorted(CASES))
def test_reduced_precision_cases(name):
    check(name, lambda f, i: run_graph(f, i))
    check(name, lambda f, i: Engine().run(f, i).outputs)


# ---- the cases are not vacuous -----------------------------------------------------------------
def test_torch_cpu_rounds_16_bit_floor_divide_steps():
    # torch's CPU kernel for two bfloat16/float16 tensors rounds each step of its formula, so it
    # differs from the float32 rule on this data (the disagreement issue 15 saw on the H200)
    for dt in HALF:
        _, _, ins, want, _ = CASES[f"floordiv_{dt}_tensors"]
        native = torch.floor_divide(to_torch(ins["a"]), to_torch(ins["b"]))
        assert not same_bits(to_numpy(native), want), dt
    k, m = to_torch(_np("bfloat16", [560, 560])), to_torch(_np("bfloat16", [3, 3]))
    assert torch.floor_divide(k, m).tolist() == [187.0, 187.0]  # pytorch/pytorch#193754
    assert CASES["floordiv_bfloat16_known"][3][0].item() == 186.0


def test_scan_cases_reach_overflow_both_ways():
    for dt in HALF:
        for op in ("cumprod", "cumsum"):
            want = CASES[f"{op}_{dt}_overflow_dim-1"][3]
            assert bool((want == float("inf")).any()) and bool((want == float("-inf")).any()), (op, dt)
            assert bool(torch.isfinite(want).any()), (op, dt)
        p, q = CASES[f"cumprod_{dt}_overflow_dim-1"][3], CASES[f"cumsum_{dt}_overflow_dim-1"][3]
        top = torch.finfo(HALF[dt]).max
        assert p[1, 2].item() == top and p[0, 2].item() < top and p[0, 4].item() == float("inf"), dt
        k = 8 if dt == "bfloat16" else 11
        assert q[0, k - 1].item() == top and q[0, k].item() == float("inf"), dt
    assert CASES["cumsum_float16_back_from_overflow"][3].tolist() == [[60000.0, float("inf"), 60000.0, 60000.0, 1.0]]
    assert CASES["cumprod_float16_back_from_overflow"][3].tolist() == [[256.0, float("inf"), 128.0, 512.0, 256.0]]
