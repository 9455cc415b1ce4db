"""Every pointwise op and cast against PyTorch on the CPU (the oracle).

For each op and combination of operand dtypes (tensors with dims, 0-d tensors and Python
number literals), segfuse must raise GraphError at validation exactly when torch raises;
otherwise the result dtype must equal torch's and the values must match (exactly for
integers and bools, within a tolerance for floats).
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import torch_oracle
from helpers.graphs import one_op
from helpers.torch_oracle import to_numpy
from segfuse.compiler import Fusion, GraphError, RunError, run_graph

DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
FLOATS = ["float16", "bfloat16", "float32", "float64"]
INTS = ["uint8", "int8", "int16", "int32", "int64"]
TORCH = {d: getattr(torch, d) for d in DTYPES}
FROM_TORCH = {v: k for k, v in TORCH.items()}
LITERALS = [True, 3, -2, 2.5, -0.75]

# ---- helpers ------------------------------------------------------------------------------


def gen_for(*parts) -> torch.Generator:
    """A generator seeded from the test's parameters (stable across processes)."""
    return torch.Generator().manual_seed(zlib.crc32(repr(parts).encode()))


def rand(dtype: str, shape, gen: torch.Generator, kind: str = "any") -> torch.Tensor:
    """Random data. kind: any, nonzero (divisors), exponent (small non-negative), positive."""
    shape = tuple(shape)
    if dtype == "bool":
        if kind in ("nonzero", "positive"):
            return torch.ones(shape, dtype=torch.bool)
        if kind == "exponent":
            return torch.randint(0, 2, shape, generator=gen).bool()
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype in INTS:
        lo = 0 if dtype == "uint8" else -12
        if kind == "exponent":
            lo, hi = 0, 4
        elif kind == "positive":
            lo, hi = 1, 12
        else:
            hi = 12
        t = torch.randint(lo, hi + 1, shape, generator=gen, dtype=torch.int64)
        if kind == "nonzero":
            t = torch.where(t == 0, torch.full_like(t, 5), t)
        return t.to(TORCH[dtype])
    t = torch.randn(shape, generator=gen, dtype=torch.float64) * 3
    if kind == "positive":
        t = t.abs() + 0.1
    return t.to(TORCH[dtype])


def tol(dtype) -> dict:
    d = FROM_TORCH[dtype] if isinstance(dtype, torch.dtype) else dtype
    return {"float16": dict(rtol=2e-3, atol=1e-4), "bfloat16": dict(rtol=1.6e-2, atol=1e-3),
            "float32": dict(rtol=1e-5, atol=1e-6), "float64": dict(rtol=1e-10, atol=1e-12)}.get(d, dict(rtol=0, atol=0))


def check_same(actual: np.ndarray, expected: torch.Tensor, what: str = "") -> None:
    torch_oracle.check_same(actual, expected, what, tol(expected.dtype))


def torch_outcome(fn):
    """(result, None) or (None, exception) of a torch call; only RuntimeError-like raises count."""
    try:
        return fn(), None
    except (RuntimeError, TypeError, NotImplementedError, ValueError) as e:
        return None, e


def run_one(op: str, operands: list, n_out: int = 1, **attrs):
    """Build a one-op graph over torch tensors / literals and run it; returns (fusion or GraphError, outputs)."""
    inputs, names, arrays = [], [], {}
    for k, x in enumerate(operands):
        if isinstance(x, torch.Tensor):
            name = f"x{k}"
            inputs.append((name, FROM_TORCH[x.dtype], list(x.shape)))
            arrays[name] = to_numpy(x)
            names.append(name)
        else:
            names.append(x)
    g = one_op(op, inputs, names, n_out=n_out, **attrs)
    fusion = Fusion.from_json(g)
    res = run_graph(fusion, arrays)
    return [res[o] for o in ([g["outputs"][0]] if n_out == 1 else g["outputs"])]


