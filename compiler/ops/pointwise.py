"""Pointwise ops: unary, binary, ternary and cast, with PyTorch's promotion rules.

Every pointwise op is defined by one `_pw(...)` call: its NumPy function and its CUDA
expression. Operands are promoted to the op's compute dtype (reduced-precision floats are
computed in float32, PyTorch's "opmath" type) and the result is rounded to the output dtype.
CUDA expressions call overloaded helpers (`sf_*`) from the codegen prelude where C lacks the
PyTorch semantics (floor division, Python remainder, NaN-propagating max, ...).
"""

from __future__ import annotations

import math

import numpy as np

from ..dtypes import DEFAULT_FLOAT, DType, result_type
from ..errors import OpError
from .registry import (
    Attrs,
    Guard,
    Lowering,
    NoAttrs,
    OpDef,
    OpKind,
    Scalar,
    TensorType,
    broadcast_shapes,
    register,
)

_erf = np.frompyfunc(math.erf, 1, 1)

_ANY, _NOBOOL, _INT_BOOL, _INT, _FLOAT = "any", "nobool", "int_bool", "int", "float"
_ALLOWED_TEXT = {_NOBOOL: "not supported for bool", _INT_BOOL: "needs integer or bool operands",
                 _INT: "needs integer operands", _FLOAT: "needs floating-point operands"}


def _check_allowed(name: str, allowed: str, dt: DType) -> None:
    ok = {_ANY: True, _NOBOOL: not dt.is_bool, _INT_BOOL: not dt.is_float, _INT: dt.is_int,
          _FLOAT: dt.is_float}[allowed]
    if not ok:
        raise OpError(f"{name} {_ALLOWED_TEXT[allowed]} (operands promote to {dt})", ("inputs",))


def _operand_dtype(operands) -> DType:
    tensors = [(o.dtype, o.rank) for o in operands if isinstance(o, TensorType)]
    literals = [o.value for o in operands if isinstance(o, Scalar)]
    return result_type(tensors, literals)


def opmath(dt: DType) -> DType:
    """The dtype arithmetic runs in: float32 for float16/bfloat16, else the dtype itself."""
    return DType.float32 if dt in (DType.float16, DType.bfloat16) else dt


def _make_pw(name, nin, np_fn, cuda, allowed=_ANY, int_to_float=False, out_bool=False,
             literal_ok=None, doc="", guard=None, scalar_opmath=False, py_operator=(), nvfuser=()):
    def compute_dtype(operands, attrs) -> DType:
        dt = _operand_dtype(operands)
        if int_to_float and not dt.is_float:
            dt = DEFAULT_FLOAT
        return dt

    def infer(ctx, operands, attrs):
        if not any(isinstance(o, TensorType) for o in operands):
            raise OpError(f"{name} needs at least one tensor operand", ("inputs",))
        dt = compute_dtype(operands, attrs)
        if not (name == "pow" and dt.is_bool and isinstance(operands[1], Scalar)):
            # (PyTorch takes bool ** True/False: exponent 1 copies, exponent 0 fills ones)
            _check_allowed(name, allowed, dt)
        if name == "sub":  # PyTorch refuses subtraction with any bool operand, whatever it promotes to
            for k, o in enumerate(operands):
                if (isinstance(o, TensorType) and o.dtype.is_bool) or (isinstance(o, Scalar) and isinstance(o.value, bool)):
                    raise OpError("sub with a bool operand is not supported (use logical_not or bitwise_xor)",
                                  ("inputs", k))
        if name == "pow" and isinstance(operands[1], Scalar) and not dt.is_bool:
            # PyTorch converts a number exponent to the result dtype with an overflow check
            _check_scalar(operands[1].value, dt, ("inputs", 1))
            if not dt.is_signed and operands[1].value < 0:  # (it would wrap to a large exponent)
                raise OpError("integers to negative integer powers are not allowed", ("inputs", 1))
        shapes = [o.shape for o in operands if isinstance(o, TensorType)]
        idx = [i for i, o in enumerate(operands) if isinstance(o, TensorType)]
        shape = broadcast_shapes(shapes, lambda k: ("inputs", idx[k]))
        return [TensorType(DType.bool if out_bool else dt, shape)]

    def ref(args, attrs, out_types):
        types = [a for a in args]
        dt = compute_dtype([_as_operand(a) for a in types], attrs)
        work = opmath(dt).np
        # Operands are converted to the common dtype first (so a float64 0-d tensor or a literal is
        # rounded to a float16 result dtype, as in PyTorch), then computed in opmath. PyTorch's CPU
        # mul/div/floor_divide read a scalar second operand at opmath precision instead.
        xs = [np.asarray(a) if (k == 1 and scalar_opmath and np.ndim(a) == 0)
              else np.asarray(a).astype(dt.np) for k, a in enumerate(args)]
        xs = [x.astype(work) for x in xs]
        with np.errstate(all="ignore"):
            r = np_fn(*xs)
            return [np.asarray(r).astype(out_types[0].dtype.np)]

    return register(OpDef(
        name=name, kind=OpKind.pointwise, operands=("x", "y", "z")[:nin] if nin > 1 else ("x",),
        infer=infer, ref=ref, attrs=NoAttrs,
        literal_ok=frozenset(range(nin)) if literal_ok is None else frozenset(literal_ok),
        compute_dtype=compute_dtype, cuda=cuda, doc=doc, lowering=Lowering.pointwise, guard=guard,
        scalar_opmath=scalar_opmath, py_operator=py_operator, extra={"nvfuser": nvfuser} if nvfuser else {}))


