"""PyTorch's sizes and dtypes in segfuse's terms: size symbols and expressions, DTypes, and sizes as
0-d tensors where PyTorch computes with them as numbers (`size_operand`)."""

from __future__ import annotations

from types import MappingProxyType

import sympy
import torch
from segfuse.compiler.dtypes import DType, result_type

from ..convert import dtype_from_torch


class SizeNames:
    """PyTorch's size symbols (ShapeEnv's s0, s1, ...) -> the graph's size symbols, and size
    expressions written in the graph format (names, integers, + - * // and parentheses)."""

    def __init__(self, names: dict[str, str] | None = None):
        self._names = dict(names or {})
        self._derived: dict = {}  # a derived size (sympy) given a symbol of its own -> that symbol's name
        self._subs: dict = {}  # a part of derived sizes -> its value over their fresh symbol (see `fresh`)

    def name(self, symbol: str, default: str) -> str:
        """The graph's name of `symbol`, `default` (made unique) when it has none yet."""
        if symbol not in self._names:
            taken = set(self._names.values())
            n, k = default, 1
            while n in taken:
                n, k = f"{default}_{k}", k + 1
            self._names[symbol] = n
        return self._names[symbol]

    def known(self) -> MappingProxyType:
        return MappingProxyType(self._names)

    def fresh(self, expr, default: str) -> str:
        """The graph's name of a new size symbol standing for `expr`, a size derived from PyTorch's
        symbols (`2*s0`, the size of an op's result where the graph is a part of a bigger one): one
        symbol per expression. Where `expr` is c*g + b for a part g whose symbols are not all named
        (g = s0, or (s0*s1)//3), later sizes are written with g = (fresh - b) / c, so `4*s0` is
        `2*fresh`: exact, since it is the value of g."""
        expr = sympy.sympify(expr)
        if expr in self._derived:
            return self._derived[expr]
        key = f"_derived{len(self._derived)}"  # (no PyTorch symbol is named so)
        name = self.name(key, default)
        self._derived[expr] = name
        b, rest = expr.as_coeff_Add()
        c, part = rest.as_coeff_Mul()
        unnamed = any(s.name not in self._names and s not in self._subs for s in part.free_symbols)
        if c != 0 and part.free_symbols and unnamed and part not in self._subs:
            self._subs[part] = (sympy.Symbol(key, integer=True) - b) / c
        return name

    def size(self, d) -> int | str:
        """An int, a SymInt or a sympy expression as an int or a size expression; ValueError for a
        size segfuse cannot write (one that depends on the data, or a function it lacks)."""
        if isinstance(d, bool):
            raise ValueError(f"{d} is not a size")
        if isinstance(d, int):
            return d
        expr = self.expression(d)
        if expr.is_Integer:
            return int(expr)
        return self._text(expr)

    def expression(self, d):
        """A SymInt, SymFloat or sympy size as sympy, over PyTorch's symbols and those of `fresh`."""
        expr = d.node.expr if isinstance(d, (torch.SymInt, torch.SymFloat)) else sympy.sympify(d)
        for part, value in self._subs.items():
            expr = expr.subs(part, value)
        return expr

    def _text(self, e) -> str:
        if e.is_Integer:
            return str(int(e))
        if self._subs and not e.is_Symbol:  # a fraction of integers (after `fresh`): an exact //
            num, den = sympy.fraction(sympy.together(e))
            if den != 1:
                if not den.is_Integer:
                    raise ValueError(f"the size {e} divides by {den}, which a size expression cannot write")
                return f"{self._atom(sympy.expand(num))} // {int(den)}"
        if e.is_Symbol:
            if e.name not in self._names:
                raise ValueError(f"the size {e.name} is not a size of an input (it depends on the data)")
            return self._names[e.name]
        kind = type(e).__name__
        if isinstance(e, sympy.Add):
            return " + ".join(self._atom(a) for a in e.args)
        if isinstance(e, sympy.Mul):
            return "*".join(self._atom(a) for a in e.args)
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) >= 1:
            return "*".join([self._atom(e.base)] * int(e.exp))
        if kind in ("FloorDiv", "CleanDiv", "IntTrueDiv") and len(e.args) == 2 and kind != "IntTrueDiv":
            return f"{self._atom(e.args[0])} // {self._atom(e.args[1])}"
        raise ValueError(f"the size {e} uses {kind}, which a size expression cannot write "
                         "(expressions take + - * //)")

    def _atom(self, e) -> str:
        t = self._text(e)
        return t if (e.is_Symbol or (e.is_Integer and int(e) >= 0)) else f"({t})"


torch_to_dtype = dtype_from_torch  # (the name the lowerings use)


def supported_dtypes_text() -> str:
    return "a supported dtype (" + ", ".join(dt.value for dt in DType) + ")"