def compare(op: str, operands: list, oracle, what: str = "", **attrs) -> None:
    """segfuse raises GraphError iff torch raises; else dtype and values equal torch's."""
    expected, err = torch_outcome(oracle)
    if err is not None:
        with pytest.raises(GraphError):
            run_one(op, operands, **attrs)
        return
    (out,) = run_one(op, operands, **attrs)
    check_same(out, expected, what or op)


# ---- the oracle for each op -----------------------------------------------------------------
def _ceil_div(a, b):
    dt = torch.result_type(a, b)
    if dt.is_floating_point or dt == torch.bool:
        if dt == torch.bool:
            return torch.floor_divide(a, b)  # raises for bool, as ceil_div must
        # computed in opmath (float32 for float16/bfloat16), as torch's floor_divide is
        op = torch.float64 if dt == torch.float64 else torch.float32
        up = lambda x: torch.as_tensor(x).to(dt).to(op)  # noqa: E731
        return torch.ceil(up(a) / up(b)).to(dt)
    # integers: operands converted to the result dtype, then ceil(a / b) exactly in int64
    a64 = torch.as_tensor(a).to(dt).to(torch.int64)
    b64 = torch.as_tensor(b).to(dt).to(torch.int64)
    return (-torch.floor_divide(-a64, b64)).to(dt)


UNARY = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "exp2": torch.exp2, "expm1": torch.expm1,
    "log": torch.log, "log2": torch.log2, "log10": torch.log10, "log1p": torch.log1p, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "sin": torch.sin, "cos": torch.cos, "tan": torch.tan, "tanh": torch.tanh,
    "sigmoid": torch.sigmoid, "relu": torch.relu, "silu": F.silu, "gelu": F.gelu, "erf": torch.erf,
    "floor": torch.floor, "ceil": torch.ceil, "round": torch.round, "trunc": torch.trunc, "sign": torch.sign,
    "reciprocal": torch.reciprocal, "logical_not": torch.logical_not, "bitwise_not": torch.bitwise_not,
    "isnan": torch.isnan, "isinf": torch.isinf, "isfinite": torch.isfinite,
}
BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "floor_divide": torch.floor_divide,
    "remainder": torch.remainder, "fmod": torch.fmod, "pow": torch.pow, "maximum": torch.maximum,
    "minimum": torch.minimum, "atan2": torch.atan2, "eq": torch.eq, "ne": torch.ne, "lt": torch.lt,
    "le": torch.le, "gt": torch.gt, "ge": torch.ge, "logical_and": torch.logical_and,
    "logical_or": torch.logical_or, "logical_xor": torch.logical_xor, "bitwise_and": torch.bitwise_and,
    "bitwise_or": torch.bitwise_or, "bitwise_xor": torch.bitwise_xor, "left_shift": torch.bitwise_left_shift,
    "right_shift": torch.bitwise_right_shift, "ceil_div": _ceil_div,
}
DIVLIKE = {"floor_divide", "remainder", "fmod", "ceil_div"}
SHIFTS = {"left_shift", "right_shift"}


def second_kind(op: str) -> str:
    if op in DIVLIKE:
        return "nonzero"
    if op == "pow":
        return "exponent"
    if op in SHIFTS:
        return "exponent"
    return "any"


def call_binary(op: str, a, b):
    """torch's result for op(a, b) where a or b may be a Python number (a weakly typed scalar).

    Python numbers go straight to torch where it takes them (`t + 3`, `torch.pow(2, t)`). For
    functions without a Scalar overload, the number becomes a 0-d tensor of its default dtype
    (int64, float32, bool) and the tensor operand gets at least one dim: a 0-d tensor against a
    tensor with dims is in the same lower priority group as a wrapped number, so torch promotes
    exactly as it would for the Python number.
    """
    fn = BINARY[op]
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return fn(a, b)
    try:
        return fn(a, b)
    except TypeError:
        pass
    t = a if isinstance(a, torch.Tensor) else b
    wrap = lambda x: torch.tensor(x) if not isinstance(x, torch.Tensor) else x.reshape(x.shape or (1,))  # noqa: E731
    return fn(wrap(a), wrap(b)).reshape(t.shape)