def _as_operand(a):
    from ..dtypes import from_numpy

    if isinstance(a, np.ndarray):
        return TensorType(from_numpy(a.dtype), a.shape)
    return Scalar(a)


def _int_div_guard(fn):
    """Integer division by zero raises, as in PyTorch on the CPU (it would be UB on the GPU)."""

    def wrapped(a, b):
        # only divisors that meet a dividend count (an empty broadcast divides nothing, as in PyTorch)
        if a.dtype.kind in "iub" and np.any(np.broadcast_to(b, np.broadcast_shapes(a.shape, b.shape)) == 0):
            raise OpError("integer division by zero", ("inputs", 1))
        return fn(a, b)

    return wrapped


def _sign(x):
    if x.dtype.kind == "b":
        return x
    if x.dtype.kind == "f":
        # PyTorch: (0 < x) - (x < 0), so sign(NaN) = 0 and sign(-0.0) = +0.0
        return (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)
    return np.sign(x.astype(np.int64)).astype(x.dtype)


def _round(x):
    return np.rint(x) if x.dtype.kind == "f" else x


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _gelu(x):
    return (0.5 * x * (1.0 + np.asarray(_erf(x.astype(np.float64) / math.sqrt(2.0))).astype(np.float64))).astype(x.dtype)


def _erf_np(x):
    return np.asarray(_erf(x.astype(np.float64))).astype(np.float64).astype(x.dtype)


def _shift_left(a, b):
    bits = a.dtype.itemsize * 8
    out = np.left_shift(a, np.clip(b, 0, bits - 1).astype(a.dtype))
    return np.where((b >= bits) | (b < 0), np.zeros_like(out), out)


def _shift_right(a, b):
    bits = a.dtype.itemsize * 8
    out = np.right_shift(a, np.clip(b, 0, bits - 1).astype(a.dtype))
    # shifting by >= width leaves only the sign (PyTorch defines it; C does not)
    fill = np.where(a < 0, -1, 0).astype(a.dtype) if a.dtype.kind == "i" else np.zeros_like(out)
    return np.where((b >= bits) | (b < 0), fill, out)


def _ceil_div(a, b):
    if a.dtype.kind in "iu":  # floor + 1 unless exact; no negation, so unsigned types work
        return np.floor_divide(a, b) + (np.remainder(a, b) != 0).astype(a.dtype)
    return np.ceil(a / b)


