"""Shape ops. Views (reshape of contiguous data, squeeze, unsqueeze, expand, broadcast_in_dim)
move no data; movement ops (permute, slice, select, pad, cat) read each input element once."""

from __future__ import annotations

import numpy as np
import sympy

from ..errors import OpError
from ..shapes import dims_equal, fmt_shape, norm, numel
from .registry import (
    Attrs,
    Lowering,
    Number,
    OpDef,
    OpKind,
    TensorType,
    check_scalar,
    norm_dim,
    register,
    scalar_array,
    tensor,
)

Size = int | str


class ShapeAttrs(Attrs):
    shape: list[Size]


def _reshape_infer(ctx, operands, attrs):
    x = tensor(operands, 0)
    dims = []
    infer_at = None
    for i, d in enumerate(attrs.shape):
        if d == -1 and not isinstance(d, bool):
            if infer_at is not None:
                raise OpError("only one dimension can be -1", ("shape", i))
            infer_at = i
            dims.append(None)
            continue
        v = ctx.size(d, ("shape", i))
        if isinstance(v, int) and v < 0:
            raise OpError(f"size {v} is invalid (only -1 may be negative)", ("shape", i))
        dims.append(v)
    total = numel(x.shape)
    known = numel([d for d in dims if d is not None])
    if infer_at is not None:
        if isinstance(known, int) and isinstance(total, int):
            if known == 0 or total % known:
                raise OpError(f"cannot reshape {fmt_shape(x.shape)} ({total} elements) into {attrs.shape}", ("shape",))
            dims[infer_at] = total // known
        else:
            q = norm(sympy.simplify(sympy.sympify(total) / sympy.sympify(known)))
            if not isinstance(q, int) and not (q.is_integer or q.is_polynomial()):
                raise OpError(f"cannot infer -1: {total} elements are not a multiple of {known}", ("shape",))
            dims[infer_at] = q
    elif dims_equal(numel(dims), total) is False:
        raise OpError(f"cannot reshape {fmt_shape(x.shape)} ({total} elements) into "
                      f"{fmt_shape(dims)} ({numel(dims)} elements)", ("shape",))
    return [TensorType(x.dtype, tuple(dims))]


def _relinearize(xp, x, a, out):
    return x.reshape(out.shape)  # a view of a C-contiguous x (the runtime plans it only for those)


def _as_ref(view):
    """An OpDef reference from its `view` function (the NumPy array module)."""
    return lambda args, a, out: [view(np, np.asarray(args[0]), a, out[0])]


register(OpDef("reshape", OpKind.view, ("x",), _reshape_infer, _as_ref(_relinearize), view=_relinearize,
               attrs=ShapeAttrs, lowering=Lowering.relinearize, extra={"nvfuser": ({"keywords": {"new_shape": "shape"}},)},
               doc="reshape(x, shape): row-major; one entry may be -1"))


class BroadcastInDimAttrs(Attrs):
    shape: list[Size]
    broadcast_dims: list[int]


def _bid_infer(ctx, operands, attrs):
    x = tensor(operands, 0)
    out = tuple(ctx.size(d, ("shape", i)) for i, d in enumerate(attrs.shape))
    if len(attrs.broadcast_dims) != x.rank:
        raise OpError(f"broadcast_dims has {len(attrs.broadcast_dims)} entries for an input of rank {x.rank}",
                      ("broadcast_dims",))
    prev = -1
    for i, bd in enumerate(attrs.broadcast_dims):
        if not 0 <= bd < len(out) or bd <= prev:
            raise OpError(f"broadcast_dims must be increasing and within 0..{len(out) - 1}", ("broadcast_dims", i))
        prev = bd
        d = x.shape[i]
        if d != 1 and dims_equal(d, out[bd]) is False:
            raise OpError(f"input dim {i} (size {d}) cannot broadcast to size {out[bd]}", ("broadcast_dims", i))
    return [TensorType(x.dtype, out)]


def _bid_view(xp, x, a, out):
    shape = [1] * len(out.shape)
    for i, bd in enumerate(a.broadcast_dims):
        shape[bd] = x.shape[i]
    return xp.broadcast_to(x.reshape(shape), out.shape)


