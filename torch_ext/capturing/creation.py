"""Lowerings of ATen creation ops: full, empty, scalar_tensor, full_like, arange, iota, fill.

Shapes and dtypes are read from PyTorch's value of the node (its FakeTensor), so a size computed
from symbolic dims (`torch.zeros(x.shape[0] * 4)`) is the graph's size expression, and a dtype PyTorch
inferred (an int fill gives int64) is stated. zeros/ones/new_*/*_like arrive as full or full_like
(torch's decompositions). `empty` is filled with zeros: its contents are unspecified in PyTorch, and a
graph's values are defined.
"""

from __future__ import annotations

import math

import torch
from segfuse.compiler.builder import Tensor

from .lowering import LowerContext, lowers, suggest

aten = torch.ops.aten
prims = torch.ops.prims


def _number(cx: LowerContext, value, what: str):
    if isinstance(value, Tensor):
        cx.refuse(f"{what} is a tensor; segfuse needs a number here")
    if isinstance(value, str):
        cx.refuse(f"{what} is the size {value}; segfuse needs a number here (a fill value cannot be symbolic)")
    return value


def _filled(cx: LowerContext, value, shape, dtype):
    """A fill value that is a 0-d tensor (a size: `torch.full((n,), x.shape[0])`) in `dtype`,
    broadcast to `shape`."""
    ops = cx.fd.ops
    v = value if value.dtype is dtype else ops.cast(value, dtype)
    return v if not shape else ops.expand(v, shape)


def _full(cx: LowerContext, value):
    if isinstance(value, Tensor):
        return _filled(cx, value, cx.shape(), cx.dtype(cx.out))
    return cx.fd.ops.full(cx.shape(), _number(cx, value, "the fill value"), cx.dtype(cx.out))


@lowers(aten.full.default)
def _full_op(cx, size, fill_value, **storage):
    return _full(cx, fill_value)


@lowers(aten.empty.memory_format, aten.empty_strided.default, aten.empty_permuted.default)
def _empty(cx, *args, **kwargs):
    return _full(cx, 0)


@lowers(aten.scalar_tensor.default)
def _scalar_tensor(cx, s, **storage):
    return _full(cx, s)


@lowers(aten.full_like.default)
def _full_like(cx, x, fill_value, **storage):
    if isinstance(fill_value, Tensor):
        return _filled(cx, fill_value, cx.shape(), cx.dtype(cx.out))
    return cx.fd.ops.full_like(x, _number(cx, fill_value, "the fill value"), cx.dtype(cx.out))


@lowers(aten.empty_like.default)
def _empty_like(cx, x, **storage):
    return cx.fd.ops.full_like(x, 0, cx.dtype(cx.out))


@lowers(aten.fill.Scalar)
def _fill(cx, x, value):
    if isinstance(value, Tensor):
        return _filled(cx, value, cx.shape(), x.dtype)
    return cx.fd.ops.full_like(x, _number(cx, value, "the fill value"))


@lowers(aten.fill.Tensor)
def _fill_tensor(cx, x, value):
    ops = cx.fd.ops
    v = value if value.dtype is x.dtype else ops.cast(value, x.dtype)
    return ops.expand(v, cx.shape())


@lowers(aten.zero.default)
def _zero(cx, x):
    return cx.fd.ops.full_like(x, 0)


@lowers(aten.arange.default, aten.arange.start, aten.arange.start_step, sizes_as_written=True)
def _arange(cx, *args, **storage):
    # (end), (start, end) or (start, end, step); the length is PyTorch's, a size expression when end
    # is; a start that is a size is added to iota(length) (integers: exact)
    start = args[0] if len(args) > 1 else 0
    step = args[2] if len(args) > 2 else 1
    _number(cx, step, "arange's step")
    for v, what in ((start, "start"), (step, "step")):
        if isinstance(v, float) and not math.isfinite(v):
            cx.refuse(f"arange's {what} must be finite")
    (length,) = cx.shape()
    dtype = cx.dtype(cx.out)
    if isinstance(start, str):
        if dtype.is_float:
            cx.refuse("a float arange that starts at a size", alternative="torch.arange(start, end).float()")
        return cx.fd.ops.add(cx.fd.ops.iota(length, 0, step, dtype), cx.size_operand(start, dtype))
    return cx.fd.ops.iota(length, _number(cx, start, "arange's start"), step, dtype)


@lowers(prims.iota.default)
def _iota(cx, length, *, start, step, dtype, **storage):
    return cx.fd.ops.iota(cx.shape()[0], _number(cx, start, "start"), _number(cx, step, "step"), dtype)


suggest("rand", "pass random values in as an input")
suggest("randn", "pass random values in as an input")
suggest("randint", "pass random values in as an input")
suggest("rand_like", "pass random values in as an input")
suggest("randn_like", "pass random values in as an input")
suggest("linspace", "torch.arange(n) * step + start")