def _pow(a, b):
    if a.dtype.kind == "b":  # only bool ** bool-literal gets here
        return np.where(b, a, True)
    if a.dtype.kind in "iu" and np.any(b < 0):
        raise OpError("integers to negative integer powers are not allowed", ("inputs", 1))
    return np.power(a, b)


def _remainder(a, b):
    return np.remainder(a, b)


def _fmod(a, b):
    return np.fmod(a, b)


_NONZERO = (1, Guard.nonzero)  # an integer divisor must not be zero

# ---- unary ------------------------------------------------------------------------------
_UNARY = [
    # name, numpy, cuda, allowed, int_to_float, out_bool[, traits (keyword arguments of _make_pw)]
    ("neg", np.negative, lambda x: f"(-{x})", _NOBOOL, False, False, {"py_operator": ("__neg__",)}),
    ("abs", np.abs, lambda x: f"sf_abs({x})", _NOBOOL, False, False, {"py_operator": ("__abs__",)}),
    ("exp", np.exp, lambda x: f"exp({x})", _ANY, True, False),
    ("exp2", np.exp2, lambda x: f"exp2({x})", _ANY, True, False),
    ("expm1", np.expm1, lambda x: f"expm1({x})", _ANY, True, False),
    ("log", np.log, lambda x: f"log({x})", _ANY, True, False),
    ("log2", np.log2, lambda x: f"log2({x})", _ANY, True, False),
    ("log10", np.log10, lambda x: f"log10({x})", _ANY, True, False),
    ("log1p", np.log1p, lambda x: f"log1p({x})", _ANY, True, False),
    ("sqrt", np.sqrt, lambda x: f"sqrt({x})", _ANY, True, False),
    ("rsqrt", lambda x: 1.0 / np.sqrt(x), lambda x: f"rsqrt({x})", _ANY, True, False),
    ("sin", np.sin, lambda x: f"sin({x})", _ANY, True, False),
    ("cos", np.cos, lambda x: f"cos({x})", _ANY, True, False),
    ("tan", np.tan, lambda x: f"tan({x})", _ANY, True, False),
    ("tanh", np.tanh, lambda x: f"tanh({x})", _ANY, True, False),
    ("sigmoid", _sigmoid, lambda x: f"sf_sigmoid({x})", _ANY, True, False),
    ("relu", lambda x: np.where(x > 0, x, np.zeros_like(x)) if x.dtype.kind != "f" else np.where(np.isnan(x) | (x > 0), x, 0).astype(x.dtype),
     lambda x: f"sf_relu({x})", _NOBOOL, False, False),
    ("silu", lambda x: x * _sigmoid(x), lambda x: f"sf_silu({x})", _FLOAT, False, False),
    ("gelu", _gelu, lambda x: f"sf_gelu({x})", _FLOAT, False, False),
    ("erf", _erf_np, lambda x: f"erf({x})", _ANY, True, False),
    ("floor", lambda x: np.floor(x) if x.dtype.kind == "f" else x, lambda x: f"sf_floor({x})", _NOBOOL, False, False),
    ("ceil", lambda x: np.ceil(x) if x.dtype.kind == "f" else x, lambda x: f"sf_ceil({x})", _NOBOOL, False, False),
    ("round", _round, lambda x: f"sf_round({x})", _NOBOOL, False, False),
    ("trunc", lambda x: np.trunc(x) if x.dtype.kind == "f" else x, lambda x: f"sf_trunc({x})", _NOBOOL, False, False),
    ("sign", _sign, lambda x: f"sf_sign({x})", _ANY, False, False),
    ("reciprocal", lambda x: 1.0 / x, lambda x: f"(1 / {x})", _ANY, True, False),
    ("logical_not", np.logical_not, lambda x: f"(!{x})", _ANY, False, True),
    ("bitwise_not", np.invert, lambda x: f"sf_bitnot({x})", _INT_BOOL, False, False,
     {"py_operator": ("__invert__",)}),
    ("isnan", np.isnan, lambda x: f"sf_isnan({x})", _ANY, False, True),
    ("isinf", np.isinf, lambda x: f"sf_isinf({x})", _ANY, False, True),
    ("isfinite", np.isfinite, lambda x: f"sf_isfinite({x})", _ANY, False, True),
]

