"""Indexing ops: gather, take_along_axis, index_select (reads at computed positions) and the
scatter family: scatter, index_add, index_put (writes into `self`, in place in the kernel).

PyTorch semantics throughout, including duplicate indices, negative dims and index tensors
whose non-indexed extents are smaller than the target's. Index tensors may be any integer
dtype (PyTorch insists on int64 for gather/scatter; segfuse also takes int32, the usual MoE
dtype). Out-of-range indices raise an error naming the op; nothing is written.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import numpy as np
from pydantic import WithJsonSchema

from ..dtypes import DType, from_numpy
from ..errors import OpError
from ..shapes import dims_equal, fmt_shape
from .pointwise import opmath
from .registry import (
    Attrs,
    Lowering,
    Number,
    OpDef,
    OpKind,
    Scalar,
    TensorType,
    broadcast_shapes,
    check_scalar,
    norm_dim,
    register,
    scalar_array,
    tensor,
)


def _index_tensor(operands, i, name="index") -> TensorType:
    t = tensor(operands, i, name)
    if not t.dtype.is_int:
        raise OpError(f"{name} must be an integer tensor, not {t.dtype}", ("inputs", i))
    return t


def _empty(t: TensorType) -> bool | None:
    """Whether a tensor has no elements: None while a symbolic size leaves it open (inference runs
    again with the bound sizes)."""
    if any(d == 0 for d in t.shape):
        return True
    return False if all(isinstance(d, int) for d in t.shape) else None


def _no_shape_checks(idx: TensorType, x: TensorType, src=None) -> bool:
    """PyTorch checks no shapes of gather and scatter operands when the index is empty (any rank,
    any sizes); with a symbolic index size, ranks that differ wait for the bound sizes."""
    e = _empty(idx)
    ranks_differ = idx.rank != x.rank or (isinstance(src, TensorType) and src.rank != x.rank)
    return e is True or (e is None and ranks_differ)


def _le(a, b) -> bool | None:
    """a <= b for dims; None when unknown until bound."""
    if isinstance(a, int) and isinstance(b, int):
        return a <= b
    if dims_equal(a, b):
        return True
    return None


def check_bounds(op: str, idx: np.ndarray, size: int, dim: int, allow_negative: bool = False) -> np.ndarray:
    """Raise if any index is out of range; return indices with negatives wrapped."""
    idx = idx.astype(np.int64, copy=False)  # (read only here and by the callers)
    lo = -size if allow_negative else 0
    if idx.size and (idx.min() < lo or idx.max() >= size):  # (two reductions: no mask unless one is out)
        bad = (idx < lo) | (idx >= size)
        v = int(idx[bad].reshape(-1)[0])
        raise OpError(f"{op}: index {v} is out of bounds for dimension {dim} with size {size}", ("inputs", 1))
    return np.where(idx < 0, idx + size, idx) if allow_negative else idx


def _coords(index: np.ndarray, dim: int, values: np.ndarray) -> tuple:
    """Full coordinates of each index element, with `values` substituted along `dim`."""
    if index.ndim == 1:
        return (values,)  # (the only dim: no grid to build)
    grids = list(np.indices(index.shape, sparse=False)) if index.ndim else []
    grids[dim] = values
    return tuple(grids)


# ---- gather-like ------------------------------------------------------------------------
class DimAttrs(Attrs):
    dim: int


def _gather_infer(ctx, operands, attrs):
    x = tensor(operands, 0, "self")
    idx = _index_tensor(operands, 1)
    d = norm_dim(attrs.dim, x.rank)
    if _no_shape_checks(idx, x):
        return [TensorType(x.dtype, idx.shape)]
    if idx.rank != x.rank:
        raise OpError(f"index has rank {idx.rank} but self has rank {x.rank}; gather needs equal ranks "
                      "(or an empty index)", ("inputs", 1))
    for k in range(x.rank):
        if k != d and _le(idx.shape[k], x.shape[k]) is False:
            raise OpError(f"index size {idx.shape[k]} at dim {k} exceeds self's size {x.shape[k]}", ("inputs", 1))
    return [TensorType(x.dtype, idx.shape)]


def _gather_ref(args, attrs, out_types):
    x, idx = np.asarray(args[0]), np.asarray(args[1])
    if idx.size == 0:
        return [np.empty(idx.shape, x.dtype)]
    if x.ndim == 0:
        check_bounds("gather", idx, 1, 0)
        return [x.copy().reshape(idx.shape)]
    d = attrs.dim % x.ndim
    i = check_bounds("gather", idx, x.shape[d], d)
    return [x[_coords(idx, d, i)]]


register(OpDef("gather", OpKind.gather, ("self", "index"), _gather_infer, _gather_ref, attrs=DimAttrs,
               extra={"signature": ("self", "dim", "index"), "nvfuser": ({"signature": ("self", "index", "dim")},)},
               lowering=Lowering.gather,
               doc="gather(self, dim, index): out[i][j] = self[index[i][j]][j] for dim 0 (torch.gather)"))


def _tal_infer(ctx, operands, attrs):
    x = tensor(operands, 0, "x")
    idx = _index_tensor(operands, 1)
    d = norm_dim(attrs.dim, x.rank)
    if idx.rank != x.rank:
        raise OpError(f"index has rank {idx.rank} but x has rank {x.rank}", ("inputs", 1))
    xs = tuple(1 if k == d else s for k, s in enumerate(x.shape))
    isz = tuple(1 if k == d else s for k, s in enumerate(idx.shape))
    b = list(broadcast_shapes([xs, isz], lambda i: ("inputs", i)))
    b[d] = idx.shape[d]
    return [TensorType(x.dtype, tuple(b))]


def _tal_ref(args, attrs, out_types):
    x, idx = np.asarray(args[0]), np.asarray(args[1])
    if x.ndim == 0:
        check_bounds("take_along_axis", idx, 1, 0)
        return [x.copy()]
    d = attrs.dim % x.ndim
    i = check_bounds("take_along_axis", idx, x.shape[d], d)
    shape = out_types[0].shape
    xb = np.broadcast_to(x, tuple(x.shape[k] if k == d else shape[k] for k in range(x.ndim)))
    ib = np.broadcast_to(i, shape)
    return [np.take_along_axis(xb, ib, axis=d)]


register(OpDef("take_along_axis", OpKind.gather, ("x", "index"), _tal_infer, _tal_ref, attrs=DimAttrs,
               lowering=Lowering.take_along_axis,
               doc="take_along_axis(x, index, dim): numpy/torch.take_along_dim; other dims broadcast"))


def _isel_infer(ctx, operands, attrs):
    x = tensor(operands, 0, "x")
    idx = _index_tensor(operands, 1)
    d = norm_dim(attrs.dim, x.rank)
    if idx.rank > 1:
        raise OpError(f"index_select needs a 1-D index, got rank {idx.rank}", ("inputs", 1))
    shape = list(x.shape)
    if x.rank:
        shape[d] = idx.shape[0] if idx.rank else 1
    return [TensorType(x.dtype, tuple(shape))]


def _isel_ref(args, attrs, out_types):
    x, idx = np.asarray(args[0]), np.asarray(args[1]).reshape(-1)
    if x.ndim == 0:
        check_bounds("index_select", idx, 1, 0)
        return [x.copy()]
    d = attrs.dim % x.ndim
    i = check_bounds("index_select", idx, x.shape[d], d)
    return [np.take(x, i, axis=d)]


register(OpDef("index_select", OpKind.gather, ("x", "index"), _isel_infer, _isel_ref, attrs=DimAttrs,
               extra={"signature": ("x", "dim", "index"), "nvfuser": ({"signature": ("x", "index", "dim")},)},
               lowering=Lowering.index_select,
               doc="index_select(x, dim, index): rows of x along dim picked by a 1-D index"))


# ---- scatter family ---------------------------------------------------------------------
class Reduce(StrEnum):
    """How a scatter-family op combines values into self (a string on the wire: the members are
    their values, and compare and hash as them)."""

    none = "none"  # the last write wins (torch.scatter)
    add = "add"
    mul = "mul"
    amax = "amax"
    amin = "amin"
    mean = "mean"  # composite: add, then divide by the count (expand_mean)


# PyTorch's reduce names (scatter_reduce, index_reduce, scatter_) for segfuse's
TORCH_REDUCE_NAMES = {"sum": "add", "prod": "mul", "multiply": "mul", "max": "amax", "min": "amin"}
_UFUNC = {"add": np.add, "mul": np.multiply, "amax": np.fmax, "amin": np.fmin}


def _identity(reduce: str, dt: np.dtype):
    if reduce == "add":
        return 0
    if reduce == "mul":
        return 1
    if dt.kind == "f" or dt.name == "bfloat16":
        return -np.inf if reduce == "amax" else np.inf
    if dt.kind == "b":
        return reduce != "amax"
    info = np.iinfo(dt)
    return info.min if reduce == "amax" else info.max


# in the graph format's JSON Schema the values inline, as a Literal of the strings would be
_REDUCE_FIELD = Annotated[Reduce, WithJsonSchema({"enum": [m.value for m in Reduce], "title": "Reduce",
                                                  "type": "string"})]


class ScatterAttrs(Attrs):
    dim: int
    reduce: _REDUCE_FIELD = Reduce.none
    include_self: bool = True

    synonyms = {**Attrs.synonyms, "reduce": TORCH_REDUCE_NAMES}


def _src_dtype_check(self_t: TensorType, src, i: int, op: str):
    if isinstance(src, TensorType) and src.dtype is not self_t.dtype:
        raise OpError(f"{op} expects src of self's dtype {self_t.dtype}, got {src.dtype}", ("inputs", i))


def _scatter_infer(ctx, operands, attrs):
    x = tensor(operands, 0, "self")
    idx = _index_tensor(operands, 1)
    src = operands[2]
    d = norm_dim(attrs.dim, x.rank)
    _src_dtype_check(x, src, 2, "scatter")
    check_mean_dtype(attrs, x, "scatter")
    if isinstance(src, Scalar):  # converted to self's dtype, as torch.scatter's value
        check_scalar(src.value, x.dtype, ("inputs", 2))
    if _no_shape_checks(idx, x, src):
        return [TensorType(x.dtype, x.shape)]  # self unchanged
    if idx.rank != x.rank:
        raise OpError(f"index has rank {idx.rank} but self has rank {x.rank}; scatter needs equal ranks "
                      "(or an empty index)", ("inputs", 1))
    if isinstance(src, TensorType) and src.rank != x.rank:
        raise OpError(f"src has rank {src.rank} but self has rank {x.rank}", ("inputs", 2))
    for k in range(x.rank):
        if k != d and _le(idx.shape[k], x.shape[k]) is False:
            raise OpError(f"index size {idx.shape[k]} at dim {k} exceeds self's size {x.shape[k]}", ("inputs", 1))
        if isinstance(src, TensorType) and _le(idx.shape[k], src.shape[k]) is False:
            raise OpError(f"index size {idx.shape[k]} at dim {k} exceeds src's size {src.shape[k]}", ("inputs", 1))
    return [TensorType(x.dtype, x.shape)]


def _accumulate(out, coords, vals, reduce, include_self):
    """Apply `reduce` of vals into out at coords (duplicates combine), PyTorch's scatter_reduce."""
    t = out.dtype
    work = opmath_np(t)
    acc = out.astype(work)
    v = np.asarray(vals).astype(work, copy=False)
    if reduce == "mean":  # PyTorch: (self +) the sum over the count (self counts one); integers floor
        cnt = np.ones(out.shape, work)
        if not include_self:
            acc[coords], cnt[coords] = 0, 0
        np.add.at(acc, coords, v)
        np.add.at(cnt, coords, np.ones_like(v))
        with np.errstate(all="ignore"):
            r = acc / np.maximum(cnt, 1) if np.dtype(work).kind == "f" else np.floor_divide(acc, np.maximum(cnt, 1))
        return r.astype(t)
    if not include_self:
        acc[coords] = _identity(reduce, np.dtype(work))
    if reduce in ("amax", "amin"):
        # NaN propagates (PyTorch); fmax/fmin would drop it, so mark NaN targets afterwards
        uf = np.maximum if reduce == "amax" else np.minimum
        with np.errstate(invalid="ignore"):
            uf.at(acc, coords, v)
    else:
        _UFUNC[reduce].at(acc, coords, v)
    return acc.astype(t, copy=False)