register(OpDef("broadcast_in_dim", OpKind.view, ("x",), _bid_infer, _as_ref(_bid_view), view=_bid_view,
               attrs=BroadcastInDimAttrs,
               lowering=Lowering.broadcast_in_dim,
               doc="broadcast_in_dim(x, shape, broadcast_dims): input dim i becomes output dim broadcast_dims[i]"))


def _expand_infer(ctx, operands, attrs):
    x = tensor(operands, 0)
    n = len(attrs.shape)
    if n < x.rank:
        raise OpError(f"expand to {n} dims is fewer than the input's {x.rank}", ("shape",))
    out = []
    for i, d in enumerate(attrs.shape):
        j = i - (n - x.rank)
        if isinstance(d, int) and not isinstance(d, bool) and d == -1:
            if j < 0:
                raise OpError("-1 is not allowed for a new leading dimension", ("shape", i))
            out.append(x.shape[j])
            continue
        v = ctx.size(d, ("shape", i))
        if j >= 0:
            src = x.shape[j]
            if src != 1 and dims_equal(src, v) is False:
                raise OpError(f"the expanded size {v} must match the existing size {src} at dim {i}", ("shape", i))
        out.append(v)
    return [TensorType(x.dtype, tuple(out))]


def _expand_view(xp, x, a, out):
    return xp.broadcast_to(x, out.shape)


register(OpDef("expand", OpKind.view, ("x",), _expand_infer, _as_ref(_expand_view), view=_expand_view,
               attrs=ShapeAttrs,
               lowering=Lowering.expand,
               doc="expand(x, shape): broadcast size-1 dims (-1 keeps a dim), like Tensor.expand"))


class SqueezeAttrs(Attrs):
    dims: list[int] | int | None = None


def _squeeze_infer(ctx, operands, attrs):
    x = tensor(operands, 0)
    if attrs.dims is None:
        sym = [i for i, d in enumerate(x.shape) if not isinstance(d, int)]
        if sym:
            raise OpError(f"squeeze without dims cannot decide symbolic dim {sym[0]} ({x.shape[sym[0]]}); "
                          "name the dims to squeeze", ("dims",))
        keep = [d for d in x.shape if d != 1]
        return [TensorType(x.dtype, tuple(keep))]
    dims = [attrs.dims] if isinstance(attrs.dims, int) else attrs.dims
    drop = set()
    for k, d in enumerate(dims):
        w = ("dims",) if isinstance(attrs.dims, int) else ("dims", k)
        nd = norm_dim(d, x.rank, w)
        if any(norm_dim(e, x.rank) == nd for e in dims[:k]):
            raise OpError(f"dim {nd} appears more than once in the list of dims", w)
        if x.rank == 0:
            continue
        size = x.shape[nd]
        if not isinstance(size, int):
            raise OpError(f"cannot squeeze symbolic dim {nd} (size {size}); its rank would depend on the data", w)
        if size == 1:
            drop.add(nd)
    return [TensorType(x.dtype, tuple(d for i, d in enumerate(x.shape) if i not in drop))]


register(OpDef("squeeze", OpKind.view, ("x",), _squeeze_infer, _as_ref(_relinearize), view=_relinearize,
               attrs=SqueezeAttrs, extra={"nvfuser": ({"ignored": {"squeeze_expanded": False}},)},
               lowering=Lowering.relinearize,
               doc="squeeze(x, dims=None): remove size-1 dims (listed dims that are not size 1 stay)"))


class DimAttrs(Attrs):
    dim: int


def _unsqueeze_infer(ctx, operands, attrs):
    x = tensor(operands, 0)
    d = norm_dim(attrs.dim, x.rank + 1 if x.rank else 1, ("dim",)) if x.rank else norm_dim(attrs.dim, 1, ("dim",))
    shape = list(x.shape)
    shape.insert(d, 1)
    return [TensorType(x.dtype, tuple(shape))]


register(OpDef("unsqueeze", OpKind.view, ("x",), _unsqueeze_infer, _as_ref(_relinearize), view=_relinearize,
               attrs=DimAttrs,
               lowering=Lowering.relinearize,
               doc="unsqueeze(x, dim): insert a size-1 dim"))


