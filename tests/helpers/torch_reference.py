"""An independent PyTorch translation of segfuse's ops (`TORCH`: op name -> torch function, written
from the PyTorch documentation, not from segfuse's NumPy references), and which ops round
inexactly, for the random graphs of helpers/random_graphs.py."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

# ---- dtypes -------------------------------------------------------------------------------
TORCH_DTYPE = {
    "bool": torch.bool, "uint8": torch.uint8, "int8": torch.int8, "int16": torch.int16,
    "int32": torch.int32, "int64": torch.int64, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64,
}
DTYPE_NAME = {v: k for k, v in TORCH_DTYPE.items()}
FLOATS = ("float16", "bfloat16", "float32", "float64")
INTS = ("uint8", "int8", "int16", "int32", "int64")
INPUT_DTYPES = ["bool", "uint8", "int8", "int32", "int64", "float16", "bfloat16", "float32", "float64"]


def is_float(t: torch.Tensor) -> bool:
    return t.dtype.is_floating_point


# ---- the PyTorch translation ----------------------------------------------------------------
def _lit_args(args, to_float=False):
    """Binary ops with one number literal where PyTorch has no number overload: PyTorch's
    wrapped-number promotion (torch.result_type knows the weak-typing rules), then the op on two
    tensors of the promoted dtype. The literal converts like a wrapped number: integers wrap.
    `to_float`: ops that compute integers in the default float dtype (div, atan2)."""
    a, b = args
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a, b
    t, lit = (a, b) if isinstance(a, torch.Tensor) else (b, a)
    rt = torch.result_type(t, lit)
    if to_float and not rt.is_floating_point:
        rt = torch.get_default_dtype()
    full = torch.tensor(lit).to(rt)
    return (t.to(rt), full) if t is a else (full, t.to(rt))


def binary(fn, scalar_right=False, scalar_left=None):
    """`fn(tensor, tensor)`; with `scalar_right` PyTorch's own (tensor, number) overload is used;
    `scalar_left(tensor, number)` computes (number, tensor) with PyTorch's own overloads."""

    def f(args, attrs):
        a, b = args
        if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
            return fn(a, b)
        if isinstance(a, torch.Tensor) and scalar_right:
            return fn(a, b)
        if isinstance(b, torch.Tensor) and scalar_left is not None:
            return scalar_left(b, a)
        return fn(*_lit_args(args, to_float=fn in (torch.div, torch.atan2)))

    return f


def commutative(fn):
    return binary(fn, True, lambda t, s: fn(t, s))


def _ceil_div(a, b):
    # ceil(a / b); for integers floor(a / b) + 1 unless b divides a (correct for every sign)
    if a.dtype.is_floating_point:
        return torch.ceil(torch.div(a, b))
    q = torch.div(a, b, rounding_mode="floor")
    return q + (torch.remainder(a, b) != 0).to(q.dtype)


def unary(fn):
    return lambda args, attrs: fn(args[0])


def _where(args, attrs):
    c, x, y = args
    return torch.where(c, x, y)


def _clamp(args, attrs):
    x, lo, hi = args
    if isinstance(lo, torch.Tensor):
        return torch.clamp(x, lo, hi)
    return torch.clamp(x, min=lo, max=hi)


def _cast(args, attrs):
    return args[0].to(TORCH_DTYPE[attrs["dtype"]])


def _reduce(fn, has_dtype=True):
    def f(args, attrs):
        x = args[0]
        dims = attrs.get("dims")
        kw = {"keepdim": attrs.get("keepdim", False)}
        if has_dtype and attrs.get("dtype"):
            kw["dtype"] = TORCH_DTYPE[attrs["dtype"]]
        if dims is None:
            return fn(x, dim=None if fn is not torch.amax and fn is not torch.amin else (), **kw)
        return fn(x, dim=dims, **kw)

    return f


def _argreduce(fn):
    def f(args, attrs):
        return fn(args[0], dim=attrs.get("dim"), keepdim=attrs.get("keepdim", False))

    return f


def _scan(fn):
    return lambda args, attrs: fn(args[0], dim=attrs["dim"])


def _argsort(args, attrs):
    return torch.argsort(args[0], dim=attrs.get("dim", -1), descending=attrs.get("descending", False), stable=True)


def _sort(args, attrs):
    r = torch.sort(args[0], dim=attrs.get("dim", -1), descending=attrs.get("descending", False), stable=True)
    return r.values, r.indices


