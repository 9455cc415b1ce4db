"""Composite reductions: softmax, log_softmax, logsumexp, var, std, var_mean.

Each is one registry entry with PyTorch's dtype rules and a direct NumPy reference, and a
decomposition into primitive ops (reductions and pointwise ops) that the IR expands when it
validates a graph, so the segmenter fuses and the code generator renders only existing ops. They
compute in opmath (float32 for float16/bfloat16 inputs) and round once at the end, as PyTorch does.

Edge cases follow PyTorch: a softmax row of -inf (or with +inf) is NaN, logsumexp of a row of -inf
is -inf and of an empty row -inf, var with N - correction <= 0 divides by 0 (inf, or NaN for an
empty row). The max a softmax subtracts comes from `amax`, which has no identity for an empty
dim: a reduced dim that may be empty (static 0 or symbolic) is padded with one -inf for it.
"""

from __future__ import annotations

import warnings

import numpy as np

from ..dtypes import DEFAULT_FLOAT, DType
from ..errors import OpError
from .pointwise import opmath
from .reductions import reduced_dims
from .registry import Attrs, OpDef, OpKind, TensorType, norm_dim, register, tensor


def _out_shape(x: TensorType, rd, keepdim) -> tuple:
    return tuple(1 if k in rd else d for k, d in enumerate(x.shape)) if keepdim else tuple(
        d for k, d in enumerate(x.shape) if k not in rd)


def _to_work(e, x: str, xt: TensorType, dt: DType) -> str:
    """x converted to dt (PyTorch's dtype= converts first), then to dt's opmath type."""
    if xt.dtype is not dt:
        x = e("cast", x, dtype=dt.value)
    w = opmath(dt)
    return x if w is dt else e("cast", x, dtype=w.value)


def _finish(e, op: str, *args, dt: DType, out: int = 0, **attrs) -> str:
    """The last op of an output, rounded to its dtype when opmath differs."""
    if opmath(dt) is dt:
        return e(op, *args, out=out, **attrs)
    return e("cast", e(op, *args, **attrs), dtype=dt.value, out=out)


def _stable_max(e, x: str, xt: TensorType, rd) -> str:
    """amax over rd with keepdim: reduced dims that may be empty get one -inf element first."""
    maybe_empty = [k for k in rd if not (isinstance(xt.shape[k], int) and xt.shape[k] > 0)]
    if maybe_empty:
        pad = [0] * (2 * (xt.rank - min(maybe_empty)))
        for k in maybe_empty:
            pad[2 * (xt.rank - 1 - k) + 1] = 1
        x = e("pad", x, pad=pad, value=float("-inf"))
    return e("amax", x, dims=list(rd), keepdim=True)


# ---- softmax, log_softmax ---------------------------------------------------------------
class SoftmaxAttrs(Attrs):
    dim: int
    dtype: DType | None = None


def _softmax_family(name: str, log: bool):
    def infer(ctx, operands, attrs):
        x = tensor(operands, 0)
        norm_dim(attrs.dim, x.rank)
        dt = attrs.dtype or x.dtype
        if not dt.is_float:
            raise OpError(f"{name} needs a floating-point input or dtype, got {dt} (PyTorch: not implemented "
                          "for integers; pass dtype)", ("inputs", 0))
        return [TensorType(dt, x.shape)]

    def decompose(e, inputs, types, attrs):
        xt, dt = types[0], attrs.dtype or types[0].dtype
        rd = (norm_dim(attrs.dim, xt.rank),) if xt.rank else ()
        xw = _to_work(e, inputs[0], xt, dt)
        z = e("sub", xw, _stable_max(e, xw, xt, rd))
        ex = e("exp", z)
        s = e("sum", ex, dims=list(rd), keepdim=True)
        if log:
            _finish(e, "sub", z, e("log", s), dt=dt)
        else:
            _finish(e, "div", ex, s, dt=dt)

    def ref(args, attrs, out_types):
        dt = out_types[0].dtype
        x = np.asarray(args[0]).astype(dt.np).astype(np.float64)
        ax = attrs.dim % x.ndim if x.ndim else None
        with np.errstate(all="ignore"):
            m = np.max(x, axis=ax, keepdims=True, initial=-np.inf)
            z = x - m
            s = np.sum(np.exp(z), axis=ax, keepdims=True)
            r = z - np.log(s) if log else np.exp(z) / s
        return [r.astype(dt.np)]

    register(OpDef(name, OpKind.reduction, ("x",), infer, ref, attrs=SoftmaxAttrs, decompose=decompose,
                   doc=f"{name}(x, dim, dtype=None): " + ("log(softmax(x))" if log else "exp(x) / sum(exp(x))")
                   + " along dim, from x - amax(x); floats only (dtype= converts first). Composite: "
                     "amax, sub, exp, sum, " + ("log, sub" if log else "div")))


_softmax_family("softmax", log=False)
_softmax_family("log_softmax", log=True)


# ---- logsumexp --------------------------------------------------------------------------
class LogsumexpAttrs(Attrs):
    dims: list[int] | int
    keepdim: bool = False


def _float_of(dt: DType) -> DType:
    return dt if dt.is_float else DEFAULT_FLOAT  # (integers and bool: torch's default dtype)