class PermuteAttrs(Attrs):
    dims: list[int]


def _permute_infer(ctx, operands, attrs):
    x = tensor(operands, 0)
    if len(attrs.dims) != x.rank:
        raise OpError(f"permute needs {x.rank} dims, got {len(attrs.dims)}", ("dims",))
    nd = [norm_dim(d, x.rank, ("dims", i)) for i, d in enumerate(attrs.dims)]
    if len(set(nd)) != len(nd):
        raise OpError("permute dims repeat a dimension", ("dims",))
    return [TensorType(x.dtype, tuple(x.shape[d] for d in nd))]


register(OpDef("permute", OpKind.movement, ("x",), _permute_infer,
               # always a copy: a movement op makes new data (an identity permutation would return x itself)
               lambda args, a, out: [np.array(np.transpose(args[0], [d % max(args[0].ndim, 1) for d in a.dims]), order="C")],
               attrs=PermuteAttrs,
               lowering=Lowering.permute, doc="permute(x, dims)"))


class SliceAttrs(Attrs):
    dim: int = 0
    start: int | None = None
    end: int | None = None
    step: int = 1


def _slice_bounds(size, start, end, step):
    """Python slice semantics on a possibly symbolic size (sympy Min/Max)."""
    def clamp(v, default):
        if v is None:
            return default
        if v < 0:
            v = size + v
            return norm(sympy.Max(0, v)) if not isinstance(size, int) else max(0, v)
        return norm(sympy.Min(v, size)) if not isinstance(size, int) else min(v, size)

    s, e = clamp(start, 0), clamp(end, size)
    if isinstance(s, int) and isinstance(e, int):
        n = max(0, -(-(e - s) // step))
    else:
        n = norm(sympy.Max(0, sympy.ceiling((sympy.sympify(e) - s) / step)))
    return s, n


def _slice_infer(ctx, operands, attrs):
    x = tensor(operands, 0)
    if x.rank == 0:
        raise OpError("cannot slice a 0-d tensor", ("inputs", 0))
    d = norm_dim(attrs.dim, x.rank)
    if attrs.step <= 0:
        raise OpError("step must be positive", ("step",))
    _, n = _slice_bounds(x.shape[d], attrs.start, attrs.end, attrs.step)
    shape = list(x.shape)
    shape[d] = n
    return [TensorType(x.dtype, tuple(shape))]


def _slice_ref(args, a, out):
    x = args[0]
    d = a.dim % x.ndim
    sl = [slice(None)] * x.ndim
    sl[d] = slice(a.start, a.end, a.step)
    return [np.array(x[tuple(sl)], order="C")]  # a copy, also for a full slice (movement makes new data)


register(OpDef("slice", OpKind.movement, ("x",), _slice_infer, _slice_ref, attrs=SliceAttrs,
               lowering=Lowering.slice,
               doc="slice(x, dim=0, start=None, end=None, step=1): x[start:end:step] along dim"))


class SelectAttrs(Attrs):
    dim: int
    index: int


def _select_infer(ctx, operands, attrs):
    x = tensor(operands, 0)
    if x.rank == 0:
        raise OpError("select() cannot be applied to a 0-d tensor", ("inputs", 0))
    d = norm_dim(attrs.dim, x.rank)
    size = x.shape[d]
    if isinstance(size, int) and not -size <= attrs.index < size:
        raise OpError(f"index {attrs.index} is out of range for dim {d} of size {size}", ("index",))
    return [TensorType(x.dtype, x.shape[:d] + x.shape[d + 1:])]


def _select_ref(args, a, out):
    x = np.asarray(args[0])
    d = a.dim % x.ndim
    return [np.take(x, a.index % x.shape[d], axis=d)]  # (a copy: movement makes new data)


register(OpDef("select", OpKind.movement, ("x",), _select_infer, _select_ref, attrs=SelectAttrs,
               lowering=Lowering.select, extra={"nvfuser": ({"signature": ("x", "index", "dim")},)},
               doc="select(x, dim, index): x[..., index, ...] along dim, which goes away (torch.select); "
                   "a negative index counts from the end"))


class PadAttrs(Attrs):
    pad: list[int]
    value: Number = 0


def _pad_infer(ctx, operands, attrs):
    x = tensor(operands, 0)
    if len(attrs.pad) % 2 or len(attrs.pad) // 2 > x.rank:
        raise OpError(f"pad needs pairs for at most {x.rank} dims (last dim first), got {len(attrs.pad)} values", ("pad",))
    shape = list(x.shape)
    for k in range(len(attrs.pad) // 2):
        d = x.rank - 1 - k
        n = norm(shape[d] + attrs.pad[2 * k] + attrs.pad[2 * k + 1]) if not isinstance(shape[d], int) else \
            shape[d] + attrs.pad[2 * k] + attrs.pad[2 * k + 1]
        if isinstance(n, int) and n < 0:
            raise OpError(f"padding makes dim {d} negative ({n})", ("pad", 2 * k))
        crop = -min(attrs.pad[2 * k], 0) - min(attrs.pad[2 * k + 1], 0)
        if crop and isinstance(shape[d], int) and crop > shape[d]:  # PyTorch crops first, then pads
            raise OpError(f"negative padding removes {crop} elements from dim {d} of size {shape[d]}",
                          ("pad", 2 * k))
        shape[d] = n
    if any(p > 0 for p in attrs.pad):  # torch converts its value (a double) only when it fills
        check_scalar(float(attrs.value), x.dtype, ("value",))
    return [TensorType(x.dtype, tuple(shape))]


def _pad_ref(args, a, out):
    x = args[0]
    res = np.full(out[0].shape, scalar_array(float(a.value), out[0].dtype), dtype=x.dtype)
    src, dst = [], []
    for d in range(x.ndim):
        k = x.ndim - 1 - d
        lo, hi = (a.pad[2 * k], a.pad[2 * k + 1]) if 2 * k < len(a.pad) else (0, 0)
        n = x.shape[d]
        s0, s1 = max(0, -lo), n - max(0, -hi)
        src.append(slice(s0, max(s0, s1)))
        dst.append(slice(max(0, lo), max(0, lo) + max(0, s1 - s0)))
    res[tuple(dst)] = x[tuple(src)]
    return [res]


register(OpDef("pad", OpKind.movement, ("x",), _pad_infer, _pad_ref, attrs=PadAttrs,
               lowering=Lowering.pad, extra={"nvfuser": ({"keywords": {"pad_widths": "pad"}},)},
               doc="pad(x, pad, value=0): torch.nn.functional.pad constant mode; pairs start at the last dim"))


def _cat_infer(ctx, operands, attrs):
    ts = [tensor(operands, i) for i in range(len(operands))]
    first = ts[0]
    if first.rank == 0:
        raise OpError("cannot concatenate 0-d tensors", ("inputs", 0))
    d = norm_dim(attrs.dim, first.rank)
    total = 0
    dt = first.dtype
    from ..dtypes import promote_types

    for i, t in enumerate(ts):
        if t.rank != first.rank:
            raise OpError(f"tensor {i} has rank {t.rank}, expected {first.rank}", ("inputs", i))
        for k in range(t.rank):
            if k != d and dims_equal(t.shape[k], first.shape[k]) is False:
                raise OpError(f"size {t.shape[k]} at dim {k} differs from {first.shape[k]}", ("inputs", i))
        total = total + t.shape[d]
        dt = promote_types(dt, t.dtype)
    shape = list(first.shape)
    shape[d] = norm(total) if not isinstance(total, int) else total
    return [TensorType(dt, tuple(shape))]


register(OpDef("cat", OpKind.movement, ("tensors",), _cat_infer,
               lambda args, a, out: [np.concatenate([np.asarray(x).astype(out[0].dtype.np) for x in args],
                                                    axis=a.dim % args[0].ndim)],
               attrs=DimAttrs, variadic=True, min_operands=1, extra={"nvfuser": ({"ignored": {"manual_padding": False}},)},
               lowering=Lowering.cat, doc="cat(tensors, dim): dtypes promote like torch.cat"))