def opmath_np(dt: np.dtype) -> np.dtype:
    from ..dtypes import from_numpy

    if dt.kind == "b":
        return np.dtype(np.int64)
    return opmath(from_numpy(dt)).np


def _scatter_ref(args, attrs, out_types):
    x = np.asarray(args[0])
    idx = np.asarray(args[1])
    src = args[2]
    out = x.copy()
    if x.ndim == 0:
        check_bounds("scatter", idx, 1, 0)
        if idx.size == 0:
            return [out]
        xs, idxs = out.reshape(1), idx.reshape(1)
        srcs = np.asarray(src).reshape(1) if isinstance(src, np.ndarray) else src
        return [_scatter_ref([xs, idxs, srcs], attrs.model_copy(update={"dim": 0}), out_types)[0].reshape(())]
    d = attrs.dim % x.ndim
    i = check_bounds("scatter", idx, x.shape[d], d)
    if idx.size == 0:
        return [out]
    if isinstance(src, np.ndarray):
        vals = src[tuple(slice(0, s) for s in idx.shape)]
    else:
        vals = np.full(idx.shape, scalar_array(src, from_numpy(x.dtype)), dtype=x.dtype)
    coords = _coords(idx, d, i)
    if attrs.reduce == "none":
        out[coords] = np.asarray(vals).astype(x.dtype)  # duplicates: last write wins (unspecified in PyTorch)
        return [out]
    if x.dtype.kind == "b":
        acc = _accumulate(out.astype(np.int64), coords, np.asarray(vals).astype(np.int64), attrs.reduce,
                          attrs.include_self)
        return [acc.astype(bool)]
    return [_accumulate(out, coords, vals, attrs.reduce, attrs.include_self)]


