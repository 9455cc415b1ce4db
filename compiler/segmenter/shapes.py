"""Shape classes: which concrete sizes share one plan.

A plan is made for a *shape class*, not for one set of sizes, so that a new batch size costs
no re-planning (like nvFuser's FusionExecutorCache reusing a runtime whose heuristics match).
The class of a run is:

1. for every size symbol, whether it is 0, 1 or larger ("n"): 0 and 1 change broadcasting and
   emptiness, so those symbols are substituted into the types the segmenter sees; the others
   stay symbolic, and the plan's sizes (buffer bytes, smem, grid size) are expressions in them.
   Derived sizes (T-1, K*T) keep their 0/1/n class too; when the symbolic types disagree with
   the run's (a derived size that is 1 broadcasts), the class is the exact sizes;
2. the outcome of every size test the segmenter made while planning (`Checks`): the index width
   (32-bit while every tensor has < 2^31 elements), whether each region fits one thread block,
   library thresholds, and the memory-traffic comparisons behind copy-or-reorder choices.

A later run is in the same class when (1) matches and every recorded test gives the same
answer with its sizes; then the cached plan is exactly right for it (`PlanCache`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import sympy

from ..errors import OpError
from ..limits import charge, counted, memoized
from ..ops.registry import InferCtx, TensorType
from ..shapes import norm, symbol
from ..shapes import numel as _numel


def _size_class(v: int) -> str:
    return str(v) if v in (0, 1) else "n"


def size_classes(env: dict[str, int]) -> dict[str, str]:
    """'0', '1' or 'n' for each size symbol."""
    return {k: _size_class(v) for k, v in sorted(env.items())}


def base_key(env: dict[str, int]) -> str:
    return ",".join(f"{k}={c}" for k, c in size_classes(env).items())


def _subs(d, fixed: dict):
    if isinstance(d, int) or not fixed:
        return d
    return norm(d.subs(fixed))


class _ClassCtx(InferCtx):
    """Shape inference with the 0/1 symbols fixed and the others left symbolic."""

    def __init__(self, symbols, fixed):
        super().__init__(symbols, None)
        self.fixed = fixed

    def size(self, value, where):
        return _subs(super().size(value, where), self.fixed)


_CLASS_TYPES: dict = {}  # (fusion id, the 0/1 symbols) -> types; inference simplifies sympy expressions


def class_types(fusion, env: dict[str, int]) -> dict[str, TensorType] | None:
    """Every tensor's type for the shape class of `env` (None if inference needs exact sizes)."""
    key = (fusion.id, tuple(sorted((k, v) for k, v in env.items() if v in (0, 1))))
    if key not in _CLASS_TYPES:
        if len(_CLASS_TYPES) > 1024:
            _CLASS_TYPES.clear()
        _CLASS_TYPES[key] = counted(_infer_class_types, fusion, env)
    types, units = _CLASS_TYPES[key]
    charge(units)  # what inferring them cost, remembered or not (limits.memoized)
    return types


def _infer_class_types(fusion, env: dict[str, int]) -> dict[str, TensorType] | None:
    fixed = {symbol(k): v for k, v in env.items() if v in (0, 1)}
    types: dict[str, TensorType] = {}
    for name, t in fusion.inputs:
        types[name] = TensorType(t.dtype, tuple(_subs(d, fixed) for d in t.shape))
    ctx = _ClassCtx(fusion.symbols, fixed)
    try:
        for node in fusion.nodes:
            operands = [types[x] if isinstance(x, str) else x for x in node.inputs]
            for n, t in zip(node.outputs, node.op.infer(ctx, operands, node.attrs)):
                types[n] = TensorType(t.dtype, tuple(_subs(d, fixed) for d in t.shape))
    except (OpError, TypeError, ValueError):
        return None
    return types


def evaluate(expr, env: dict[str, int]) -> int:
    if isinstance(expr, int):
        return expr
    return int(sympy.sympify(expr).subs({symbol(k): v for k, v in env.items()}))


@memoized(4096)
def numel(shape: tuple):
    """Elements of a shape (cached: simplifying symbolic products dominates planning time)."""
    return _numel(shape)


@memoized(4096)
def nbytes(t: TensorType):
    n = numel(tuple(t.shape))
    return n * t.dtype.itemsize if isinstance(n, int) else norm(n * t.dtype.itemsize)


def fmt(expr) -> str | int:
    """A size as JSON: an int when static, else the expression's text."""
    return expr if isinstance(expr, int) else str(expr)


@lru_cache(maxsize=4096)
def _same_at_every_size(lhs, rhs) -> bool:
    """Whether lhs <= rhs has one answer for all sizes (sizes are non-negative integers)."""
    margin = sympy.expand(sympy.sympify(rhs) - sympy.sympify(lhs))
    return bool(margin.is_nonnegative or margin.is_negative)


@dataclass
class Check:
    what: str  # what the test decides, in words
    lhs: object  # sympy expression or int
    rhs: object
    holds: bool

    def to_dict(self) -> dict:
        return {"what": self.what, "test": f"{self.lhs} <= {self.rhs}", "holds": self.holds}


@dataclass
class Checks:
    """The size tests a planning consulted, with their answers (the size-dependent part of the class)."""

    env: dict[str, int]
    items: list[Check] = field(default_factory=list)
    dims: list = field(default_factory=list)  # (derived size expression, its 0/1/n class)
    _seen: dict = field(default_factory=dict)

    def le(self, lhs, rhs, what: str) -> bool:
        """lhs <= rhs at this run's sizes; static tests are answered without recording."""
        key = (str(lhs), str(rhs))
        if key in self._seen:
            return self._seen[key].holds
        holds = evaluate(lhs, self.env) <= evaluate(rhs, self.env)
        if isinstance(lhs, int) and isinstance(rhs, int):
            return holds
        if _same_at_every_size(lhs, rhs):
            return holds  # not part of the shape class
        c = Check(what, lhs, rhs, holds)
        self._seen[key] = c
        self.items.append(c)
        return holds

    def all_le(self, exprs, bound, what: str) -> bool:
        """Every expression <= bound, as one test (max of the symbolic ones)."""
        static = [e for e in exprs if isinstance(e, int)]
        symbolic = sorted({e for e in exprs if not isinstance(e, int)}, key=str)
        if any(e > bound for e in static):
            return False
        if not symbolic:
            return True
        return self.le(symbolic[0] if len(symbolic) == 1 else sympy.Max(*symbolic), bound, what)

    def replay(self, env: dict[str, int]) -> bool:
        """Whether every recorded test has the same answer at other sizes (same class)."""
        return all(_size_class(evaluate(d, env)) == c for d, c in self.dims) and all(
            (evaluate(c.lhs, env) <= evaluate(c.rhs, env)) == c.holds for c in self.items)

    def pin_dims(self, types: dict) -> None:
        """Derived sizes (T-1, K*T) keep their 0/1/n class within a shape class: a size that
        becomes 1 changes broadcasting just like a symbol that is 1."""
        found = {d for t in types.values() for d in t.shape if not isinstance(d, (int, sympy.Symbol))}
        self.dims = [(d, _size_class(evaluate(d, self.env))) for d in sorted(found, key=str)]

    def pinned_small(self) -> str:
        return ",".join(f"{d}={c}" for d, c in self.dims if c != "n")

    def signature(self) -> str:
        return "".join("1" if c.holds else "0" for c in self.items)
