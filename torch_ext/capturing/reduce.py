"""Lowerings of ATen's reductions and normalizations onto the registry's reductions and composites.

sum, prod, mean, amax, amin, argmax, argmin, softmax, log_softmax and var/std/var_mean's
`correction` overloads are the registry ops of their names, with PyTorch's argument order and dtype
rules (integer sums in int64, dtype= converting first, float16/bfloat16 computed in float32), so the
generic lowering takes them. The overloads ATen spells differently are mapped here: max/min (of all
elements, along a dim with their positions, or elementwise), logsumexp (an empty dim list), any/all,
var/std's `unbiased`, std_mean, _softmax's `half_to_float`. layer_norm, native_layer_norm and
rms_norm are lowered whole (so the capture's decomposition table keeps them) to the mean / rsqrt
chain users write by hand, the ops of benchmarks/workloads.py's norm graphs.
"""

from __future__ import annotations

import torch
from segfuse.compiler.builder import Tensor
from segfuse.compiler.dtypes import DType
from segfuse.compiler.ops.pointwise import opmath

from .lowering import bind_schema, lowers, suggest

aten = torch.ops.aten

suggest("median", "torch.sort(x, dim).values.select(dim, (x.shape[dim] - 1) // 2)")
suggest("kthvalue", "torch.sort(x, dim).values.select(dim, k - 1)")
suggest("linalg_vector_norm", "x.pow(2).sum(dim).sqrt() (the 2-norm) or x.abs().amax(dim) (the inf-norm)")
suggest("nansum", "torch.where(x.isnan(), 0, x).sum(dim)")
suggest("aminmax", "(x.amin(dim), x.amax(dim))")


def _dims(dim):
    """ATen's dim argument (None, an int, a list) as the registry's `dims`."""
    return [dim] if isinstance(dim, int) else (None if dim is None else list(dim))


# ---- max, min, any, all -------------------------------------------------------------------
def _extreme(cx, x, dim, keepdim, largest: bool):
    """max / min of all elements (.default), against another tensor (.other: `dim` is that tensor),
    or along a dim with the position of the first extreme (.dim's (values, indices), NaN counting
    as the extreme)."""
    fd = cx.fd
    if isinstance(dim, Tensor):
        return (fd.ops.maximum if largest else fd.ops.minimum)(x, dim)
    reduce = fd.ops.amax if largest else fd.ops.amin
    if dim is None:
        return reduce(x)
    keyed = fd.ops.cast(x, "uint8") if x.dtype.is_bool else x  # (the registry's argmax takes no bool)
    return reduce(x, [dim], keepdim), (fd.ops.argmax if largest else fd.ops.argmin)(keyed, dim, keepdim)


@lowers(aten.logsumexp.default)
def logsumexp(cx, x, dim, keepdim=False):
    """An empty dim list reduces every dim and keeps them as 1, as PyTorch does (with keepdim: without
    it, PyTorch's own kernel fails)."""
    if not dim:
        if not keepdim:
            cx.refuse("logsumexp over an empty dim list without keepdim (PyTorch's kernel fails on it)",
                      alternative="x.logsumexp(dim=list(range(x.dim())))")
        return cx.fd.ops.logsumexp(x, list(range(len(x.shape))), True)
    return cx.fd.ops.logsumexp(x, _dims(dim), keepdim)


@lowers(aten.max)
def max_(cx, x, dim=None, keepdim=False):
    return _extreme(cx, x, dim, keepdim, largest=True)


@lowers(aten.min)
def min_(cx, x, dim=None, keepdim=False):
    return _extreme(cx, x, dim, keepdim, largest=False)


def _logical(cx, x, dim, keepdim, any_: bool):
    """any: some element is nonzero (NaN is); all: none is zero. A count of hits, in int64, compared
    with 0; PyTorch gives uint8 for a uint8 input, bool otherwise."""
    fd = cx.fd
    hits = fd.ops.sum(fd.ops.ne(x, 0) if any_ else fd.ops.eq(x, 0), _dims(dim), keepdim)
    r = fd.ops.gt(hits, 0) if any_ else fd.ops.eq(hits, 0)
    return fd.ops.cast(r, "uint8") if x.dtype is DType.uint8 else r


@lowers(aten.any)
def any_(cx, x, dim=None, keepdim=False):
    return _logical(cx, x, dim, keepdim, any_=True)


@lowers(aten.all)
def all_(cx, x, dim=None, keepdim=False):
    return _logical(cx, x, dim, keepdim, any_=False)


# ---- var, std -----------------------------------------------------------------------------
def _var_args(cx, x, args, kwargs):
    """(dims, correction, keepdim) of any overload of var/std/var_mean/std_mean: .correction(self,
    dim=None, *, correction=None, keepdim=False), .dim(self, dim, unbiased=True, keepdim=False),
    .default(self, unbiased=True)."""
    given = {a.name: v for a, v, _ in bind_schema(cx.node.target, (x, *args), kwargs)}
    if "unbiased" in given:
        correction = 1 if given["unbiased"] else 0
    else:
        correction = 1 if given.get("correction") is None else given["correction"]
    return _dims(given.get("dim")), correction, bool(given.get("keepdim", False))