def _topk(args, attrs):
    x = args[0]
    if x.dtype == torch.bool:  # PyTorch's CPU topk lacks bool (its CUDA one has it): order as 0/1
        v, i = _topk([x.to(torch.uint8)], attrs)
        return v.to(torch.bool), i
    dim, k, largest = attrs.get("dim", -1), attrs["k"], attrs.get("largest", True)
    if x.dim() == 0:
        torch.topk(x, k, dim=dim)  # PyTorch's own checks of k and dim
        return x.clone(), torch.zeros((), dtype=torch.int64)
    vals, idx = torch.topk(x, k, dim=dim, largest=largest, sorted=True)
    # segfuse documents that ties keep input order: the stable sort's first k
    s = torch.sort(x, dim=dim, descending=largest, stable=True)
    svals, sidx = s.values.narrow(dim if x.dim() else 0, 0, k), s.indices.narrow(dim if x.dim() else 0, 0, k)
    assert torch.equal(vals, svals) or (is_float(x) and torch.allclose(vals, svals, equal_nan=True))
    return svals, sidx


def _slice(x, a):
    d = a.get("dim", 0) % x.dim()
    idx = [slice(None)] * x.dim()
    idx[d] = slice(a.get("start"), a.get("end"), a.get("step", 1))
    return x[tuple(idx)].clone()


def _gather(args, attrs):
    return torch.gather(args[0], attrs["dim"], args[1].long())


def _take_along_axis(args, attrs):
    return torch.take_along_dim(args[0], args[1].long(), dim=attrs["dim"])


def _index_select(args, attrs):
    return torch.index_select(args[0], attrs["dim"], args[1].long())


_REDUCE_NAME = {"add": "sum", "mul": "prod", "amax": "amax", "amin": "amin"}


def _scatter(args, attrs):
    x, idx, src = args
    idx = idx.long()
    reduce = attrs.get("reduce", "none")
    if reduce == "none":
        if isinstance(src, torch.Tensor):
            return torch.scatter(x, attrs["dim"], idx, src)
        return torch.scatter(x, attrs["dim"], idx, src)  # value= overload
    if not isinstance(src, torch.Tensor):
        src = torch.full(idx.shape, src, dtype=x.dtype)
    return torch.scatter_reduce(x, attrs["dim"], idx, src, _REDUCE_NAME[reduce],
                                include_self=attrs.get("include_self", True))


def _in_float32(fn):
    """Accumulating float16/bfloat16 ops computed in float32 and rounded once, as segfuse documents
    (opmath); PyTorch's CPU index_add/scatter_add round after every addition of a duplicate."""

    def f(args, attrs):
        x = args[0]
        if x.dtype not in (torch.float16, torch.bfloat16) or (fn is not _index_add and (
                attrs.get("reduce", "none") in ("none", "amax", "amin") and not attrs.get("accumulate"))):
            return fn(args, attrs)
        up = [a.float() if isinstance(a, torch.Tensor) and a.dtype == x.dtype else a for a in args]
        return fn(up, attrs).to(x.dtype)

    return f


def _in_opmath(fn, scalar_divisor=False):
    """float16/bfloat16 floor_divide and ceil_div computed in float32 and rounded once (segfuse's rule,
    docs/graph-format.md "Reduced-precision arithmetic"), which is what torch's CUDA kernel computes:
    aten/src/ATen/native/cuda/BinaryDivFloorKernel.cu runs c10::div_floor_floating with scalar_t =
    BFloat16/Half, but device code has only CUDA's float fmod, so fmod, a - mod and the division are
    float operations (for bfloat16 operands the same as rounding once; float16 can differ by one ulp
    where |a / b| > 2048). torch's CPU kernel (cpu/BinaryOpsKernel.cpp, div_floor_kernel) rounds every
    step of the formula to the 16-bit type for two tensor operands (pytorch/pytorch#193754: -3 //
    bfloat16(-0.0236) = 126 there, 127 in float), and ceil_div has no torch op: ceil(div) would round
    the quotient before the ceiling. `scalar_divisor`: a number or 0-d second operand is read at
    float32 precision (torch's CPU and CUDA scalar paths, segfuse's scalar_opmath)."""

    def f(args, attrs):
        rt = torch.result_type(*args)
        if rt not in (torch.float16, torch.bfloat16):
            return fn(args, attrs)
        up = []
        for k, a in enumerate(args):
            if scalar_divisor and k == 1 and not (isinstance(a, torch.Tensor) and a.dim()):
                up.append(a.to(torch.float32) if isinstance(a, torch.Tensor) else a)
            else:
                up.append(torch.as_tensor(a).to(rt).to(torch.float32))
        return fn(up, attrs).to(rt)

    return f