_BINARY = [
    ("add", np.add, lambda a, b: f"sf_add({a}, {b})", _ANY, False, False, {"py_operator": ("__add__", "__radd__")}),
    ("sub", np.subtract, lambda a, b: f"({a} - {b})", _NOBOOL, False, False,
     {"py_operator": ("__sub__", "__rsub__")}),
    ("mul", np.multiply, lambda a, b: f"sf_mul({a}, {b})", _ANY, False, False,
     {"scalar_opmath": True, "py_operator": ("__mul__", "__rmul__")}),
    ("div", np.true_divide, lambda a, b: f"({a} / {b})", _ANY, True, False,
     {"scalar_opmath": True, "py_operator": ("__truediv__", "__rtruediv__"), "nvfuser": ({"name": "truediv"},)}),
    ("floor_divide", _int_div_guard(np.floor_divide), lambda a, b: f"sf_floordiv({a}, {b})", _NOBOOL, False, False,
     {"guard": _NONZERO, "scalar_opmath": True, "py_operator": ("__floordiv__", "__rfloordiv__")}),
    ("remainder", _int_div_guard(_remainder), lambda a, b: f"sf_remainder({a}, {b})", _NOBOOL, False, False,
     {"guard": _NONZERO, "py_operator": ("__mod__", "__rmod__")}),
    ("fmod", _int_div_guard(_fmod), lambda a, b: f"sf_fmod({a}, {b})", _NOBOOL, False, False, {"guard": _NONZERO}),
    ("pow", _pow, lambda a, b: f"sf_pow({a}, {b})", _NOBOOL, False, False,
     {"guard": (1, Guard.nonnegative), "py_operator": ("__pow__", "__rpow__")}),
    ("maximum", np.maximum, lambda a, b: f"sf_max({a}, {b})", _ANY, False, False),
    ("minimum", np.minimum, lambda a, b: f"sf_min({a}, {b})", _ANY, False, False),
    ("atan2", np.arctan2, lambda a, b: f"atan2({a}, {b})", _ANY, True, False),
    ("eq", np.equal, lambda a, b: f"({a} == {b})", _ANY, False, True, {"py_operator": ("__eq__",)}),
    ("ne", np.not_equal, lambda a, b: f"({a} != {b})", _ANY, False, True, {"py_operator": ("__ne__",)}),
    ("lt", np.less, lambda a, b: f"({a} < {b})", _ANY, False, True, {"py_operator": ("__lt__",)}),
    ("le", np.less_equal, lambda a, b: f"({a} <= {b})", _ANY, False, True, {"py_operator": ("__le__",)}),
    ("gt", np.greater, lambda a, b: f"({a} > {b})", _ANY, False, True, {"py_operator": ("__gt__",)}),
    ("ge", np.greater_equal, lambda a, b: f"({a} >= {b})", _ANY, False, True, {"py_operator": ("__ge__",)}),
    ("logical_and", np.logical_and, lambda a, b: f"(bool({a}) && bool({b}))", _ANY, False, True),
    ("logical_or", np.logical_or, lambda a, b: f"(bool({a}) || bool({b}))", _ANY, False, True),
    ("logical_xor", np.logical_xor, lambda a, b: f"(bool({a}) != bool({b}))", _ANY, False, True),
    ("bitwise_and", np.bitwise_and, lambda a, b: f"({a} & {b})", _INT_BOOL, False, False,
     {"py_operator": ("__and__", "__rand__")}),
    ("bitwise_or", np.bitwise_or, lambda a, b: f"({a} | {b})", _INT_BOOL, False, False,
     {"py_operator": ("__or__", "__ror__")}),
    ("bitwise_xor", np.bitwise_xor, lambda a, b: f"({a} ^ {b})", _INT_BOOL, False, False,
     {"py_operator": ("__xor__", "__rxor__")}),
    ("left_shift", _shift_left, lambda a, b: f"sf_shl({a}, {b})", _INT, False, False,
     {"py_operator": ("__lshift__", "__rlshift__"), "nvfuser": ({"name": "bitwise_left_shift"},)}),
    ("right_shift", _shift_right, lambda a, b: f"sf_shr({a}, {b})", _INT, False, False,
     {"py_operator": ("__rshift__", "__rrshift__"), "nvfuser": ({"name": "bitwise_right_shift"},)}),
    ("ceil_div", _int_div_guard(_ceil_div), lambda a, b: f"sf_ceildiv({a}, {b})", _NOBOOL, False, False,
     {"guard": _NONZERO}),
]