@lowers(aten.var)
def var(cx, x, *args, **kwargs):
    return cx.fd.ops.var(x, *_var_args(cx, x, args, kwargs))


@lowers(aten.std)
def std(cx, x, *args, **kwargs):
    return cx.fd.ops.std(x, *_var_args(cx, x, args, kwargs))


@lowers(aten.var_mean)
def var_mean(cx, x, *args, **kwargs):
    return cx.fd.ops.var_mean(x, *_var_args(cx, x, args, kwargs))


@lowers(aten.std_mean)
def std_mean(cx, x, *args, **kwargs):
    """(std, mean): std rounds once from the variance in opmath, as torch's std_mean."""
    dims, correction, keepdim = _var_args(cx, x, args, kwargs)
    return cx.fd.ops.std(x, dims, correction, keepdim), cx.fd.ops.mean(x, dims, keepdim)


# ---- _softmax, _log_softmax -----------------------------------------------------------------
@lowers(aten._softmax)
def softmax_(cx, x, dim, half_to_float):
    return cx.fd.ops.softmax(x, dim, DType.float32 if half_to_float else None)


@lowers(aten._log_softmax)
def log_softmax_(cx, x, dim, half_to_float):
    return cx.fd.ops.log_softmax(x, dim, DType.float32 if half_to_float else None)


# ---- layer_norm, rms_norm -----------------------------------------------------------------
def _normalized_dims(cx, x, normalized_shape) -> list[int]:
    rank, n = len(x.shape), len(normalized_shape)
    if not 1 <= n <= rank:
        cx.refuse(f"normalized_shape {list(normalized_shape)} does not fit an input of rank {rank}")
    return list(range(rank - n, rank))


def _upcast(fd, x):
    """x in its opmath dtype (float32 for float16/bfloat16), where torch's norms compute."""
    work = opmath(x.dtype)
    return x if work is x.dtype else fd.ops.cast(x, work)


def _round(fd, y, dtype: DType):
    return y if y.dtype is dtype else fd.ops.cast(y, dtype)


def _layer_norm(cx, x, normalized_shape, weight, bias, eps):
    """(out, mean, rstd) in opmath: d = x - mean(x); out = d * rsqrt(mean(d * d) + eps) * weight + bias;
    mean and rstd keep the normalized dims as 1."""
    fd = cx.fd
    dims = _normalized_dims(cx, x, normalized_shape)
    xw = _upcast(fd, x)
    mu = fd.ops.mean(xw, dims, True)
    d = fd.ops.sub(xw, mu)
    rstd = fd.ops.rsqrt(fd.ops.add(fd.ops.mean(fd.ops.mul(d, d), dims, True), eps))
    y = fd.ops.mul(d, rstd)
    if weight is not None:
        y = fd.ops.mul(y, weight)
    if bias is not None:
        y = fd.ops.add(y, bias)
    return y, mu, rstd


@lowers(aten.native_layer_norm)
def native_layer_norm(cx, x, normalized_shape, weight, bias, eps):
    """out in x's dtype; mean and rstd in the dtype PyTorch gives them on the traced device (x's on
    the CPU, float32 for a float16/bfloat16 x on CUDA)."""
    results = _layer_norm(cx, x, normalized_shape, weight, bias, eps)
    return tuple(_round(cx.fd, t, cx.dtype(v)) for t, v in zip(results, cx.out))


@lowers(aten.layer_norm)
def layer_norm(cx, x, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    return _round(cx.fd, _layer_norm(cx, x, normalized_shape, weight, bias, eps)[0], x.dtype)


def _rms_norm(cx, x, normalized_shape, weight, eps):
    """(out, rstd): x * rsqrt(mean(x * x) + eps) * weight in opmath, out rounded to x's dtype, rstd
    in opmath; eps None is the opmath dtype's machine epsilon (torch's rms_norm)."""
    fd = cx.fd
    dims = _normalized_dims(cx, x, normalized_shape)
    xw = _upcast(fd, x)
    if eps is None:
        eps = torch.finfo(torch.float64 if xw.dtype is DType.float64 else torch.float32).eps
    rstd = fd.ops.rsqrt(fd.ops.add(fd.ops.mean(fd.ops.mul(xw, xw), dims, True), eps))
    y = fd.ops.mul(xw, rstd)
    if weight is not None:
        y = fd.ops.mul(y, weight)
    return _round(fd, y, x.dtype), rstd


@lowers(aten.rms_norm)
def rms_norm(cx, x, normalized_shape, weight=None, eps=None):
    return _rms_norm(cx, x, normalized_shape, weight, eps)[0]


@lowers(aten._fused_rms_norm)
def fused_rms_norm(cx, x, normalized_shape, weight=None, eps=None):
    results = _rms_norm(cx, x, normalized_shape, weight, eps)
    return tuple(_round(cx.fd, t, cx.dtype(v)) for t, v in zip(results, cx.out))
