"""Symbolic sizes. A dim is a Python int or a sympy expression over the graph's size symbols.

Rules compare dims with `dims_equal`, which answers True, False or None (unknown until the
sizes are bound); unknown comparisons are checked again with concrete sizes at bind time,
because inference runs again there with ints.
"""

from __future__ import annotations

import ast
import math
from functools import cache

import sympy

Dim = "int | sympy.Expr"


@cache
def symbol(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, integer=True, nonnegative=True)


def norm(d):
    """Ints stay ints; a sympy expression that became a number becomes an int."""
    if isinstance(d, int):
        return d
    d = sympy.simplify(d) if not isinstance(d, sympy.Symbol) else d
    if d.is_Integer:
        return int(d)
    return d


def is_static(d) -> bool:
    return isinstance(d, int)


def dims_equal(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    diff = sympy.simplify(sympy.sympify(a) - sympy.sympify(b))
    if diff == 0:
        return True
    if diff.is_number:
        return False
    return None


def numel(shape) -> object:
    n = 1
    for d in shape:
        n = n * d
    return norm(n) if not isinstance(n, int) else n


def fmt_dim(d) -> str:
    return str(d)


def fmt_shape(shape) -> str:
    return "[" + ", ".join(fmt_dim(d) for d in shape) + "]"


def evaluate(d, env: dict[str, int]) -> int:
    if isinstance(d, int):
        return d
    return int(d.subs({symbol(k): v for k, v in env.items()}))


_ALLOWED_BINOPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
                   ast.FloorDiv: lambda a, b: sympy.floor(a / b) if not (isinstance(a, int) and isinstance(b, int)) else a // b}


MAX_SIZE_EXPR_CHARS = 256  # longer size expressions are refused (deep parse trees, slow algebra)


def parse_size(text: str, known: set[str] | None = None):
    """Parse a size expression such as 'T', 'T*K' or 'N+1' safely (no eval).

    `known` restricts names to the graph's input symbols; ValueError explains what is wrong.
    """
    if len(text) > MAX_SIZE_EXPR_CHARS:
        raise ValueError(f"size expression '{text[:40]}...' has {len(text)} characters, over the limit of "
                         f"{MAX_SIZE_EXPR_CHARS}")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ValueError(f"'{text}' is not a size expression (use names, integers, + - * //)") from None

    def walk(node):
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.Name):
            if known is not None and node.id not in known:
                raise ValueError(f"unknown size symbol '{node.id}' (the graph's inputs define: "
                                 f"{', '.join(sorted(known)) or 'none'})")
            return symbol(node.id)
        if isinstance(node, ast.BinOp) and type(node.op) in _ALLOWED_BINOPS:
            return _ALLOWED_BINOPS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        raise ValueError(f"'{text}' is not a size expression (use names, integers, + - * //)")

    return norm(walk(tree))


SYMBOL_RE = r"^[A-Za-z_][A-Za-z0-9_]{0,63}$"


def is_identifier(s: str) -> bool:
    return s.isidentifier() and len(s) <= 64


def prod(xs) -> int:
    return math.prod(xs)