def check_mean_dtype(attrs, x: TensorType, op: str) -> None:
    if attrs.reduce == "mean" and x.dtype.is_bool:
        raise OpError(f"{op} with reduce 'mean' is not supported for bool (as in PyTorch)", ("reduce",))


def expand_mean(e, op: str, inputs, attrs, self_t: TensorType, source_tensor: bool) -> None:
    """A scatter-family op with reduce "mean" as primitives, PyTorch's scatter_reduce "mean": the sum
    (with self where include_self, which then counts one) over the count of sources per target, at
    least 1; integers divide with floor. The sum comes first, so a bad index names `op`.
    source_tensor: the op's source operand must be a tensor (the count adds a full_like of it)."""
    x, idx, src = inputs
    total = e(op, x, idx, src, dim=attrs.dim, reduce="add", include_self=attrs.include_self)
    ones = e("full_like", src, value=1) if source_tensor else 1
    zero_or_one = e("full_like", x, value=1 if attrs.include_self else 0)
    count = e("maximum", e(op, zero_or_one, idx, ones, dim=attrs.dim, reduce="add"), 1)
    e("div" if self_t.dtype.is_float else "floor_divide", total, count, out=0)


def _scatter_decompose(e, inputs, types, attrs):
    if attrs.reduce != "mean":
        return False
    expand_mean(e, "scatter", inputs, attrs, types[0], source_tensor=False)


