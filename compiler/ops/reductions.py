"""Reductions (sum prod amax amin mean argmax argmin), scans (cumsum cumprod cummax cummin) and sorting
(argsort sort topk), with PyTorch's dtype rules: integer sums and products accumulate in int64,
reduced-precision floats accumulate in float32."""

from __future__ import annotations

import warnings

import numpy as np

from ..dtypes import DType
from ..errors import OpError
from .pointwise import opmath
from .registry import (
    Attrs,
    Combiner,
    LibrarySort,
    Lowering,
    OpDef,
    OpKind,
    TensorType,
    norm_dim,
    register,
    tensor,
)


class ReduceAttrs(Attrs):
    dims: list[int] | int | None = None
    keepdim: bool = False
    dtype: DType | None = None


class ArgReduceAttrs(Attrs):
    dim: int | None = None
    keepdim: bool = False


def reduced_dims(x: TensorType, dims) -> tuple[int, ...]:
    if dims is None or (isinstance(dims, list) and not dims):  # PyTorch: dim=[] reduces every dim
        return tuple(range(x.rank))
    lst = [dims] if isinstance(dims, int) else list(dims)
    out = []
    for k, d in enumerate(lst):
        nd = norm_dim(d, x.rank, ("dims",) if isinstance(dims, int) else ("dims", k))
        if nd in out:
            raise OpError(f"dim {nd} appears more than once", ("dims", k))
        out.append(nd)
    if x.rank == 0:
        return ()
    return tuple(sorted(out))


def _out_shape(x: TensorType, rdims, keepdim):
    if keepdim:
        return tuple(1 if i in rdims else d for i, d in enumerate(x.shape))
    return tuple(d for i, d in enumerate(x.shape) if i not in rdims)


def _acc_dtype(name, x: TensorType, attrs) -> DType:
    if attrs.dtype is not None:
        return attrs.dtype
    if name in ("sum", "prod") and not x.dtype.is_float:
        return DType.int64
    return x.dtype


def _make_reduce(name, np_fn, combiner, needs_nonempty=False, float_only=False, divide_by_count=False, doc="",
                 nvfuser_name=None):
    def infer(ctx, operands, attrs):
        x = tensor(operands, 0)
        rd = reduced_dims(x, attrs.dims)
        if float_only and not (attrs.dtype or x.dtype).is_float:
            raise OpError(f"{name} needs a floating-point input or dtype, got {x.dtype}", ("inputs", 0))
        if needs_nonempty:
            for d in rd:
                if x.shape[d] == 0:
                    raise OpError(f"{name} of an empty dim {d} has no identity", ("dims",))
        if name in ("amax", "amin") and attrs.dtype is not None:
            raise OpError(f"{name} takes no dtype", ("dtype",))
        return [TensorType(_acc_dtype(name, x, attrs), _out_shape(x, rd, attrs.keepdim))]

    def ref(args, attrs, out_types):
        x = np.asarray(args[0])
        t = out_types[0]
        rd = tuple(d % x.ndim for d in ([attrs.dims] if isinstance(attrs.dims, int) else attrs.dims)) \
            if attrs.dims not in (None, []) and x.ndim else None
        if x.ndim == 0:
            rd = None
        if needs_nonempty and x.size == 0 and (rd is None or any(x.shape[d] == 0 for d in rd)):
            raise OpError(f"{name} of an empty tensor has no identity", ("inputs", 0))
        work = opmath(t.dtype).np if t.dtype.is_float else t.dtype.np
        # dtype=... converts the input first (torch.sum(x, dtype=d) is torch.sum(x.to(d)))
        xs = x.astype(t.dtype.np).astype(work) if name != "amax" and name != "amin" else x.astype(opmath(t.dtype).np)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # mean of an empty slice is NaN, as in torch
            r = np_fn(xs, axis=rd, keepdims=attrs.keepdim)
            return [np.asarray(r).astype(t.dtype.np).reshape(t.shape)]

    # nvFuser's forms: sum(arg, dim=...), sum(arg, dtype) (a full reduction), under nvFuser's name where given
    named = {"name": nvfuser_name} if nvfuser_name else {}
    nvfuser = ({**named, "keywords": {"dim": "dims"}}, {**named, "signature": ("x", "dtype")})
    return register(OpDef(name, OpKind.reduction, ("x",), infer, ref, attrs=ReduceAttrs, doc=doc,
                          lowering=Lowering.reduce, combiner=combiner, divide_by_count=divide_by_count,
                          extra={"nvfuser": nvfuser}))


