"""Symbolic sizes. A dim is a Python int or a sympy expression over the graph's size symbols.

Rules compare dims with `dims_equal`, which answers True, False or None (unknown until the
sizes are bound); unknown comparisons are checked again with concrete sizes at bind time,
because inference runs again there with ints.

sympy's `simplify` takes time exponential in how deeply floor/ceiling/Min/Max nest (a size made by
four slices of slices took minutes), so every symbolic size, given or derived, is bounded before it
is simplified (`MAX_SIZE_EXPR_NODES`, `MAX_SIZE_EXPR_NESTING`): past them a graph is refused with
`SizeTooComplex` at the op that made the size. Each simplification is charged to the caller's work
budget (compiler/limits.py `charge`: its nodes times 4 per level of nesting), which bounds a graph of
many such sizes.
"""

from __future__ import annotations

import ast
import math
from functools import cache, lru_cache

import sympy

from .errors import OpError
from .limits import charge, memoized

# A symbolic size may have at most this many nodes (symbols, numbers, operations)...
MAX_SIZE_EXPR_NODES = 64
# ...and nest floor, ceiling, Min, Max and Mod at most this deep (`(T+1)//2` nests 1, `T[1:][1:]` 4).
# Sizes within both bounds, random and built to be slow, simplified in under a second; a slice of
# a slice of a slice of T with steps (nesting 9) took 8 s, one level more minutes.
MAX_SIZE_EXPR_NESTING = 4
_NESTING = (sympy.floor, sympy.ceiling, sympy.Min, sympy.Max, sympy.Mod)


class SizeTooComplex(OpError, ValueError):
    """A symbolic size is past MAX_SIZE_EXPR_NODES or MAX_SIZE_EXPR_NESTING (an OpError where a
    shape rule derives it, a ValueError where a size attribute is parsed, as parse_size's others)."""


def complexity(d, most_nodes: int = MAX_SIZE_EXPR_NODES, most_nesting: int = MAX_SIZE_EXPR_NESTING):
    """(nodes, nesting) of a size as a tree, counted only until one passes its bound (a size
    that shares subexpressions can be exponentially larger as a tree than in memory)."""
    if not isinstance(d, sympy.Basic):
        return 1, 0
    nodes, nesting = 0, 0
    todo = [(d, 0)]
    while todo:
        x, depth = todo.pop()
        nodes += 1
        if isinstance(x, _NESTING):
            depth += 1
            nesting = max(nesting, depth)
        if nodes > most_nodes or nesting > most_nesting:
            break
        todo.extend((a, depth) for a in x.args)
    return nodes, nesting


def check_complexity(d) -> int:
    """What simplifying d costs in work units (limits.charge): its nodes times 4 per level of
    nesting, as simplify's time grows; SizeTooComplex when d is past either bound."""
    nodes, nesting = complexity(d)
    if nodes > MAX_SIZE_EXPR_NODES or nesting > MAX_SIZE_EXPR_NESTING:
        printable = complexity(d, 4 * MAX_SIZE_EXPR_NODES, 1 << 30)[0] <= 4 * MAX_SIZE_EXPR_NODES
        text = str(d) if printable else "(too long to print)"
        text = text if len(text) <= 100 else text[:97] + "..."
        why = (f"more than {MAX_SIZE_EXPR_NODES} terms" if nodes > MAX_SIZE_EXPR_NODES else
               f"floor, ceiling, min and max nested more than {MAX_SIZE_EXPR_NESTING} deep")
        raise SizeTooComplex(f"the size {text} is too complex ({why}): simplifying such sizes takes "
                             "unbounded time")
    return nodes << (2 * nesting)


@lru_cache(maxsize=4096)
def _simplified(d):
    """sympy.simplify of a size within the bounds (memoized: rules simplify the same sizes often)."""
    return sympy.simplify(d)


@cache
def symbol(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, integer=True, nonnegative=True)


def norm(d):
    """Ints stay ints; a sympy expression that became a number becomes an int. SizeTooComplex for
    a size past the bounds."""
    if isinstance(d, int):
        return d
    if not isinstance(d, sympy.Symbol):
        charge(check_complexity(d))
        d = _simplified(d)
    if d.is_Integer:
        return int(d)
    return d


def dims_equal(a, b):
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    diff = sympy.sympify(a) - sympy.sympify(b)
    if diff == 0:
        return True
    try:
        charge(check_complexity(diff))
    except SizeTooComplex:
        return None  # unknown: checked again with the bound sizes
    diff = _simplified(diff)
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

    `known` restricts names to the graph's input symbols; ValueError explains what is wrong
    (SizeTooComplex, an OpError, for a size past the complexity bounds). Memoized: a run binds
    the same attributes again with its sizes.
    """
    if not isinstance(text, str):
        raise ValueError(f"a size expression must be a string, not {type(text).__name__}")
    if len(text) > MAX_SIZE_EXPR_CHARS:
        raise ValueError(f"size expression '{text[:40]}...' has {len(text)} characters, over the limit of "
                         f"{MAX_SIZE_EXPR_CHARS}")
    return _parse_size(text, None if known is None else frozenset(known))


@memoized(4096)
def _parse_size(text: str, known: frozenset | None):
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ValueError(f"'{text}' is not a size expression (use names, integers, + - * //)") from None
    _check_tree(text, tree)

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


def _check_tree(text: str, tree) -> None:
    """The nesting bound on the text as written, before sympy builds anything from it (the node
    bound waits for sympy: `N*N*N` is one power)."""
    nesting, todo = 0, [(tree.body, 0)]
    while todo:
        node, depth = todo.pop()
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.FloorDiv):
            depth += 1
            nesting = max(nesting, depth)
        todo.extend((c, depth) for c in ast.iter_child_nodes(node) if isinstance(c, ast.expr))
    if nesting > MAX_SIZE_EXPR_NESTING:
        raise SizeTooComplex(f"size expression '{text if len(text) <= 60 else text[:57] + '...'}' is too complex "
                             f"('//' nested more than {MAX_SIZE_EXPR_NESTING} deep): simplifying such sizes takes "
                             "unbounded time")


def is_identifier(s: str) -> bool:
    return s.isidentifier() and len(s) <= 64


def prod(xs) -> int:
    return math.prod(xs)