register(OpDef("scatter", OpKind.scatter, ("self", "index", "src"), _scatter_infer, _scatter_ref,
               attrs=ScatterAttrs, literal_ok=frozenset({2}), extra={
                   "signature": ("self", "dim", "index", "src"),
                   # nvFuser's scatter(arg, index, src, dim), its src a tensor or a scalar
                   "nvfuser": ({"signature": ("self", "index", "src", "dim"), "expand_scalar": {"src": ("index", "self")}},)},
               lowering=Lowering.scatter, decompose=_scatter_decompose,
               doc="scatter(self, dim, index, src, reduce='none', include_self=True): torch.scatter / "
                   "scatter_reduce (add=sum, mul=prod, amax, amin, mean); src may be a number. reduce 'mean' is "
                   "composite: scatter add of src, scatter add of ones (the count), maximum, div (floor_divide "
                   "for integers)"))


class IndexAddAttrs(Attrs):
    dim: int
    alpha: Number = 1

    # the scatter family's accumulation traits (ScatterAttrs has them as fields)
    reduce = property(lambda self: Reduce.add)
    include_self = property(lambda self: True)


def index_family_infer(op: str):
    """The shape rule of index_add and index_reduce: a 1-D index; source of self's shape except
    along dim, where it has the index's length."""
    return lambda ctx, operands, attrs: _index_add_infer(ctx, operands, attrs, op)


def _index_add_infer(ctx, operands, attrs, op="index_add"):
    x = tensor(operands, 0, "self")
    idx = _index_tensor(operands, 1)
    src = tensor(operands, 2, "source")
    d = norm_dim(attrs.dim, x.rank)
    if idx.rank > 1:
        raise OpError(f"{op} needs a 1-D index, got rank {idx.rank}", ("inputs", 1))
    _src_dtype_check(x, src, 2, op)
    if src.rank != x.rank:
        raise OpError(f"source has rank {src.rank} but self has rank {x.rank}", ("inputs", 2))
    n = idx.shape[0] if idx.rank else 1
    for k in range(x.rank):
        want = n if k == d else x.shape[k]
        if dims_equal(src.shape[k], want) is False:
            raise OpError(f"source shape {fmt_shape(src.shape)} should be {fmt_shape(x.shape)} with dim {d} "
                          f"of size {n}", ("inputs", 2))
    if not x.dtype.is_float:  # torch converts alpha to self's dtype (2.5 -> 2 for integers)
        check_scalar(attrs.alpha, x.dtype, ("alpha",))
    return [TensorType(x.dtype, x.shape)]