# ---- unary ops ------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary(op, dtype):
    gen = gen_for(op, dtype)
    x = rand(dtype, (3, 5), gen)
    compare(op, [x], lambda: UNARY[op](x), f"{op}({dtype})")


@pytest.mark.parametrize("op", sorted(UNARY))
@pytest.mark.parametrize("shape", [(), (0,), (2, 0, 3), (1, 1)])
def test_unary_shapes(op, shape):
    gen = torch.Generator().manual_seed(7)
    x = rand("float32", shape, gen)
    compare(op, [x], lambda: UNARY[op](x), f"{op}{shape}")


SPECIALS = [float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 1e-3, 65504.0, -1.0]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_nan_inf(op, dtype):
    x = torch.tensor(SPECIALS, dtype=torch.float64).to(TORCH[dtype])
    oracle = lambda: UNARY[op](x)  # noqa: E731
    if op == "gelu":
        # torch's vectorized float32/bfloat16 gelu gives gelu(inf) = nan, its float16 and float64
        # kernels give inf (the limit); segfuse follows the float64 kernel.
        oracle = lambda: UNARY[op](x.double()).to(x.dtype)  # noqa: E731
    compare(op, [x], oracle, f"{op}({dtype} specials)")


# ---- binary ops: dtype promotion --------------------------------------------------------------
@pytest.mark.parametrize("dtb", DTYPES)
@pytest.mark.parametrize("dta", DTYPES)
@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_dtypes(op, dta, dtb):
    gen = gen_for(op, dta, dtb)
    a = rand(dta, (3, 4), gen)
    b = rand(dtb, (4,), gen, second_kind(op))
    compare(op, [a, b], lambda: call_binary(op, a, b), f"{op}({dta}[3,4], {dtb}[4])")
    # a 0-d tensor is in a lower priority group than a tensor with dims, on either side
    b0 = rand(dtb, (), gen, second_kind(op))
    compare(op, [a, b0], lambda: call_binary(op, a, b0), f"{op}({dta}[3,4], {dtb}[])")
    a0 = rand(dta, (), gen)
    b1 = rand(dtb, (5,), gen, second_kind(op))
    compare(op, [a0, b1], lambda: call_binary(op, a0, b1), f"{op}({dta}[], {dtb}[5])")


@pytest.mark.parametrize("lit", LITERALS, ids=repr)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_literals(op, dtype, lit):
    gen = gen_for(op, dtype, repr(lit))
    # tensor op literal
    a = rand(dtype, (2, 3), gen)
    rdt = torch.result_type(a, lit)
    int_result = not rdt.is_floating_point
    if not (op == "pow" and int_result and isinstance(lit, int) and lit < 0):
        compare(op, [a, lit], lambda: call_binary(op, a, lit), f"{op}({dtype}, {lit!r})")
    # literal op tensor
    b = rand(dtype, (2, 3), gen, second_kind(op))
    compare(op, [lit, b], lambda: call_binary(op, lit, b), f"{op}({lit!r}, {dtype})")
    # literal op 0-d tensor: the 0-d tensor's dtype still wins within its category
    b0 = rand(dtype, (), gen, second_kind(op))
    compare(op, [lit, b0], lambda: call_binary(op, lit, b0), f"{op}({lit!r}, {dtype}[])")


@pytest.mark.parametrize("op", sorted(BINARY))
def test_binary_two_literals_rejected(op):
    with pytest.raises(GraphError) as e:
        Fusion.from_json(one_op(op, [], [2, 3]))
    assert e.value.issues[0].loc[:2] == ("ops", 0)


# ---- broadcasting ---------------------------------------------------------------------------
BROADCASTS = [((3, 1, 4), (2, 4)), ((), (2, 3)), ((2, 3), ()), ((0, 3), (1, 3)), ((2, 0), ()), ((1,), (5,)),
              ((4, 1), (1, 5)), ((1, 1, 1), (2, 3)), ((0,), (0,)), ((2, 1, 0), (3, 1))]