_make_reduce("sum", np.sum, Combiner.add, doc="sum(x, dims=None, keepdim=False, dtype=None); integers sum in int64")
_make_reduce("prod", np.prod, Combiner.mul, doc="prod(x, dims=None, keepdim=False, dtype=None)")
_make_reduce("amax", np.max, Combiner.amax, needs_nonempty=True, doc="amax(x, dims=None, keepdim=False); NaN propagates",
             nvfuser_name="max")
_make_reduce("amin", np.min, Combiner.amin, needs_nonempty=True, doc="amin(x, dims=None, keepdim=False); NaN propagates",
             nvfuser_name="min")
_make_reduce("mean", np.mean, Combiner.add, float_only=True, divide_by_count=True,
             doc="mean(x, dims=None, keepdim=False, dtype=None); floats only")


def _make_argreduce(name, np_fn, extreme: Combiner):
    def infer(ctx, operands, attrs):
        x = tensor(operands, 0)
        if x.dtype.is_bool:  # as in PyTorch ("argmax" is not implemented for 'Bool')
            raise OpError(f"{name} is not supported for bool (cast to uint8 first)", ("inputs", 0))
        if attrs.dim is None:
            if any(d == 0 for d in x.shape):
                raise OpError(f"{name} of an empty tensor", ("inputs", 0))
            shape = tuple(1 for _ in x.shape) if attrs.keepdim else ()
            return [TensorType(DType.int64, shape)]
        d = norm_dim(attrs.dim, x.rank)
        if x.rank and x.shape[d] == 0:
            raise OpError(f"{name} over empty dim {d}", ("dim",))
        rd = (d,) if x.rank else ()
        return [TensorType(DType.int64, _out_shape(x, rd, attrs.keepdim))]

    def ref(args, attrs, out_types):
        x = np.asarray(args[0])
        if x.dtype.kind == "f" or x.dtype.name == "bfloat16":
            x = x.astype(np.float64)
        if attrs.dim is None or x.ndim == 0:
            r = np_fn(x.reshape(-1))
        else:
            r = np_fn(x, axis=attrs.dim % x.ndim)
        return [np.asarray(r, dtype=np.int64).reshape(out_types[0].shape)]

    register(OpDef(name, OpKind.reduction, ("x",), infer, ref, attrs=ArgReduceAttrs,
                   lowering=Lowering.argreduce, combiner=extreme,
                   doc=f"{name}(x, dim=None, keepdim=False) -> int64; the first extreme (NaN counts as the max)"))


def _nan_first_argmax(x, axis=None):
    if x.dtype.kind == "f":
        isn = np.isnan(x)
        if isn.any():
            base = np.argmax(np.where(isn, -np.inf, x), axis=axis)
            first_nan = np.argmax(isn, axis=axis)
            has = isn.any(axis=axis)
            return np.where(has, first_nan, base)
    return np.argmax(x, axis=axis)


def _nan_first_argmin(x, axis=None):
    if x.dtype.kind == "f":
        isn = np.isnan(x)
        if isn.any():
            base = np.argmin(np.where(isn, np.inf, x), axis=axis)
            first_nan = np.argmax(isn, axis=axis)
            has = isn.any(axis=axis)
            return np.where(has, first_nan, base)
    return np.argmin(x, axis=axis)


_make_argreduce("argmax", _nan_first_argmax, Combiner.amax)
_make_argreduce("argmin", _nan_first_argmin, Combiner.amin)


# ---- scans ------------------------------------------------------------------------------
class ScanAttrs(Attrs):
    dim: int
    dtype: DType | None = None


