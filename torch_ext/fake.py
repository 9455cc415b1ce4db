"""The fake (meta) implementation's shapes: a fusion's output shapes and dtypes from the compiler's
shape rules, for `torch.compile` and `torch.library.opcheck`.

With plain integer sizes the rules run as they do for a real call (`Fusion.bind`: every check,
concrete shapes). With symbolic sizes (torch's SymInts, `dynamic=True`) the graph's own symbolic
output shapes -- sympy expressions over its size symbols, inferred when it was validated -- are
evaluated with the SymInts the inputs bind, so the traced graph stays symbolic.
"""

from __future__ import annotations

import operator
from functools import reduce

import sympy
import torch
from segfuse.compiler.errors import BindError, Issue

from .convert import segfuse_dtype, torch_dtype


def _symbolic(tensors) -> bool:
    return any(not isinstance(s, int) for t in tensors for s in t.shape)


def _eval(d, env: dict):
    """A dim (int or sympy expression over size symbols) with the symbols' values from `env`."""
    if isinstance(d, int):
        return d
    if d.is_Integer:
        return int(d)
    if d.is_Symbol:
        return env[d.name]
    if d.is_Add:
        return reduce(operator.add, (_eval(a, env) for a in d.args))
    if d.is_Mul:
        num, den = sympy.fraction(d)
        if den != 1:
            raise NotImplementedError(f"size expression {d} is not an integer expression")
        return reduce(operator.mul, (_eval(a, env) for a in d.args))
    if isinstance(d, sympy.floor):
        num, den = sympy.fraction(sympy.together(d.args[0]))
        return _eval(num, env) // _eval(den, env)
    if d.is_Pow and d.exp.is_Integer and int(d.exp) > 0:
        return reduce(operator.mul, [_eval(d.base, env)] * int(d.exp))
    raise NotImplementedError(f"size expression {d} cannot be evaluated with symbolic sizes")


def _bind_symbols(fusion, tensors) -> dict:
    """Symbol name -> size (int or SymInt) from the inputs' shapes; ranks and static sizes checked."""
    env, issues = {}, []
    for (name, t), x in zip(fusion.inputs, tensors):
        if x.dim() != t.rank:
            issues.append(Issue(("inputs", name), f"shape {list(x.shape)} has rank {x.dim()}, the graph "
                                                 f"declares rank {t.rank}"))
            continue
        for d, s in zip(t.shape, x.shape):
            if isinstance(d, int):
                torch._check(s == d, lambda d=d, s=s, name=name: f"inputs.{name}: size {s} should be {d}")
            elif d.is_Symbol:
                env.setdefault(d.name, s)
    if issues:
        raise BindError(issues)
    return env


def output_specs(fusion, tensors) -> list[tuple[tuple, torch.dtype]]:
    """(shape, torch dtype) of every graph output, in the graph's order, for inputs `tensors`
    (in the graph's input order; real, fake or meta tensors)."""
    for (name, t), x in zip(fusion.inputs, tensors):
        if segfuse_dtype(x, f"inputs.{name}") is not t.dtype:
            raise BindError([Issue(("inputs", name), f"dtype {segfuse_dtype(x, name)} does not match "
                                                     f"the graph's {t.dtype}")])
    if not _symbolic(tensors):
        bound = fusion.bind({n: tuple(x.shape) for n, x in zip(fusion.input_names, tensors)})
        types = bound.types
        return [(tuple(types[o.name].shape), torch_dtype(types[o.name].dtype)) for o in fusion.outputs]
    env = _bind_symbols(fusion, tensors)
    out = []
    for o in fusion.outputs:
        t = fusion.types[o.name]
        out.append((tuple(_eval(d, env) for d in t.shape), torch_dtype(t.dtype)))
    return out