@pytest.mark.parametrize("sa,sb", BROADCASTS, ids=str)
@pytest.mark.parametrize("op", ["add", "mul", "maximum", "lt", "atan2", "bitwise_xor", "pow", "remainder"])
def test_binary_broadcast(op, sa, sb):
    gen = torch.Generator().manual_seed(11)
    dt = "int32" if op in ("bitwise_xor", "remainder") else "float32"
    a = rand(dt, sa, gen)
    b = rand(dt, sb, gen, second_kind(op))
    compare(op, [a, b], lambda: call_binary(op, a, b), f"{op}({sa}, {sb})")


@pytest.mark.parametrize("sa,sb", [((3,), (4,)), ((2, 3), (3, 2)), ((0,), (2,)), ((2, 3, 4), (5, 4))], ids=str)
def test_binary_broadcast_mismatch(sa, sb):
    with pytest.raises(RuntimeError):
        torch.add(torch.zeros(sa), torch.zeros(sb))
    with pytest.raises(GraphError) as e:
        Fusion.from_json(one_op("add", [("a", "float32", sa), ("b", "float32", sb)], ["a", "b"]))
    (issue,) = e.value.issues
    assert issue.loc[:2] == ("ops", 0) and "broadcast" in issue.msg


# ---- NaN / inf / signed zero in binary ops ------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", sorted(set(BINARY) - {"bitwise_and", "bitwise_or", "bitwise_xor", "left_shift",
                                                     "right_shift"}))
def test_binary_nan_inf(op, dtype):
    vals = torch.tensor(SPECIALS, dtype=torch.float64)
    a = vals.repeat_interleave(len(SPECIALS)).to(TORCH[dtype])  # every pair, including x/0 and 0/0
    b = vals.repeat(len(SPECIALS)).to(TORCH[dtype])
    compare(op, [a, b], lambda: call_binary(op, a, b), f"{op}({dtype} specials)")


# ---- integer errors at run time -------------------------------------------------------------
@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("op", sorted(DIVLIKE))
def test_integer_division_by_zero(op, dtype):
    a = torch.arange(1, 7).to(TORCH[dtype])
    b = torch.tensor([1, 2, 0, 3, 1, 1]).to(TORCH[dtype])
    if op != "ceil_div":
        with pytest.raises(RuntimeError):  # torch on the CPU: ZeroDivisionError
            BINARY[op](a, b)
    with pytest.raises(RunError) as e:
        run_one(op, [a, b])
    assert e.value.issues[0].loc[:2] == ("ops", 0)
    with pytest.raises(RunError):
        run_one(op, [a, 0])


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64"])
def test_integer_negative_power(dtype):
    # torch raises for a negative scalar exponent; for a tensor exponent its CPU kernel computes
    # 1 / a in integers, segfuse raises there too (a documented difference)
    a = torch.arange(1, 5).to(TORCH[dtype])
    b = torch.tensor([1, -1, 2, 0]).to(TORCH[dtype])
    with pytest.raises(RunError) as e:
        run_one("pow", [a, b])
    assert e.value.issues[0].loc[:2] == ("ops", 0)
    with pytest.raises(RuntimeError):
        torch.pow(a, -2)
    with pytest.raises(RunError):
        run_one("pow", [a, -2])


@pytest.mark.parametrize("dtype", FLOATS)
def test_float_division_by_zero_is_ieee(dtype):
    a = torch.tensor([1.0, -1.0, 0.0, 3.0]).to(TORCH[dtype])
    z = torch.zeros(4).to(TORCH[dtype])
    for op in ("div", "floor_divide", "remainder", "fmod"):
        compare(op, [a, z], lambda: BINARY[op](a, z), f"{op}({dtype}, 0)")  # noqa: B023 (called at once)