def _index_add(args, attrs):
    return torch.index_add(args[0], attrs["dim"], args[1].long(), args[2], alpha=attrs.get("alpha", 1))


def _index_put(args, attrs):
    x, idx, v = args
    if not isinstance(v, torch.Tensor):
        v = torch.tensor(v, dtype=x.dtype)
    return x.index_put((idx.long(),), v, accumulate=attrs.get("accumulate", False))


TORCH = {
    # unary
    "neg": unary(torch.neg), "abs": unary(torch.abs), "exp": unary(torch.exp), "exp2": unary(torch.exp2),
    "expm1": unary(torch.expm1), "log": unary(torch.log), "log2": unary(torch.log2),
    "log10": unary(torch.log10), "log1p": unary(torch.log1p), "sqrt": unary(torch.sqrt),
    "rsqrt": unary(torch.rsqrt), "sin": unary(torch.sin), "cos": unary(torch.cos), "tan": unary(torch.tan),
    "tanh": unary(torch.tanh), "sigmoid": unary(torch.sigmoid), "relu": unary(torch.relu),
    "silu": unary(F.silu), "gelu": unary(F.gelu), "erf": unary(torch.erf), "floor": unary(torch.floor),
    "ceil": unary(torch.ceil), "round": unary(torch.round), "trunc": unary(torch.trunc),
    "sign": unary(torch.sign), "reciprocal": unary(torch.reciprocal), "logical_not": unary(torch.logical_not),
    "bitwise_not": unary(torch.bitwise_not), "isnan": unary(torch.isnan), "isinf": unary(torch.isinf),
    "isfinite": unary(torch.isfinite),
    # binary
    "add": commutative(torch.add), "sub": binary(torch.sub, True, torch.rsub),
    "mul": commutative(torch.mul), "div": binary(torch.div, True),
    "floor_divide": _in_opmath(binary(torch.floor_divide, True), scalar_divisor=True), "remainder": binary(torch.remainder, True,
                                                                         lambda t, s: torch.remainder(s, t)),
    "fmod": binary(torch.fmod, True), "pow": binary(torch.pow, True, lambda t, s: torch.pow(s, t)),
    "maximum": binary(torch.maximum), "minimum": binary(torch.minimum), "atan2": binary(torch.atan2),
    "eq": commutative(torch.eq), "ne": commutative(torch.ne), "lt": binary(torch.lt, True, torch.gt),
    "le": binary(torch.le, True, torch.ge), "gt": binary(torch.gt, True, torch.lt),
    "ge": binary(torch.ge, True, torch.le), "logical_and": binary(torch.logical_and),
    "logical_or": binary(torch.logical_or), "logical_xor": binary(torch.logical_xor),
    "bitwise_and": commutative(torch.bitwise_and), "bitwise_or": commutative(torch.bitwise_or),
    "bitwise_xor": commutative(torch.bitwise_xor),
    "left_shift": binary(torch.bitwise_left_shift, True, lambda t, s: torch.bitwise_left_shift(s, t)),
    "right_shift": binary(torch.bitwise_right_shift, True, lambda t, s: torch.bitwise_right_shift(s, t)),
    "ceil_div": _in_opmath(binary(_ceil_div)),
    # ternary and cast
    "where": _where, "clamp": _clamp, "cast": _cast,
    # reductions, scans, sorts
    "sum": _reduce(torch.sum), "prod": None, "amax": _reduce(torch.amax, False),
    "amin": _reduce(torch.amin, False), "mean": _reduce(torch.mean),
    "argmax": _argreduce(torch.argmax), "argmin": _argreduce(torch.argmin),
    "cumsum": _scan(torch.cumsum), "cumprod": _scan(torch.cumprod),
    "argsort": _argsort, "sort": _sort, "topk": _topk,
    # shape and creation
    "reshape": lambda args, a: torch.reshape(args[0], a["shape"]),
    "permute": lambda args, a: torch.permute(args[0], a["dims"]),
    "unsqueeze": lambda args, a: torch.unsqueeze(args[0], a["dim"]),
    "squeeze": lambda args, a: torch.squeeze(args[0], a["dims"]) if "dims" in a else torch.squeeze(args[0]),
    "expand": lambda args, a: args[0].expand(a["shape"]).clone(),
    "slice": lambda args, a: _slice(args[0], a),
    "pad": lambda args, a: F.pad(args[0], a["pad"], value=a.get("value", 0)),
    "cat": lambda args, a: torch.cat(args, dim=a["dim"]),
    "full_like": lambda args, a: torch.full_like(args[0], a["value"], **(
        {"dtype": TORCH_DTYPE[a["dtype"]]} if "dtype" in a else {})),
    "iota": lambda args, a: a.get("start", 0) + a.get("step", 1) * torch.arange(
        a["length"], dtype=TORCH_DTYPE[a.get("dtype", "int64")]),
    # indexing
    "gather": _gather, "take_along_axis": _take_along_axis, "index_select": _index_select,
    "scatter": _in_float32(_scatter), "index_add": _in_float32(_index_add), "index_put": _in_float32(_index_put),
}