def _lse_infer(ctx, operands, attrs):
    x = tensor(operands, 0)
    rd = reduced_dims(x, attrs.dims)
    return [TensorType(_float_of(x.dtype), _out_shape(x, rd, attrs.keepdim))]


def _lse_decompose(e, inputs, types, attrs):
    xt = types[0]
    dt = _float_of(xt.dtype)
    rd = reduced_dims(xt, attrs.dims)
    xw = _to_work(e, inputs[0], xt, dt)
    m = _stable_max(e, xw, xt, rd)
    m = e("where", e("isinf", m), 0, m)  # an infinite max (a row of -inf, or +inf) is not subtracted
    lse = e("log", e("sum", e("exp", e("sub", xw, m)), dims=list(rd), keepdim=attrs.keepdim))
    if not attrs.keepdim and rd:
        m = e("squeeze", m, dims=list(rd))
    _finish(e, "add", lse, m, dt=dt)


def _lse_ref(args, attrs, out_types):
    t = out_types[0]
    x = np.asarray(args[0]).astype(t.dtype.np).astype(np.float64)
    rd = reduced_dims(TensorType(t.dtype, x.shape), attrs.dims) or None
    with np.errstate(all="ignore"):
        m = np.max(x, axis=rd, keepdims=True, initial=-np.inf)
        m = np.where(np.isinf(m), 0.0, m)
        r = np.log(np.sum(np.exp(x - m), axis=rd, keepdims=True)) + m
    return [r.reshape(t.shape).astype(t.dtype.np)]


register(OpDef("logsumexp", OpKind.reduction, ("x",), _lse_infer, _lse_ref, attrs=LogsumexpAttrs,
               decompose=_lse_decompose,
               doc="logsumexp(x, dims, keepdim=False): log(sum(exp(x))) over dims (a list; [] is every dim), "
                   "stable; integers and bool give float32. Composite: amax, where, sub, exp, sum, log, add"))


# ---- var, std, var_mean -----------------------------------------------------------------
class VarAttrs(Attrs):
    dims: list[int] | int | None = None
    correction: int | float = 1
    keepdim: bool = False


def _var_family(name: str):
    def infer(ctx, operands, attrs):
        x = tensor(operands, 0)
        if not x.dtype.is_float:
            raise OpError(f"{name} needs a floating-point input, got {x.dtype} (as PyTorch's std and var)",
                          ("inputs", 0))
        t = TensorType(x.dtype, _out_shape(x, reduced_dims(x, attrs.dims), attrs.keepdim))
        return [t, t] if name == "var_mean" else [t]

    def decompose(e, inputs, types, attrs):
        xt = types[0]
        dt, rd = xt.dtype, list(reduced_dims(xt, attrs.dims))
        xw = _to_work(e, inputs[0], xt, dt)
        mu = e("mean", xw, dims=rd, keepdim=True)
        dev = e("sub", xw, mu)
        ss = e("sum", e("mul", dev, dev), dims=rd, keepdim=attrs.keepdim)
        sizes = [xt.shape[k] for k in rd]
        if all(isinstance(d, int) for d in sizes):  # N - correction, at least 0 (PyTorch)
            den = max(float(np.prod(sizes)) - attrs.correction, 0.0)
        else:  # N counted at run time (a sum of ones), in float64
            n = e("sum", e("full_like", xw, value=1, dtype="float64"), dims=rd, keepdim=attrs.keepdim)
            den = e("maximum", e("sub", n, attrs.correction), 0)
            den = e("cast", den, dtype=opmath(dt).value)
        if name == "std":
            _finish(e, "sqrt", e("div", ss, den), dt=dt)
            return
        _finish(e, "div", ss, den, dt=dt)
        if name == "var_mean":
            if rd and not attrs.keepdim:
                _finish(e, "squeeze", mu, dims=rd, dt=dt, out=1)
            else:
                e("cast", mu, dtype=dt.value, out=1)

    def ref(args, attrs, out_types):
        t = out_types[0]
        x = np.asarray(args[0]).astype(np.float64)
        rd = reduced_dims(TensorType(t.dtype, x.shape), attrs.dims) or None
        n = float(np.prod([x.shape[k] for k in rd])) if rd else float(x.size)
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the mean of an empty row is NaN
            mu = np.mean(x, axis=rd, keepdims=True)
            v = np.sum((x - mu) ** 2, axis=rd, keepdims=True) / max(n - attrs.correction, 0.0)
        if name == "std":
            v = np.sqrt(v)
        outs = [v] + ([mu] if name == "var_mean" else [])
        return [o.reshape(t.shape).astype(t.dtype.np) for o in outs]

    what = {"var": "the variance", "std": "the standard deviation", "var_mean": "(variance, mean)"}[name]
    register(OpDef(name, OpKind.reduction, ("x",), infer, ref, attrs=VarAttrs, decompose=decompose,
                   n_outputs=2 if name == "var_mean" else 1,
                   doc=f"{name}(x, dims=None, correction=1, keepdim=False): {what} over dims (None or []: every "
                       "dim), sum((x - mean)^2) / max(N - correction, 0); floats only. Composite: mean, sub, mul, "
                       "sum, div" + (", sqrt" if name == "std" else "")))


for _name in ("var", "std", "var_mean"):
    _var_family(_name)