@pytest.mark.parametrize("dta", INTS)
@pytest.mark.parametrize("op", sorted(SHIFTS))
def test_shift_amounts_out_of_range(op, dta):
    bits = torch.iinfo(TORCH[dta]).bits
    a = torch.tensor([1, 5, 100, 127, 0, 3, 9, 7]).to(TORCH[dta])
    if dta != "uint8":
        a = a * torch.tensor([1, -1, 1, -1, 1, -1, 1, -1]).to(TORCH[dta])
    s = torch.tensor([0, 1, bits - 1, bits, bits + 3, 2 * bits, -1, -bits]).to(TORCH[dta])
    compare(op, [a, s], lambda: BINARY[op](a, s), f"{op}({dta}) by out-of-range amounts")


# ---- ternary ops --------------------------------------------------------------------------------
@pytest.mark.parametrize("dty", DTYPES)
@pytest.mark.parametrize("dtx", DTYPES)
def test_where_dtypes(dtx, dty):
    gen = gen_for(dtx, dty)
    c = rand("bool", (3, 4), gen)
    x = rand(dtx, (3, 4), gen)
    y = rand(dty, (4,), gen)
    compare("where", [c, x, y], lambda: torch.where(c, x, y), f"where({dtx}, {dty})")
    y0 = rand(dty, (), gen)
    compare("where", [c, x, y0], lambda: torch.where(c, x, y0), f"where({dtx}, {dty}[])")


@pytest.mark.parametrize("lit", LITERALS, ids=repr)
@pytest.mark.parametrize("dtype", DTYPES)
def test_where_literals(dtype, lit):
    gen = torch.Generator().manual_seed(5)
    c = rand("bool", (2, 5), gen)
    x = rand(dtype, (2, 5), gen)
    compare("where", [c, x, lit], lambda: torch.where(c, x, lit), f"where({dtype}, {lit!r})")
    compare("where", [c, lit, x], lambda: torch.where(c, lit, x), f"where({lit!r}, {dtype})")
    compare("where", [c, lit, 7], lambda: torch.where(c, lit, 7), f"where({lit!r}, 7)")


@pytest.mark.parametrize("dtype", ["uint8", "int32", "float32"])
def test_where_condition_must_be_bool(dtype):
    c = torch.ones(3).to(TORCH[dtype])
    x = torch.zeros(3)
    if dtype == "uint8":  # deprecated in torch (a warning today); segfuse already refuses it
        with pytest.warns(UserWarning, match="deprecated"):
            torch.where(c, x, x)
    else:
        with pytest.raises(RuntimeError):
            torch.where(c, x, x)
    with pytest.raises(GraphError) as e:
        run_one("where", [c, x, x])
    assert e.value.issues[0].loc == ("ops", 0, "inputs", 0)


@pytest.mark.parametrize("sc,sx,sy", [((3, 1), (1, 4), ()), ((), (2, 3), (3,)), ((0, 2), (1,), (2,)),
                                      ((2, 1, 3), (4, 1), (1, 3))], ids=str)
def test_where_broadcast(sc, sx, sy):
    gen = torch.Generator().manual_seed(3)
    c, x, y = rand("bool", sc, gen), rand("float32", sx, gen), rand("float64", sy, gen)
    compare("where", [c, x, y], lambda: torch.where(c, x, y))


@pytest.mark.parametrize("dtl", DTYPES)
@pytest.mark.parametrize("dtx", DTYPES)
def test_clamp_dtypes(dtx, dtl):
    gen = gen_for(dtx, dtl)
    x = rand(dtx, (3, 4), gen)
    lo = rand(dtl, (4,), gen)
    hi = rand(dtl, (3, 1), gen)
    compare("clamp", [x, lo, hi], lambda: torch.clamp(x, lo, hi), f"clamp({dtx}, {dtl}, {dtl})")
    lo0 = rand(dtl, (), gen)
    compare("clamp", [x, lo0, hi], lambda: torch.clamp(x, lo0, hi), f"clamp({dtx}, {dtl}[], {dtl})")


