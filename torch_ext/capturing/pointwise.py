"""Lowerings of pointwise ATen ops whose arguments differ from the registry op of the same name.

The rest of the family (exp, add with alpha 1, comparisons, logical and bitwise ops, where, lerp, ...)
maps generically by name (lowering.py); ops torch decomposes (clamp_min, masked_fill, rsub, square,
hardtanh, ...) arrive as the ops they decompose into.
"""

from __future__ import annotations

import math

import torch
from segfuse.compiler.builder import Tensor
from segfuse.compiler.dtypes import DType

from .lowering import LowerContext, lowers, suggest

aten = torch.ops.aten

_REDUCED = (DType.float16, DType.bfloat16)


def _scaled(cx: LowerContext, y, alpha):
    """alpha * y, PyTorch's `alpha` of add and sub (1: y itself)."""
    if alpha is None or (not isinstance(alpha, bool) and alpha == 1):
        return y
    if isinstance(y, (bool, int, float)):
        return y * alpha
    return cx.fd.ops.mul(y, alpha)


@lowers(aten.add.Tensor, aten.add.Scalar)
def _add(cx, x, y, alpha=1):
    return cx.fd.ops.add(x, _scaled(cx, y, alpha))


@lowers(aten.sub.Tensor, aten.sub.Scalar)
def _sub(cx, x, y, alpha=1):
    return cx.fd.ops.sub(x, _scaled(cx, y, alpha))


@lowers(aten.rsub.Tensor, aten.rsub.Scalar)
def _rsub(cx, x, y, alpha=1):
    return cx.fd.ops.sub(y, _scaled(cx, x, alpha))


def _in_opmath(cx: LowerContext, fn, *xs):
    """fn over xs computed in float32 when the result is float16/bfloat16, as PyTorch computes
    composite formulas in its opmath type and rounds once."""
    out = cx.dtype(cx.out)
    if out not in _REDUCED:
        return fn(*xs)
    up = [cx.fd.ops.cast(x, DType.float32) if isinstance(x, Tensor) else x for x in xs]
    return cx.fd.ops.cast(fn(*up), out)


@lowers(aten.div.Tensor_mode, aten.div.Scalar_mode)
def _div_mode(cx, x, y, rounding_mode=None):
    ops = cx.fd.ops
    if rounding_mode is None:
        return ops.div(x, y)
    if rounding_mode == "floor":
        return ops.floor_divide(x, y)
    if rounding_mode != "trunc":
        cx.refuse(f"rounding_mode {rounding_mode!r} is not one of None, 'trunc', 'floor'")
    if cx.dtype(cx.out).is_float:
        return _in_opmath(cx, lambda a, b: ops.trunc(ops.div(a, b)), x, y)
    # integers: the floor quotient, one more where the division is inexact and the signs differ
    q = ops.floor_divide(x, y)
    inexact = ops.ne(ops.remainder(x, y), 0)
    x_neg = ops.lt(x, 0)
    if isinstance(y, (bool, int, float)):
        signs_differ = ops.logical_not(x_neg) if y < 0 else x_neg
    else:
        signs_differ = ops.ne(x_neg, ops.lt(y, 0))
    return ops.where(ops.logical_and(inexact, signs_differ), ops.add(q, 1), q)


@lowers(aten.pow.Tensor_Tensor, aten.pow.Tensor_Scalar, aten.pow.Scalar)
def _pow(cx, x, exponent):
    return cx.fd.ops.pow(x, exponent)


@lowers(aten.round.decimals)
def _round_decimals(cx, x, *, decimals):
    """PyTorch's formula: round(x * 10^d) / 10^d, or round(x / 10^-d) * 10^-d for d < 0, in opmath."""
    ops = cx.fd.ops
    if decimals == 0:
        return ops.round(x)
    if not x.dtype.is_float:
        cx.refuse(f"round(decimals=) of {x.dtype} (PyTorch rounds floats to decimals)")
    scale = 10.0 ** abs(decimals)
    if decimals > 0:
        return _in_opmath(cx, lambda v: ops.div(ops.round(ops.mul(v, scale)), scale), x)
    return _in_opmath(cx, lambda v: ops.mul(ops.round(ops.div(v, scale)), scale), x)