def _prod(args, attrs):
    # torch.prod takes one dim at most: reduce the listed dims one by one (highest first)
    x = args[0]
    dims = attrs.get("dims")
    keep = attrs.get("keepdim", False)
    dt = TORCH_DTYPE[attrs["dtype"]] if attrs.get("dtype") else None
    if dims is None:
        r = torch.prod(x, dtype=dt)
        return r.reshape([1] * x.dim()) if keep else r
    dims = [dims] if isinstance(dims, int) else list(dims)
    dims = sorted((d % max(x.dim(), 1) for d in dims), reverse=True)
    if x.dim() == 0:
        return torch.prod(x, dtype=dt)
    r = x if dt is None else x.to(dt)
    if dt is None and not is_float(x):
        r = r.to(torch.int64)
    for d in dims:
        r = torch.prod(r, dim=d, keepdim=keep)
    return r


TORCH["prod"] = _prod

# Where segfuse refuses on purpose what PyTorch accepts: (op, words of segfuse's message).
DELIBERATE = [
    ("squeeze", "symbolic dim"),  # a result rank that would depend on the sizes bound at run time
    # torch.full refuses 70000 as float16, torch.full_like(half_tensor, 70000) makes inf: segfuse
    # checks both like torch.full
    ("full_like", "float16 without overflow"), ("full_like", "bfloat16 without overflow"),
]

def symbolic_broadcast(msg: str) -> bool:
    """segfuse's documented rule: two sizes that certainly differ do not broadcast, even when one
    is an expression of a symbol (like `D1 - 2`) that happens to be 1 for the sizes bound here."""
    import re

    return "cannot be broadcast" in msg and re.search(r"\(size [^)]*D\d", msg) is not None


# Ops whose float results may differ from PyTorch's in the last bits.
INEXACT = {"sqrt", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "rsqrt", "sin", "cos", "tan", "tanh",
           "sigmoid", "silu", "gelu", "erf", "pow", "atan2", "sum", "prod", "mean", "cumsum", "cumprod"}
# Ops where a last-bit difference in a float operand can change the answer a lot.
NEEDS_EXACT = {"floor", "ceil", "round", "trunc", "sign", "logical_not", "isnan", "isinf", "isfinite",
               "div", "reciprocal", "rsqrt", "log", "log2", "log10", "log1p", "pow", "atan2", "tan",
               "floor_divide", "remainder", "fmod", "eq", "ne", "lt", "le", "gt", "ge", "logical_and",
               "logical_or", "logical_xor", "ceil_div", "where", "cast", "argmax", "argmin", "argsort", "sort",
               "topk", "exp", "exp2", "expm1"}
UNARY = ["neg", "abs", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt", "sin", "cos",
         "tan", "tanh", "sigmoid", "relu", "silu", "gelu", "erf", "floor", "ceil", "round", "trunc", "sign",
         "reciprocal", "logical_not", "bitwise_not", "isnan", "isinf", "isfinite"]
BINARY = ["add", "sub", "mul", "div", "floor_divide", "remainder", "fmod", "pow", "maximum", "minimum", "atan2",
          "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor", "bitwise_and",
          "bitwise_or", "bitwise_xor", "left_shift", "right_shift", "ceil_div"]
# Binary ops that take a literal in either position (torch has a number overload or _lit_args applies).
LITERALS = [-3, -1, 0, 1, 2, 3, 0.5, -1.5, 2.0, 0.25, True, False,
            300, -129, 1000, 70000]  # these overflow small integer dtypes: PyTorch wraps or refuses


@dataclass
class T:
    """A tensor of the graph being generated, with its PyTorch value."""

    value: torch.Tensor
    exact: bool = True  # float values are bit-identical to what segfuse must produce
    loose: str | None = None  # the coarsest float dtype at which an inexact ancestor was rounded
