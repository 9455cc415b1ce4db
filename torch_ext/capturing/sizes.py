"""PyTorch's sizes and dtypes in segfuse's terms: size symbols and expressions, DTypes."""

from __future__ import annotations

from types import MappingProxyType

import sympy
import torch
from segfuse.compiler.dtypes import DType


class SizeNames:
    """PyTorch's size symbols (ShapeEnv's s0, s1, ...) -> the graph's size symbols, and size
    expressions written in the graph format (names, integers, + - * // and parentheses)."""

    def __init__(self, names: dict[str, str] | None = None):
        self._names = dict(names or {})

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

    def size(self, d) -> int | str:
        """An int, a SymInt or a sympy expression as an int or a size expression; ValueError for a
        size segfuse cannot write (one that depends on the data, or a function it lacks)."""
        if isinstance(d, bool):
            raise ValueError(f"{d} is not a size")
        if isinstance(d, int):
            return d
        expr = d.node.expr if isinstance(d, torch.SymInt) else sympy.sympify(d)
        if expr.is_Integer:
            return int(expr)
        return self._text(expr)

    def _text(self, e) -> str:
        if e.is_Integer:
            return str(int(e))
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


_TORCH_DTYPES = {getattr(torch, dt.value): dt for dt in DType}


def torch_to_dtype(dt) -> DType | None:
    return _TORCH_DTYPES.get(dt)


def supported_dtypes_text() -> str:
    return "a supported dtype (" + ", ".join(dt.value for dt in DType) + ")"