# ---- a size as a number in arithmetic -------------------------------------------------------
def size_operand(fd, d, sizes: SizeNames, dtype: DType | None = None):
    """A size (an int, a size expression, a SymInt or SymFloat, sympy) as an operand of arithmetic:
    a number stays a number; a symbolic size becomes a 0-d tensor computing it from the graph's size
    symbols (int64; float64 for a SymFloat, PyTorch's double), cast to `dtype` when given. A size the
    graph format writes is the last element of iota(size + 1), creation and movement ops that fuse
    into the op reading them; others (Mod, Max, true division) are computed from those.
    ValueError for a size segfuse cannot compute."""
    if isinstance(d, (bool, int, float)):
        return d
    t = _from_text(fd, d) if isinstance(d, str) else _evaluate(fd, sizes.expression(d), sizes)
    if isinstance(t, (int, float)):
        return t
    return fd.ops.cast(t, dtype) if dtype is not None and t.dtype is not dtype else t


def _from_text(fd, text: str):
    return fd.ops.select(fd.ops.iota(f"{text} + 1"), 0, -1)


def _evaluate(fd, e, sizes: SizeNames):
    if e.is_Integer:
        return int(e)
    if e.is_Number:
        return float(e)
    try:
        return _from_text(fd, sizes.size(e))
    except ValueError:
        if e.is_Symbol:  # (a size that depends on the data)
            raise
    ops = fd.ops
    num, den = sympy.fraction(sympy.together(e)) if isinstance(e, (sympy.Add, sympy.Mul)) else (e, 1)
    if den != 1 and den.is_Integer:  # (a part of a size written over a `fresh` symbol: exact)
        return ops.floor_divide(_evaluate(fd, sympy.expand(num), sizes), int(den))
    kind = type(e).__name__
    if isinstance(e, sympy.Pow) and e.exp.is_Integer and int(e.exp) >= 1:
        args = [_evaluate(fd, e.base, sizes)] * int(e.exp)
    else:
        args = [_evaluate(fd, a, sizes) for a in e.args]
    folds = {"Add": ops.add, "Mul": ops.mul, "Pow": ops.mul, "Max": ops.maximum, "Min": ops.minimum}
    if kind in folds:
        acc = args[0]
        for a in args[1:]:
            acc = folds[kind](acc, a)
        return acc
    if kind in ("FloorDiv", "CleanDiv"):
        return ops.floor_divide(*args)
    if kind in ("PythonMod", "Mod"):
        return ops.remainder(*args)
    if kind in ("IntTrueDiv", "FloatTrueDiv"):
        return ops.div(*[ops.cast(a, DType.float64) if not isinstance(a, (int, float)) else float(a) for a in args])
    if kind == "ToFloat":
        return ops.cast(args[0], DType.float64) if not isinstance(args[0], (int, float)) else float(args[0])
    raise ValueError(f"the size {e} uses {kind}, which segfuse cannot compute")


# schema types of arguments that take a number (a Python number, a Scalar, a tensor)
_NUMBER_TYPES = frozenset({"number", "Optional[number]", "Tensor", "Optional[Tensor]", "float", "Optional[float]"})


def sizes_as_numbers(node, operand) -> tuple[tuple, dict]:
    """An FX node's args and kwargs with each symbolic size (a SymInt or SymFloat node) its schema
    takes as a number made an operand by `operand(size, dtype)` (LowerContext.size_operand), in the
    dtype PyTorch converts that number to: an integer tensor's narrower dtype (int32, uint8), or
    float32 for a SymFloat where no float tensor sets the dtype; else int64 or float64."""
    target = node.target
    args, kwargs = list(node.args), dict(node.kwargs)
    if not isinstance(target, torch._ops.OpOverload):
        return tuple(args), kwargs
    tensors = []
    for a in node.all_input_nodes:
        v = a.meta.get("val")
        if isinstance(v, torch.Tensor) and torch_to_dtype(v.dtype) is not None:
            tensors.append((torch_to_dtype(v.dtype), v.dim()))
    for i, a in enumerate(target._schema.arguments):
        positional = i < len(args) and not a.kwarg_only
        v = args[i] if positional else kwargs.get(a.name)
        val = v.meta.get("val") if isinstance(v, torch.fx.Node) and str(a.type) in _NUMBER_TYPES else None
        if not isinstance(val, (torch.SymInt, torch.SymFloat)) or val.node.expr.is_number:
            continue
        is_int = isinstance(val, torch.SymInt)
        number = result_type(tensors, [1 if is_int else 1.0])
        if is_int:
            cast = number if not number.is_float and not number.is_bool and number is not DType.int64 else None
        else:
            cast = number if number.is_float and not any(dt.is_float for dt, _ in tensors) else None
        t = operand(val, cast)
        if positional:
            args[i] = t
        else:
            kwargs[a.name] = t
    return tuple(args), kwargs