@lowers(aten.clamp.default, aten.clamp.Tensor)
def _clamp(cx, x, min=None, max=None):
    ops = cx.fd.ops
    if min is None and max is None:
        cx.refuse("clamp needs min or max")
    if max is None:
        return ops.maximum(x, min)
    if min is None:
        return ops.minimum(x, max)
    return ops.clamp(x, min, max)


@lowers(aten.clamp_min.default, aten.clamp_min.Tensor)
def _clamp_min(cx, x, min):
    return cx.fd.ops.maximum(x, min)


@lowers(aten.clamp_max.default, aten.clamp_max.Tensor)
def _clamp_max(cx, x, max):
    return cx.fd.ops.minimum(x, max)


@lowers(aten.gelu.default)
def _gelu(cx, x, approximate="none"):
    ops = cx.fd.ops
    if approximate == "none":
        return ops.gelu(x)
    if approximate != "tanh":
        cx.refuse(f"approximate={approximate!r} is not 'none' or 'tanh'")

    def tanh_gelu(v):  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), PyTorch's formula
        inner = ops.mul(ops.add(v, ops.mul(ops.mul(ops.mul(v, v), v), 0.044715)), math.sqrt(2.0 / math.pi))
        return ops.mul(ops.mul(v, 0.5), ops.add(ops.tanh(inner), 1.0))

    return _in_opmath(cx, tanh_gelu, x)


@lowers(aten.bitwise_left_shift.Tensor, aten.bitwise_left_shift.Tensor_Scalar,
        aten.bitwise_left_shift.Scalar_Tensor, aten.__lshift__.Tensor, aten.__lshift__.Scalar)
def _left_shift(cx, x, y):
    return cx.fd.ops.left_shift(x, y)


@lowers(aten.bitwise_right_shift.Tensor, aten.bitwise_right_shift.Tensor_Scalar,
        aten.bitwise_right_shift.Scalar_Tensor, aten.__rshift__.Tensor, aten.__rshift__.Scalar)
def _right_shift(cx, x, y):
    return cx.fd.ops.right_shift(x, y)


@lowers(aten.masked_fill.Scalar, aten.masked_fill.Tensor)
def _masked_fill(cx, x, mask, value):
    ops = cx.fd.ops
    dt = x.dtype
    if isinstance(value, (bool, int, float)):
        if dt.is_bool:
            value = bool(value)
        elif not dt.is_float:
            value = math.trunc(value) if isinstance(value, float) else int(value)
    elif value.dtype is not dt:
        value = ops.cast(value, dt)
    out = ops.where(mask, value, x)
    return out if out.dtype is dt else ops.cast(out, dt)


# ---- casts ----------------------------------------------------------------------------------
def _cast_to(cx: LowerContext, x, dtype):
    """x as `dtype` (None: unchanged); a value that is already of that dtype is returned as it is."""
    if dtype is None or dtype == x.dtype:
        return x
    return cx.fd.ops.cast(x, dtype)


@lowers(aten._to_copy.default)
def _to_copy(cx, x, *, dtype=None, **storage):
    return _cast_to(cx, x, dtype)


@lowers(aten.to.dtype, aten.to.dtype_layout, aten.to.device, aten.to.other)
def _to(cx, x, *args, **kwargs):
    dtype = kwargs.get("dtype")
    for a in args:
        if isinstance(a, DType):
            dtype = a
        elif isinstance(a, Tensor):  # to(other): other's dtype
            dtype = a.dtype
    return _cast_to(cx, x, dtype)


@lowers(aten.type_as.default)
def _type_as(cx, x, other):
    return _cast_to(cx, x, other.dtype)


suggest("nan_to_num", "torch.where(torch.isnan(x), 0.0, x), then clamp")


@lowers(aten.hardtanh.default)
def _hardtanh(cx, x, min_val=-1, max_val=1):
    return cx.fd.ops.clamp(x, min_val, max_val)