for _row in _UNARY:
    _make_pw(_row[0], 1, *_row[1:6], literal_ok=(), **(_row[6] if len(_row) > 6 else {}))
for _row in _BINARY:
    _make_pw(_row[0], 2, *_row[1:6], **(_row[6] if len(_row) > 6 else {}))


# ---- ternary ----------------------------------------------------------------------------
def _where_dtype(operands, attrs):
    return _operand_dtype(operands[1:])


def _check_scalar(value, dt, where):
    from .registry import check_scalar

    check_scalar(value, dt, where)


def _where_infer(ctx, operands, attrs):
    cond = operands[0]
    if not isinstance(cond, TensorType):
        raise OpError("where's condition must be a tensor", ("inputs", 0))
    if cond.dtype is not DType.bool:
        raise OpError(f"where's condition must be bool, not {cond.dtype}", ("inputs", 0))
    dt = _where_dtype(operands, attrs)
    for i in (1, 2):  # like PyTorch: a number that overflows an integer result is an error
        if isinstance(operands[i], Scalar) and not dt.is_float:
            _check_scalar(operands[i].value, dt, ("inputs", i))
    idx = [i for i, o in enumerate(operands) if isinstance(o, TensorType)]
    shape = broadcast_shapes([operands[i].shape for i in idx], lambda k: ("inputs", idx[k]))
    return [TensorType(dt, shape)]


def _where_ref(args, attrs, out_types):
    dt = out_types[0].dtype.np
    return [np.where(np.asarray(args[0], dtype=bool), np.asarray(args[1]).astype(dt), np.asarray(args[2]).astype(dt))
            .astype(dt)]


register(OpDef("where", OpKind.pointwise, ("condition", "x", "y"), _where_infer, _where_ref,
               literal_ok=frozenset({1, 2}), compute_dtype=_where_dtype,
               cuda=lambda c, a, b: f"({c} ? {a} : {b})", lowering=Lowering.pointwise,
               raw_operands=frozenset({0}), round_operands=False,  # (the condition stays bool)
               doc="where(condition, x, y): x where condition is true, else y"))


def _clamp_dtype(operands, attrs):
    return _operand_dtype(operands)


def _clamp_infer(ctx, operands, attrs):
    if not isinstance(operands[0], TensorType):
        raise OpError("clamp's first operand must be a tensor", ("inputs", 0))
    dt = _clamp_dtype(operands, attrs)
    _check_allowed("clamp", _NOBOOL, dt)
    for i in (1, 2):  # like PyTorch: a bound that overflows the result dtype is an error
        if isinstance(operands[i], Scalar):
            _check_scalar(operands[i].value, dt, ("inputs", i))
    idx = [i for i, o in enumerate(operands) if isinstance(o, TensorType)]
    shape = broadcast_shapes([operands[i].shape for i in idx], lambda k: ("inputs", idx[k]))
    return [TensorType(dt, shape)]