def _make_scan(name, np_fn, combiner: Combiner):
    def infer(ctx, operands, attrs):
        x = tensor(operands, 0)
        norm_dim(attrs.dim, x.rank)
        dt = attrs.dtype or (x.dtype if x.dtype.is_float else DType.int64)
        return [TensorType(dt, x.shape)]

    def ref(args, attrs, out_types):
        x = np.asarray(args[0])
        t = out_types[0]
        # float16/bfloat16 accumulate in float32 (opmath, as the CUDA block scan and torch's CPU scan; torch's
        # CUDA scan carries them in their own dtype), each output rounded once; float32 in float64 as
        # torch's CPU scan (its CPU acc_type; the CUDA kernel and torch's CUDA scan carry float32)
        work = np.dtype(np.float64) if t.dtype is DType.float32 else opmath(t.dtype).np
        if x.ndim == 0:
            return [x.astype(t.dtype.np)]
        with np.errstate(all="ignore"):
            r = np_fn(x.astype(t.dtype.np).astype(work), axis=attrs.dim % x.ndim)
            if combiner is Combiner.add:  # from the identity, as torch and the CUDA scan: -0.0 + 0.0 is +0.0
                r = r + np.zeros((), work)
        return [r.astype(t.dtype.np)]

    register(OpDef(name, OpKind.scan, ("x",), infer, ref, attrs=ScanAttrs, lowering=Lowering.scan, combiner=combiner,
                   doc=f"{name}(x, dim, dtype=None): inclusive; integers accumulate in int64"))


_make_scan("cumsum", np.cumsum, Combiner.add)
_make_scan("cumprod", np.cumprod, Combiner.mul)


class CumExtremeAttrs(Attrs):
    dim: int


def _make_cum_extreme(name, extreme: Combiner):
    """cummax, cummin: (values, int64 indices) of the running extreme along dim. As PyTorch: a tie
    takes the later position, NaN is the extreme and a later NaN takes its position."""
    acc = np.maximum if extreme is Combiner.amax else np.minimum  # (both propagate NaN)

    def infer(ctx, operands, attrs):
        x = tensor(operands, 0)
        norm_dim(attrs.dim, x.rank)
        return [TensorType(x.dtype, x.shape), TensorType(DType.int64, x.shape)]

    def ref(args, attrs, out_types):
        x = np.asarray(args[0])
        if x.ndim == 0:
            return [x.copy(), np.zeros((), dtype=np.int64)]
        ax = attrs.dim % x.ndim
        k = sort_key(x)
        run = acc.accumulate(k, axis=ax)
        with np.errstate(invalid="ignore"):
            hit = (k == run) | (np.isnan(k) if k.dtype.kind == "f" else False)
        pos = np.arange(x.shape[ax]).reshape([-1 if a == ax else 1 for a in range(x.ndim)])
        idx = np.maximum.accumulate(np.where(hit, pos, -1), axis=ax).astype(np.int64)
        return [np.take_along_axis(x, idx, axis=ax), idx]

    register(OpDef(name, OpKind.scan, ("x",), infer, ref, attrs=CumExtremeAttrs, n_outputs=2,
                   lowering=Lowering.argscan, combiner=extreme,
                   doc=f"{name}(x, dim) -> (values, indices): the running {'max' if extreme is Combiner.amax else 'min'}"
                       " along dim and its int64 position; ties take the later position, NaN propagates (PyTorch)"))


_make_cum_extreme("cummax", Combiner.amax)
_make_cum_extreme("cummin", Combiner.amin)


# ---- sorting ----------------------------------------------------------------------------
def sort_key(x: np.ndarray) -> np.ndarray:
    """A key that orders like PyTorch's sort: NaN after +inf; float16/bfloat16 via float64."""
    if x.dtype.kind == "f" or x.dtype.name == "bfloat16":
        return x.astype(np.float64)
    return x