def index_family_ref(op: str, body):
    """The reference of index_add or index_reduce: `body(x, i, source, dim, attrs)` gets the index
    checked and flat; a 0-d self is a row of one."""
    def ref(args, attrs, out_types):
        x, idx, src = np.asarray(args[0]), np.asarray(args[1]).reshape(-1), np.asarray(args[2])
        if x.ndim == 0:
            one = ref([x.reshape(1), idx, src.reshape(1)], attrs.model_copy(update={"dim": 0}), out_types)
            return [one[0].reshape(())]
        d = attrs.dim % x.ndim
        return [body(x, check_bounds(op, idx, x.shape[d], d), src, d, attrs)]

    return ref


def _index_add(x, i, src, d, attrs):
    work = opmath_np(x.dtype)
    acc = x.astype(work)
    v = src.astype(work)
    if attrs.alpha != 1:
        dt = from_numpy(x.dtype)
        alpha = scalar_array(attrs.alpha, dt) if not dt.is_float else np.asarray(float(attrs.alpha))
        v = v * alpha.astype(work)
    vv = np.moveaxis(v, d, 0)
    accm = np.moveaxis(acc, d, 0)
    np.add.at(accm, i, vv)
    return acc.astype(x.dtype) if x.dtype.kind != "b" else acc.astype(bool)


register(OpDef("index_add", OpKind.scatter, ("self", "index", "source"), _index_add_infer,
               index_family_ref("index_add", _index_add),
               attrs=IndexAddAttrs, extra={"signature": ("self", "dim", "index", "source")},
               lowering=Lowering.index_add,
               doc="index_add(self, dim, index, source, alpha=1): self[..., index[i], ...] += alpha * source[..., i, ...]"))


class IndexPutAttrs(Attrs):
    accumulate: bool = False

    # the scatter family's accumulation traits (ScatterAttrs has them as fields)
    reduce = property(lambda self: Reduce.add if self.accumulate else Reduce.none)
    include_self = property(lambda self: True)


def _index_put_infer(ctx, operands, attrs):
    x = tensor(operands, 0, "self")
    idx = _index_tensor(operands, 1)
    vals = operands[2]
    if x.rank == 0:
        raise OpError("index_put needs self of rank >= 1", ("inputs", 0))
    _src_dtype_check(x, vals, 2, "index_put")
    if isinstance(vals, Scalar):
        check_scalar(vals.value, x.dtype, ("inputs", 2))
    region = tuple(idx.shape) + tuple(x.shape[1:])
    if isinstance(vals, TensorType):
        b = broadcast_shapes([region, vals.shape], lambda i: ("inputs", 2))
        if len(b) != len(region) or any(dims_equal(p, q) is False for p, q in zip(b, region)):
            raise OpError(f"values of shape {fmt_shape(vals.shape)} cannot broadcast to the indexed shape "
                          f"{fmt_shape(region)}", ("inputs", 2))
    return [TensorType(x.dtype, x.shape)]


def _index_put_ref(args, attrs, out_types):
    x, idx, vals = np.asarray(args[0]), np.asarray(args[1]), args[2]
    i = check_bounds("index_put", idx, x.shape[0], 0, allow_negative=True)
    region = idx.shape + x.shape[1:]
    v = np.broadcast_to(np.asarray(vals).astype(x.dtype) if isinstance(vals, np.ndarray)
                        else scalar_array(vals, from_numpy(x.dtype)), region)
    if not attrs.accumulate:
        out = x.copy()
        out[i] = v
        return [out]
    work = opmath_np(x.dtype)
    acc = x.astype(work)
    np.add.at(acc, i, v.astype(work))
    return [acc.astype(x.dtype) if x.dtype.kind != "b" else acc.astype(bool)]


register(OpDef("index_put", OpKind.scatter, ("self", "index", "values"), _index_put_infer, _index_put_ref,
               attrs=IndexPutAttrs, literal_ok=frozenset({2}),
               extra={"nvfuser": ({"name": "index_put_accumulate", "signature": ("self", "index", "values"),
                                   "keywords": {"acc": "self", "value": "values"}, "fixed": {"accumulate": True}},)},
               lowering=Lowering.index_put,
               doc="index_put(self, index, values, accumulate=False): self[index] = values (or +=); "
                   "one integer index tensor on dim 0, negative indices wrap"))

_ = (Scalar, DType)