def _clamp_ref(args, attrs, out_types):
    dt = out_types[0].dtype
    work = opmath(dt).np
    x, lo, hi = (np.asarray(a).astype(work) for a in args)
    with np.errstate(all="ignore"):
        r = np.minimum(np.maximum(x, lo), hi)
    return [r.astype(dt.np)]


register(OpDef("clamp", OpKind.pointwise, ("x", "min", "max"), _clamp_infer, _clamp_ref,
               literal_ok=frozenset({1, 2}), compute_dtype=_clamp_dtype,
               cuda=lambda x, lo, hi: f"sf_min(sf_max({x}, {lo}), {hi})", lowering=Lowering.pointwise,
               round_operands=False,
               doc="clamp(x, min, max) = minimum(maximum(x, min), max); NaN propagates"))


def _lerp_infer(ctx, operands, attrs):
    s, e = operands[0], operands[1]
    for i, o in enumerate((s, e)):
        if not isinstance(o, TensorType):
            raise OpError("lerp's start and end must be tensors", ("inputs", i))
    if s.dtype is not e.dtype:
        raise OpError(f"lerp expects start and end of one dtype, got {s.dtype} and {e.dtype}", ("inputs", 1))
    if not s.dtype.is_float:
        raise OpError(f"lerp needs floating-point tensors, not {s.dtype}", ("inputs", 0))
    w = operands[2]
    if isinstance(w, TensorType) and w.dtype is not s.dtype:
        raise OpError(f"lerp expects weight of dtype {s.dtype}, got {w.dtype}", ("inputs", 2))
    idx = [i for i, o in enumerate(operands) if isinstance(o, TensorType)]
    shape = broadcast_shapes([operands[i].shape for i in idx], lambda k: ("inputs", idx[k]))
    return [TensorType(s.dtype, shape)]


def _lerp_ref(args, attrs, out_types):
    dt = out_types[0].dtype
    work = opmath(dt).np
    s, e, w = (np.asarray(a).astype(work) for a in args)
    with np.errstate(all="ignore"):
        d = e - s
        r = np.where(np.abs(w) < 0.5, s + w * d, e - d * (1 - w))
    return [r.astype(dt.np)]


register(OpDef("lerp", OpKind.pointwise, ("start", "end", "weight"), _lerp_infer, _lerp_ref,
               literal_ok=frozenset({2}), compute_dtype=lambda ops, a: ops[0].dtype,
               cuda=lambda s, e, w: f"sf_lerp({s}, {e}, {w})", lowering=Lowering.pointwise,
               round_operands=False,
               doc="lerp(start, end, weight) = start + weight * (end - start), PyTorch's two-sided formula"))


class CastAttrs(Attrs):
    dtype: DType


def _cast_infer(ctx, operands, attrs):
    x = operands[0]
    if not isinstance(x, TensorType):
        raise OpError("cast needs a tensor operand", ("inputs", 0))
    return [TensorType(attrs.dtype, x.shape)]


def _cast_ref(args, attrs, out_types):
    x = np.asarray(args[0])
    dst = attrs.dtype
    if dst.is_bool:
        return [x != 0]
    if x.dtype.kind == "f" and dst.is_int:
        with np.errstate(all="ignore"):
            return [np.trunc(x.astype(np.float64)).astype(dst.np)]
    with np.errstate(all="ignore"):  # int64 -> float16 overflows to inf, as in PyTorch
        if dst is DType.bfloat16 and x.dtype.kind in "iub":
            return [x.astype(np.float64).astype(dst.np)]
        return [x.astype(dst.np)]


register(OpDef("cast", OpKind.pointwise, ("x",), _cast_infer, _cast_ref, attrs=CastAttrs,
               compute_dtype=lambda ops, a: ops[0].dtype,
               cuda=lambda x: x, lowering=Lowering.pointwise, round_operands=False,  # the result conversion casts
               doc="cast(x, dtype): C conversion; floats to integers truncate toward zero"))