def stable_argsort(x: np.ndarray, axis: int, descending: bool) -> np.ndarray:
    """Stable argsort in either direction; ties keep their original order (as torch stable=True)."""
    k = sort_key(x)
    if not descending:
        return np.argsort(k, axis=axis, kind="stable")
    rev = np.flip(k, axis=axis)
    n = k.shape[axis]
    return np.flip(n - 1 - np.argsort(rev, axis=axis, kind="stable"), axis=axis)


class SortAttrs(Attrs):
    dim: int = -1
    descending: bool = False
    stable: bool = False


def _sort_infer_factory(n_out):
    def infer(ctx, operands, attrs):
        x = tensor(operands, 0)
        norm_dim(attrs.dim, x.rank)
        idx = TensorType(DType.int64, x.shape)
        return [idx] if n_out == 1 else [TensorType(x.dtype, x.shape), idx]

    return infer


def _argsort_ref(args, attrs, out_types):
    x = np.asarray(args[0])
    if x.ndim == 0:
        return [np.zeros((), dtype=np.int64)]
    return [stable_argsort(x, attrs.dim % x.ndim, attrs.descending).astype(np.int64)]


def _sort_ref(args, attrs, out_types):
    x = np.asarray(args[0])
    if x.ndim == 0:
        return [x.copy(), np.zeros((), dtype=np.int64)]
    ax = attrs.dim % x.ndim
    idx = stable_argsort(x, ax, attrs.descending).astype(np.int64)
    return [np.take_along_axis(x, idx, axis=ax), idx]


# What a library sort segment runs (compiler/cuda/library_sorts.py's _lib_sort and _lib_topk).
_SORT_LIBRARY = "argsort (segfuse.radix_sort for one row, else cupy.argsort) + cupy.take_along_axis"
register(OpDef("argsort", OpKind.sort, ("x",), _sort_infer_factory(1), _argsort_ref, attrs=SortAttrs,
               lowering=Lowering.sort, library_sort=LibrarySort.indices,
               library="segfuse.radix_sort for one row, else cupy.argsort (stable)",
               doc="argsort(x, dim=-1, descending=False, stable=False) -> int64; segfuse always sorts stably"))
register(OpDef("sort", OpKind.sort, ("x",), _sort_infer_factory(2), _sort_ref, attrs=SortAttrs, n_outputs=2,
               lowering=Lowering.sort, library=_SORT_LIBRARY, library_sort=LibrarySort.values_and_indices,
               doc="sort(x, dim=-1, descending=False, stable=False) -> (values, indices)"))


class TopkAttrs(Attrs):
    k: int | str
    dim: int = -1
    largest: bool = True
    sorted: bool = True

    @property
    def descending(self) -> bool:  # (the sort family's order trait: the largest come first)
        return self.largest


def _topk_infer(ctx, operands, attrs):
    x = tensor(operands, 0)
    d = norm_dim(attrs.dim, x.rank)
    k = ctx.size(attrs.k, ("k",))
    size = x.shape[d] if x.rank else 1
    if isinstance(k, int) and (k < 0 or (isinstance(size, int) and k > size)):
        raise OpError(f"k={k} is out of range for a dim of size {size}", ("k",))
    shape = list(x.shape)
    if x.rank:
        shape[d] = k
    return [TensorType(x.dtype, tuple(shape)), TensorType(DType.int64, tuple(shape))]


def _topk_ref(args, attrs, out_types):
    x = np.asarray(args[0])
    if x.ndim == 0:
        return [x.copy(), np.zeros((), dtype=np.int64)]
    ax = attrs.dim % x.ndim
    k = out_types[0].shape[ax]
    idx = stable_argsort(x, ax, attrs.largest).astype(np.int64)
    idx = np.take(idx, np.arange(k), axis=ax)
    return [np.take_along_axis(x, idx, axis=ax), idx]


register(OpDef("topk", OpKind.sort, ("x",), _topk_infer, _topk_ref, attrs=TopkAttrs, n_outputs=2,
               lowering=Lowering.sort, library=_SORT_LIBRARY + ", first k", library_sort=LibrarySort.first_k,
               doc="topk(x, k, dim=-1, largest=True, sorted=True) -> (values, indices); ties keep input order"))
