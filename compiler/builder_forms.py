"""How a call `fd.ops.<name>(...)` binds its arguments to a registry op: PyTorch's order, or nvFuser's.

A call binds in PyTorch's argument order first (the op's `signature`). Where it does not fit that
order -- a tensor where PyTorch's order has an attribute, a keyword only nvFuser's frontend uses,
a `DataType` where PyTorch's order has no dtype -- it binds in nvFuser's, so code written for
nvFuser runs unchanged: `fd.ops.gather(x, index, 0)`, `fd.ops.scatter(x, index, src, 0)`,
`fd.ops.sum(x, dim=0)`, `fd.ops.full(shape, fill_value=0, dtype=DataType.Int)`. A call that fits
both orders (`select(x, 1, 0)`: both ints) is read in PyTorch's.

An op's nvFuser forms are facts about the op, so the registry holds them: `OpDef.extra["nvfuser"]`,
a tuple of forms, each a dict with these keys (all optional):
- "name": nvFuser's name of the op where it differs (`fd.ops.max` is `amax`); such a form applies
  under that name only, the others under the op's own name;
- "signature": nvFuser's positional order, in the op's parameter names;
- "keywords": {nvFuser's keyword: the op's parameter} ("fill_value": "value");
- "fixed": attributes nvFuser's name implies ({"accumulate": True} for `index_put_accumulate`);
- "ignored": {nvFuser's parameter: the one value accepted}: parameters with no meaning in segfuse
  (`squeeze_expanded=False`), refused with any other value;
- "expand_scalar": {operand: (shape_of, dtype_of)}: nvFuser takes a scalar there; a 0-d tensor given
  there is cast to operand `dtype_of`'s dtype and expanded to operand `shape_of`'s shape.
Every op also takes nvFuser's keywords `arg`, `arg1`, `arg2`, `arg3` for its operands, in order.

Known difference: nvFuser's `div` of two integer tensors truncates (C division); segfuse's `div` is
PyTorch's true division (nvFuser's `truediv`, also accepted here). segfuse has no truncating
division; `fd.ops.floor_divide` equals it where the operands have the same sign.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from .builder_dtypes import DataType
from .ops.registry import REGISTRY, OpDef

GENERIC_KEYWORDS = ("arg1", "arg2", "arg3")  # nvFuser's names of an op's operands, in order ("arg": the first)


def signature(op: OpDef) -> tuple[str, ...]:
    """Python call order of an op's operands and attributes (PyTorch's argument order)."""
    sig = op.extra.get("signature")
    if sig is not None:
        rest = tuple(a for a in op.attrs.model_fields if a not in sig)
        return tuple(sig) + rest
    return tuple(op.operands) + tuple(op.attrs.model_fields)


@cache
def nvfuser_names() -> dict[str, OpDef]:
    """nvFuser's names of registry ops where they differ from the ops' own ("max" -> amax)."""
    names: dict[str, OpDef] = {}
    for op in REGISTRY.values():
        for form in op.extra.get("nvfuser", ()):
            name = form.get("name")
            if name is not None:
                if name in REGISTRY or names.get(name, op) is not op:
                    raise ValueError(f"nvFuser's name '{name}' of {op.name} names another op too")
                names[name] = op
    return names


class Bound:
    """A call's arguments bound to the op's parameters (`values`), and the form that bound them
    (None: PyTorch's order)."""

    __slots__ = ("op", "values", "form")

    def __init__(self, op: OpDef, values: dict[str, Any], form: dict | None):
        self.op, self.values, self.form = op, values, form


def bind_call(name: str, args: tuple, kwargs: dict, is_tensor) -> Bound:
    """Bind `fd.ops.<name>(*args, **kwargs)`; TypeError when no form of the op fits (what is wrong
    in PyTorch's order, and in nvFuser's where it has its own); AttributeError for an unknown name."""
    op = REGISTRY.get(name)
    if op is None:
        op = nvfuser_names().get(name)
        if op is None:
            raise AttributeError(f"no op named '{name}'")
        forms = [f for f in op.extra.get("nvfuser", ()) if f.get("name") == name]
        first: TypeError | None = None
        for form in forms:
            try:
                return Bound(op, _bind(op, name, form, args, kwargs, is_tensor), form)
            except TypeError as e:
                first = first or e
        raise first
    try:
        return Bound(op, _bind(op, name, None, args, kwargs, is_tensor), None)
    except TypeError as e:
        pytorch_error = e
    explicit = [f for f in op.extra.get("nvfuser", ()) if "name" not in f]
    for form in explicit or [{}]:
        try:
            return Bound(op, _bind(op, name, form, args, kwargs, is_tensor), form)
        except TypeError as e:
            if set(kwargs) & {*form.get("keywords", {}), *form.get("ignored", {})}:
                raise  # a call in nvFuser's words: nvFuser's form says what is wrong
            if "signature" in form and str(e) != str(pytorch_error):
                pytorch_error = TypeError(f"{pytorch_error}; in nvFuser's order ({', '.join(form['signature'])}): "
                                          f"{str(e).removeprefix(f'{name}(): ')}")
    raise pytorch_error


def _bind(op: OpDef, name: str, form: dict | None, args: tuple, kwargs: dict, is_tensor) -> dict[str, Any]:
    own = signature(op)
    if form is None:
        params, keywords = own, {}
    else:
        sig = form.get("signature")
        params = own if sig is None else tuple(sig) + tuple(p for p in own if p not in sig)
        keywords = {"arg": op.operands[0]} if op.operands else {}
        keywords.update(zip(GENERIC_KEYWORDS, op.operands))
        keywords.update(form.get("keywords", {}))
    ignored = form.get("ignored", {}) if form else {}
    if len(args) > len(params):
        raise TypeError(f"{name}() takes {len(params)} arguments ({', '.join(params)}), got {len(args)}")
    bound = dict(zip(params, args))
    for k, v in kwargs.items():
        if k in ignored:
            if v != ignored[k]:
                raise TypeError(f"{name}(): {k}={v!r} is not supported (segfuse takes only {k}={ignored[k]!r})")
            continue
        p = k if k in params else keywords.get(k)
        if p is None or p not in params:
            raise TypeError(f"{name}() got an unexpected argument '{k}' (takes {', '.join(params)})")
        if p in bound:
            raise TypeError(f"{name}() got two values for '{p}'")
        bound[p] = v
    for k, v in (form.get("fixed", {}) if form else {}).items():
        if bound.setdefault(k, v) != v:
            raise TypeError(f"{name}(): {k} is {v!r} in {name}")
    _check_kinds(op, name, bound, is_tensor)
    return bound


def _check_kinds(op: OpDef, name: str, bound: dict, is_tensor) -> None:
    """TypeError where a value cannot be what its parameter is: a tensor given for an attribute
    (a constant), or a DataType for anything but a dtype (so the call tries its next form)."""
    for p, v in bound.items():
        if p in op.operands:
            continue
        if is_tensor(v):
            raise TypeError(f"{name}(): {p} is a constant (an attribute), not a tensor (a define_scalar input "
                            "is a 0-d tensor: give the number itself)")
        if isinstance(v, DataType) and p != "dtype":
            raise TypeError(f"{name}(): {p} is not a dtype, got {v}")
