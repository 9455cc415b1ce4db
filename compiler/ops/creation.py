"""Creation ops: full, full_like, iota. They read no tensor data."""

from __future__ import annotations

import math

import numpy as np

from ..dtypes import DType, literal_dtype
from ..errors import OpError
from .registry import Attrs, Lowering, Number, OpDef, OpKind, TensorType, check_scalar, register, scalar_array

Size = int | str


def _check_value_fits(value, dt: DType):
    check_scalar(value, dt, ("value",))  # as torch.full: 2.5 -> int64 truncates, 300 -> int8 raises


class FullAttrs(Attrs):
    shape: list[Size]
    value: Number
    dtype: DType | None = None


def _full_infer(ctx, operands, attrs):
    dims = tuple(ctx.size(d, ("shape", i)) for i, d in enumerate(attrs.shape))
    for i, d in enumerate(dims):
        if isinstance(d, int) and d < 0:
            raise OpError(f"size {d} is negative", ("shape", i))
    dt = attrs.dtype or literal_dtype(attrs.value)
    _check_value_fits(attrs.value, dt)
    return [TensorType(dt, dims)]


def _fill(shape, value, dt: DType):
    return np.full(shape, scalar_array(value, dt), dtype=dt.np)


register(OpDef("full", OpKind.creation, (), _full_infer,
               lambda args, a, out: [_fill(out[0].shape, a.value, out[0].dtype)],
               attrs=FullAttrs, lowering=Lowering.fill, extra={"nvfuser": ({"keywords": {"fill_value": "value"}},)},
               doc="full(shape, value, dtype=None): dtype defaults from the value like torch.full"))


class FullLikeAttrs(Attrs):
    value: Number
    dtype: DType | None = None


def _full_like_infer(ctx, operands, attrs):
    x = operands[0]
    if not isinstance(x, TensorType):
        raise OpError("full_like needs a tensor", ("inputs", 0))
    dt = attrs.dtype or x.dtype
    _check_value_fits(attrs.value, dt)
    return [TensorType(dt, x.shape)]


register(OpDef("full_like", OpKind.creation, ("x",), _full_like_infer,
               lambda args, a, out: [_fill(out[0].shape, a.value, out[0].dtype)],
               attrs=FullLikeAttrs, lowering=Lowering.fill,
               doc="full_like(x, value, dtype=None): x's shape (and dtype unless given)"))


class IotaAttrs(Attrs):
    length: Size
    start: Number = 0
    step: Number = 1
    dtype: DType = DType.int64


def _iota_infer(ctx, operands, attrs):
    n = ctx.size(attrs.length, ("length",))
    if isinstance(n, int) and n < 0:
        raise OpError(f"length {n} is negative", ("length",))
    if attrs.dtype.is_bool:
        raise OpError("iota cannot make a bool tensor", ("dtype",))
    for name in ("start", "step"):  # as torch.arange; the kernels have no text for an infinite bound
        v = getattr(attrs, name)
        if isinstance(v, float) and not math.isfinite(v):
            raise OpError(f"{name} must be finite, not {v}", (name,))
    return [TensorType(attrs.dtype, (n,))]


def _iota_ref(args, a, out):
    t = out[0]
    n = t.shape[0]
    if t.dtype.is_int:
        return [(a.start + a.step * np.arange(n, dtype=np.int64)).astype(t.dtype.np)]
    return [(a.start + a.step * np.arange(n, dtype=np.float64)).astype(t.dtype.np)]


register(OpDef("iota", OpKind.creation, (), _iota_infer, _iota_ref, attrs=IotaAttrs,
               lowering=Lowering.iota,
               doc="iota(length, start=0, step=1, dtype=int64): start + step * arange(length)"))