@pytest.mark.parametrize("bounds", [(-1, 2), (-0.5, 1.5), (True, 3), (-2.5, 2), (5, -5), (0.25, 0.25)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
def test_clamp_literals(dtype, bounds):
    gen = torch.Generator().manual_seed(9)
    x = rand(dtype, (4, 3), gen)
    lo, hi = bounds
    compare("clamp", [x, lo, hi], lambda: torch.clamp(x, lo, hi), f"clamp({dtype}, {lo!r}, {hi!r})")


@pytest.mark.parametrize("dtype", FLOATS)
def test_clamp_nan(dtype):
    x = torch.tensor(SPECIALS, dtype=torch.float64).to(TORCH[dtype])
    lo = torch.tensor([-1.0, float("nan"), 0.0] * 4 + [0.0]).to(TORCH[dtype])
    hi = torch.tensor([float("nan"), 2.0, 1.0] * 4 + [3.0]).to(TORCH[dtype])
    compare("clamp", [x, lo, hi], lambda: torch.clamp(x, lo, hi), f"clamp({dtype}) NaN bounds")
    compare("clamp", [x, -1.0, 1.0], lambda: torch.clamp(x, -1.0, 1.0), f"clamp({dtype}) NaN input")


@pytest.mark.parametrize("dte", DTYPES)
@pytest.mark.parametrize("dts", DTYPES)
def test_lerp_dtypes(dts, dte):
    gen = gen_for(dts, dte)
    s, e = rand(dts, (3, 4), gen), rand(dte, (4,), gen)
    w = torch.rand(3, 4, generator=gen, dtype=torch.float64).to(TORCH[dts]) if dts != "bool" else rand(dts, (3, 4), gen)
    compare("lerp", [s, e, w], lambda: torch.lerp(s, e, w), f"lerp({dts}, {dte}, {dts})")
    for lit in (0.25, 0.75, 2, True):
        compare("lerp", [s, e, lit], lambda: torch.lerp(s, e, lit), f"lerp({dts}, {dte}, {lit!r})")  # noqa: B023 (called at once)


@pytest.mark.parametrize("dtype", FLOATS)
def test_lerp_broadcast_and_weights(dtype):
    gen = torch.Generator().manual_seed(1)
    s = rand(dtype, (2, 1, 3), gen)
    e = rand(dtype, (4, 1), gen)
    w = torch.tensor([-0.5, 0.0, 0.49, 0.5, 0.51, 1.0, 1.5], dtype=torch.float64).reshape(7, 1, 1, 1).to(TORCH[dtype])
    compare("lerp", [s, e, w], lambda: torch.lerp(s, e, w))
    w0 = torch.tensor(0.3, dtype=torch.float64).to(TORCH[dtype])
    compare("lerp", [s, e, w0], lambda: torch.lerp(s, e, w0))


# ---- cast ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dst", DTYPES)
@pytest.mark.parametrize("src", DTYPES)
def test_cast(src, dst):
    gen = gen_for(src, dst)
    x = rand(src, (4, 5), gen)
    if src in FLOATS and dst == "uint8":
        x = x.abs()  # negative floats to unsigned is undefined behaviour in C (and in torch)
    if src in FLOATS and dst != "bool":
        x = torch.cat([x.reshape(-1), torch.tensor([0.5, -0.5, 1.99, -1.99, 0.0]).to(x.dtype).abs()
                       if dst == "uint8" else torch.tensor([0.5, -0.5, 1.99, -1.99, -0.0]).to(x.dtype)])
    compare("cast", [x], lambda: x.to(TORCH[dst]), f"cast({src} -> {dst})", dtype=dst)


@pytest.mark.parametrize("src", FLOATS)
def test_cast_specials_to_bool_and_floats(src):
    x = torch.tensor(SPECIALS, dtype=torch.float64).to(TORCH[src])
    for dst in ["bool"] + FLOATS:
        compare("cast", [x], lambda: x.to(TORCH[dst]), f"cast({src} specials -> {dst})", dtype=dst)  # noqa: B023 (called at once)


@pytest.mark.parametrize("src", INTS)
@pytest.mark.parametrize("dst", INTS + ["float16", "bfloat16"])
def test_cast_wraps_and_rounds(src, dst):
    info = torch.iinfo(TORCH[src])
    x = torch.tensor([info.min, info.max, info.min + 1, info.max - 1, 0, 1, 255, 257, 2049, 4097],
                     dtype=torch.int64).clamp(info.min, info.max).to(TORCH[src])
    compare("cast", [x], lambda: x.to(TORCH[dst]), f"cast({src} extremes -> {dst})", dtype=dst)


# ---- numbers a reduced-precision result dtype cannot hold -----------------------------------------
@pytest.mark.parametrize("value", [1.0039, 0.1, 1.0001, 1 / 3, 300.7], ids=repr)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("op", sorted(set(BINARY) - {"bitwise_and", "bitwise_or", "bitwise_xor", "left_shift",
                                                     "right_shift"}))
def test_inexact_scalars_with_reduced_precision(op, dtype, value):
    """A literal or float64 0-d tensor is converted to the float16/bfloat16 result dtype before
    the op (except the second operand of mul/div/floor_divide, which torch's CPU kernels read
    at float32): results must follow torch exactly, including discontinuous ops (floor, ==)."""
    x = torch.tensor([1.0, 2.0, 3.0, 100.0, 0.5, 7.0, -3.0, 0.1], dtype=torch.float64).to(TORCH[dtype])
    s0 = torch.tensor(value, dtype=torch.float64)
    for operands in ([x, value], [value, x], [x, s0], [s0, x]):
        compare(op, operands, lambda: call_binary(op, *operands), f"{op}({operands[0]!r}, {operands[1]!r})")  # noqa: B023 (called at once)


# ---- integer extremes wrap as in torch ----------------------------------------------------------
@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("op", ["neg", "abs", "sign", "bitwise_not", "relu", "floor", "round"])
def test_unary_integer_extremes(op, dtype):
    info = torch.iinfo(TORCH[dtype])
    x = torch.tensor([info.min, info.min + 1, -1, 0, 1, info.max - 1, info.max], dtype=torch.int64)
    x = x.clamp(info.min, info.max).to(TORCH[dtype])
    compare(op, [x], lambda: UNARY[op](x), f"{op}({dtype} extremes)")


@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("op", ["add", "sub", "mul", "maximum", "lt", "bitwise_xor", "remainder", "floor_divide"])
def test_binary_integer_extremes(op, dtype):
    info = torch.iinfo(TORCH[dtype])
    vals = sorted(v for v in {info.min, info.min + 1, -7, -1, 1, 3, info.max - 1, info.max} if info.min <= v <= info.max)
    a = torch.tensor(vals, dtype=torch.int64).repeat_interleave(len(vals)).to(TORCH[dtype])
    b = torch.tensor(vals, dtype=torch.int64).repeat(len(vals)).to(TORCH[dtype])
    if op in ("remainder", "floor_divide"):
        keep = (b != 0) & ~((a == info.min) & (b == -1))  # INT_MIN // -1 traps on x86 in torch's CPU kernel
        a, b = a[keep], b[keep]
    compare(op, [a, b], lambda: BINARY[op](a, b), f"{op}({dtype} extremes)")


# ---- symbolic sizes -------------------------------------------------------------------------------
@pytest.mark.parametrize("da,db,sa,sb", [(["T", 1], [1, "S"], (3, 1), (1, 4)), (["T"], ["T"], (5,), (5,)),
                                         (["T", "S"], ["S"], (2, 3), (3,)), (["T"], [], (0,), ()),
                                         (["T", 1], ["S"], (3, 1), (1,))], ids=str)
def test_binary_symbolic_broadcast(da, db, sa, sb):
    gen = gen_for(str(da), str(db))
    a, b = rand("float32", sa, gen), rand("int16", sb, gen)
    g = one_op("atan2", [("a", "float32", da), ("b", "int16", db)], ["a", "b"])
    out = run_graph(Fusion.from_json(g), {"a": to_numpy(a), "b": to_numpy(b)})["out"]
    check_same(out, torch.atan2(a, b), "symbolic atan2")
