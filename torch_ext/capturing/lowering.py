"""The lowering mechanism: one ATen op of an FX graph -> registry ops on a `FusionDefinition`.

A lowering is a function registered for ATen ops with `@lowers(...)`:

    @lowers(torch.ops.aten.clamp)                       # an overload packet: every overload
    def _clamp(cx, x, min=None, max=None): ...           # -> a builder Tensor (or a tuple of them)

It is called with the FX node's arguments in the ATen schema's positions (`node.args`, `node.kwargs`),
with these replaced:
- an FX node holding a tensor -> the builder `Tensor` it was lowered to (a list of them for Tensor[]);
- an FX node holding several results -> the tuple of their `Tensor`s;
- a symbolic size (a SymInt node: `sym_size`, or arithmetic on sizes) where the schema takes a size
  (SymInt, SymInt[]) -> its size expression as the graph format writes it, a `str` over the graph's
  size symbols ("4*topk_ids_0"); a size that is a known constant -> an `int`. `cx.size(...)` converts
  any size (int, SymInt, sympy) the same way;
- a symbolic size (SymInt or SymFloat) where the schema takes a number or a tensor (Scalar, Tensor,
  float: `x / x.shape[0]`, `rows - x.shape[0]`) -> a 0-d tensor computing it (sizes.py
  `size_operand`: int64, or the narrower integer dtype PyTorch converts the number to; float64 for a
  SymFloat, float32 where no float tensor sets the dtype), so the op computes with it as PyTorch does.
  A lowering registered with `sizes_as_written=True` gets the size expression there as well (arange:
  its length is its result's size) and converts what it computes with (`cx.size_operand`);
- a `torch.dtype` -> the segfuse `DType` (an unsupported one is refused);
- numbers, bools, strings, lists of ints, None, devices, layouts: as they are.

ATen overloads without a registered lowering are lowered generically (`generic_op`) when the
registry has an op of the packet's name, the overload is functional and returns as many tensors as
the registry op (and nothing else), and every ATen argument binds to a registry parameter: by name, or
by position where the registry's parameter there is an operand (`self` -> `x`, `other` -> `y`) or
`dims` for ATen's `dim`; only arguments that never change the values (layout, device, memory format,
sparse_grad) may be left over: `aten.exp`, `aten.add.Scalar`, `aten.where.self`, `aten.cumsum` ...
The rule claims an overload only when it takes every value of its arguments, because `has_lowering`
keeps what is claimed out of the decomposition table: an overload with an argument the registry op
lacks (`aten.pad`'s mode, `aten.round.decimals`) is lowered by a family module or decomposed by torch,
never claimed and then refused. What the registry op itself refuses (a dtype it lacks) and ops with no
lowering are refused with a `CaptureError` naming the op and the user's file:line.

`lower_node` lowers one FX node with these (graph.py walks a graph with it; `unsupported_reason` asks
it about one node on a scratch definition): size arithmetic is read from the node's value, run-time
checks (`_assert_scalar`, ...) are left out, and the segfuse result's dtype and shape are compared with
what PyTorch computed (the node's FakeTensor), so a rule that differs from PyTorch is refused, never run.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from types import MappingProxyType
from typing import Any, NoReturn

import torch
from segfuse.compiler.builder import FusionDefinition, Tensor, signature
from segfuse.compiler.dtypes import DType
from segfuse.compiler.errors import GraphError, OpError
from segfuse.compiler.ops.registry import REGISTRY, OpDef
from segfuse.compiler.shapes import dims_equal, parse_size

from .errors import CaptureError
from .sizes import SizeNames, size_operand, sizes_as_numbers, supported_dtypes_text, torch_to_dtype

__all__ = ["CHECKS", "SIZE_OPS", "LowerContext", "SizeNames", "alternative_for", "alternatives", "aten_name",
           "define_input", "has_lowering", "lower_alone", "lower_node", "lowering_of", "lowers", "registered_lowerings",
           "suggest", "supported_dtypes_text", "torch_to_dtype", "unsupported_reason", "user_location"]

aten = torch.ops.aten

_TABLE: dict[Any, Callable] = {}  # OpOverload or OpOverloadPacket -> lowering



def _existing(*names: str) -> frozenset:
    """The ATen overloads of these names ("sym_size.int") that this PyTorch has."""
    found = set()
    for n in names:
        packet, _, overload = n.partition(".")
        op = getattr(getattr(aten, packet, None), overload, None)
        if op is not None:
            found.add(op)
    return frozenset(found)


# ATen ops that check at run time what the captured graph states already (dtypes, size ranges):
# they make no value, and are left out.
CHECKS = _existing(
    "_assert_tensor_metadata.default", "_assert_scalar.default", "sym_constrain_range.default",
    "sym_constrain_range_for_size.default", "_assert_async.msg", "_assert_async.default",
    "_functional_assert_async.msg", "_functional_sym_constrain_range.default",
    "_functional_sym_constrain_range_for_size.default", "_functional_assert_scalar.default")

# FX targets whose results are sizes (SymInts; SymFloats of a true division), read from the node's
# value, never lowered.
SIZE_OPS = _existing("sym_size.int", "sym_numel.default", "sym_storage_offset.default", "sym_stride.int") | {
    operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod, operator.neg, operator.truediv,
    torch.sym_max, torch.sym_min, torch.sym_float, *([torch.sym_sum] if hasattr(torch, "sym_sum") else [])}


_SIZES_AS_WRITTEN: set = set()  # ops whose lowering takes sizes as expressions where a number goes too


def lowers(*ops, sizes_as_written: bool = False) -> Callable:
    """Register the decorated function as the lowering of `ops` (ATen overloads or packets);
    `sizes_as_written`: it gets symbolic sizes as size expressions where the schema takes a number
    too (the module doc says why)."""

    def register(fn: Callable) -> Callable:
        for op in ops:
            if op in _TABLE:
                raise ValueError(f"{op} has two lowerings")
            _TABLE[op] = fn
            if sizes_as_written:
                _SIZES_AS_WRITTEN.add(op)
        return fn

    return register


# ATen ops segfuse lacks (overload packet names) -> the nearest supported way to write what they
# do, named in their refusals; the family modules add theirs with `suggest`.
_ALTERNATIVES: dict[str, str] = {}


def suggest(aten_op: str, alternative: str) -> None:
    """Name `alternative` in the refusal of the unsupported ATen op `aten_op` ("nonzero")."""
    _ALTERNATIVES[aten_op] = alternative


def alternative_for(target) -> str | None:
    packet = getattr(target, "overloadpacket", None)
    return _ALTERNATIVES.get(packet.__name__ if packet is not None else aten_name(target))


def registered_lowerings() -> MappingProxyType:
    """The `@lowers` table, read-only: ATen overload or overload packet -> its lowering (docs/gen_docs.py
    makes the table of supported ATen ops from it and the generic rule)."""
    return MappingProxyType(_TABLE)


def alternatives() -> MappingProxyType:
    """The `suggest` table, read-only: unsupported ATen op (packet name) -> the way to write it."""
    return MappingProxyType(_ALTERNATIVES)


def lowering_of(target) -> Callable | None:
    """The registered lowering of an FX target, else the generic one where it applies, else None."""
    fn = _TABLE.get(target)
    if fn is None and isinstance(target, torch._ops.OpOverload):
        fn = _TABLE.get(target.overloadpacket)
        if fn is None and generic_op(target) is not None:
            fn = lower_generic
    return fn


def has_lowering(target) -> bool:
    """Whether segfuse lowers `target` itself (so a decomposition table should keep it whole)."""
    return lowering_of(target) is not None


def generic_op(target) -> OpDef | None:
    """The registry op that lowers an ATen overload by name, if it takes every argument of the
    overload (the module doc gives the rule)."""
    if not isinstance(target, torch._ops.OpOverload):
        return None
    op = REGISTRY.get(target.overloadpacket.__name__)
    schema = target._schema
    if op is None or schema.is_mutable or len(schema.returns) != op.n_outputs \
            or any(str(r.type) != "Tensor" for r in schema.returns):
        return None
    params = signature(op)
    aten_names = {a.name for a in schema.arguments}
    if any(_registry_param(op, params, aten_names, i, a.name) is None and a.name not in STORAGE_ARGS
           for i, a in enumerate(schema.arguments)):
        return None
    return op


def _registry_param(op: OpDef, params, aten_names, i: int, name: str) -> str | None:
    """The parameter of the registry op that takes the ATen argument `name` at position i, if any."""
    if name in params:
        return name
    if i < len(params) and params[i] not in aten_names and (
            params[i] in op.operands or (name, params[i]) == ("dim", "dims")):
        return params[i]  # the same place under another name: self -> x, other -> y, dim -> dims
    return None


def aten_name(target) -> str:
    """How messages name an FX target: "aten.scatter_add.default"."""
    if isinstance(target, torch._ops.OpOverload):
        return str(target)
    return getattr(target, "__name__", str(target))


_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def user_location(stack_trace: str | None) -> str | None:
    """file:line of the innermost frame of `stack_trace` (FX's node.meta["stack_trace"], or an
    export error's text) that is not PyTorch's own code."""
    if not stack_trace:
        return None
    frames = [(f, ln) for f, ln in _FRAME.findall(stack_trace) if not _is_torch_file(f)]
    return f"{frames[-1][0]}:{frames[-1][1]}" if frames else None


def _is_torch_file(path: str) -> bool:
    p = path.replace("\\", "/")
    return "/site-packages/torch/" in p or "/dist-packages/torch/" in p or p.startswith("torch/") \
        or "/torch_ext/capturing/" in p


# ---- the context a lowering gets ----------------------------------------------------------
class LowerContext:
    """What a lowering function gets: the definition being built (`fd`), the FX node (`node`), and
    ways to read PyTorch's view of the node's values and to refuse it."""

    def __init__(self, fd: FusionDefinition, node: torch.fx.Node, sizes: SizeNames,
                 origin: MappingProxyType | None = None):
        self.fd, self.node, self.sizes = fd, node, sizes
        self._origin = origin if origin is not None else MappingProxyType({})  # tensor name -> fx node

    @property
    def op(self) -> str:
        return aten_name(self.node.target)

    @property
    def location(self) -> str | None:
        return user_location(self.node.meta.get("stack_trace"))

    def refuse(self, message: str, alternative: str | None = None) -> NoReturn:
        raise CaptureError(message, op=self.op, location=self.location, alternative=alternative)

    def meta(self, x):
        """PyTorch's value (a FakeTensor, a SymInt, ...) of an FX arg: an fx Node, a builder Tensor
        lowered from one, or an int i for the node's i-th positional argument."""
        if isinstance(x, int) and not isinstance(x, bool):
            x = self.node.args[x]
        if isinstance(x, Tensor):
            x = self._origin.get(x.name, x)
            if isinstance(x, Tensor):
                raise KeyError(f"no FX node made {x.name}")
        return x.meta.get("val") if isinstance(x, torch.fx.Node) else x

    @property
    def out(self):
        """PyTorch's value of the node's result (a FakeTensor, or a tuple of them)."""
        return self.node.meta.get("val")

    def dtype(self, x) -> DType:
        """The segfuse dtype of a builder Tensor, a (Fake)Tensor, a torch.dtype or an FX node."""
        if isinstance(x, Tensor):
            return x.dtype
        if isinstance(x, torch.fx.Node):
            x = self.meta(x)
        if isinstance(x, torch.Tensor):
            x = x.dtype
        if isinstance(x, DType):
            return x
        dt = torch_to_dtype(x)
        if dt is None:
            self.refuse(f"dtype {x} is not supported by segfuse", alternative=supported_dtypes_text())
        return dt

    def size(self, d) -> int | str:
        try:
            return self.sizes.size(d)
        except ValueError as e:
            self.refuse(str(e))

    def shape(self, x=None) -> list:
        """Sizes of an FX arg's value (see `meta`) or, with no argument, of the node's result."""
        v = self.out if x is None else self.meta(x)
        return [self.size(d) for d in v.shape]

    def size_operand(self, d, dtype: DType | None = None):
        """A size (int, size expression, SymInt, SymFloat) as an operand of arithmetic: a number, or
        a 0-d tensor computing it (sizes.py `size_operand`); refused where segfuse cannot compute it."""
        try:
            return size_operand(self.fd, d, self.sizes, dtype)
        except ValueError as e:
            self.refuse(str(e))


# ---- the generic lowering ----------------------------------------------------------------
def lower_generic(cx: LowerContext, *args, **kwargs):
    """The registry op of the ATen op's name, its arguments bound by name (see the module doc)."""
    target = cx.node.target
    op = generic_op(target)
    params = signature(op)
    bound: dict[str, Any] = {}
    schema_args = bind_schema(target, args, kwargs)
    aten_names = {a.name for a, _, _ in schema_args}
    for i, (arg, value, given) in enumerate(schema_args):
        p = _registry_param(op, params, aten_names, i, arg.name) or arg.name
        if p in params and p not in bound:
            if given or p in op.operands or value is not None:  # (ATen's default, where it states one)
                bound[p] = value
        elif given and not is_default(arg, value):
            cx.refuse(f"argument {arg.name}={value!r} has no equivalent in segfuse's {op.name}")
    for p, v in bound.items():
        if p not in op.operands and isinstance(v, Tensor):
            cx.refuse(f"segfuse's {op.name} takes {p} as a constant, not a tensor")
    return getattr(cx.fd.ops, op.name)(**bound)


def bind_schema(target, args, kwargs) -> list[tuple[Any, Any, bool]]:
    """(schema argument, value, whether the call gave it) for every argument of an ATen overload."""
    out = []
    for i, a in enumerate(target._schema.arguments):
        if i < len(args) and not a.kwarg_only:
            out.append((a, args[i], True))
        elif a.name in kwargs:
            out.append((a, kwargs[a.name], True))
        else:
            out.append((a, a.default_value, False))
    return out


# Arguments that say where or how a result (or its gradient) is stored, never what it holds.
STORAGE_ARGS = frozenset({"layout", "device", "pin_memory", "memory_format", "non_blocking", "sparse_grad"})


def is_default(arg, value) -> bool:
    """Whether `value` is what the ATen argument means when it is not given."""
    if arg.name in STORAGE_ARGS:
        return True
    if not arg.has_default_value():
        return False
    d = arg.default_value
    if isinstance(value, (Tensor, torch.Tensor)) or isinstance(d, torch.Tensor):
        return False
    if isinstance(value, bool) or isinstance(d, bool) or value is None or d is None:
        return value is d
    if isinstance(value, (list, tuple)) and isinstance(d, (list, tuple)):
        return list(value) == list(d)
    return type(value) in (int, float, str) and type(d) in (int, float, str) and value == d


def unsupported_reason(node: torch.fx.Node) -> str | None:
    """Why segfuse cannot lower `node` (None: it can), found without touching any definition being
    built: the node is lowered alone on a scratch definition whose inputs are its arguments."""
    try:
        lower_alone(node)
    except CaptureError as e:
        return str(e)
    return None


# ---- one node ------------------------------------------------------------------------------
def lower_alone(node: torch.fx.Node) -> None:
    """Lower one call node on a scratch definition whose inputs are its tensor arguments (what
    `unsupported_reason` asks); CaptureError if it cannot be lowered."""
    if node.op != "call_function":
        return
    fd = FusionDefinition("probe")
    sizes = SizeNames()
    env: dict = {}
    origin: dict = {}
    for arg in node.all_input_nodes:  # a scratch graph names PyTorch's symbols as they are
        val = arg.meta.get("val")
        for t in (val if isinstance(val, (tuple, list)) else (val,)):
            for d in (t.shape if isinstance(t, torch.Tensor) else ()):
                if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol:
                    sizes.name(d.node.expr.name, d.node.expr.name)
    for k, arg in enumerate(node.all_input_nodes):
        val = arg.meta.get("val")
        if isinstance(val, torch.Tensor):
            env[arg] = define_input(fd, val, f"in{k}", sizes, derived_ok=True)
            origin[f"in{k}"] = arg
        elif isinstance(val, (tuple, list)) and arg.target is not None:
            env[arg] = tuple(define_input(fd, v, f"in{k}_{j}", sizes, derived_ok=True) for j, v in enumerate(val)
                             if isinstance(v, torch.Tensor))
        else:
            if isinstance(val, (torch.SymInt, torch.SymFloat)):  # a size: its symbols too, each an input's dim
                for s in val.node.expr.free_symbols:
                    if s.name not in sizes.known():
                        fd.define_tensor(f"size_{len(sizes.known())}", [sizes.name(s.name, s.name)], "int64")
            env[arg] = size_value(arg, sizes)
    lower_node(fd, node, env, sizes, origin)


def define_input(fd: FusionDefinition, val: torch.Tensor, name: str, sizes: SizeNames,
                  derived_ok: bool = False) -> Tensor:
    """`derived_ok`: a dim of a derived size (2*s0) gets a symbol of its own (one per size,
    `SizeNames.fresh`) instead of a refusal: where the input stands for an op's result (a probe, a
    part of a graph)."""
    dt = torch_to_dtype(val.dtype)
    if dt is None:
        raise CaptureError(f"dtype {val.dtype} is not supported by segfuse", op=f"input {name}",
                           alternative=supported_dtypes_text())
    shape = []
    for k, d in enumerate(val.shape):
        if isinstance(d, torch.SymInt) and not d.node.expr.is_Integer:
            expr = d.node.expr
            if not expr.is_Symbol and derived_ok:
                shape.append(sizes.fresh(expr, f"{name}_{k}"))
                continue
            if not expr.is_Symbol:
                raise CaptureError(f"dim {k} has the derived size {expr}; a graph input's size is a number or "
                                   "a size symbol", op=f"input {name}",
                                   alternative="give this dim its own torch.export.Dim")
            shape.append(sizes.name(expr.name, f"{name}_{k}"))
        else:
            shape.append(int(d))
    try:
        return fd.define_tensor(name, shape, dt.value)
    except (GraphError, ValueError) as e:
        raise CaptureError(str(e), op=f"input {name}") from None


def size_value(node: torch.fx.Node, sizes: SizeNames):
    """A node whose value is a size: its int or size expression; a refusal when used otherwise."""
    val = node.meta.get("val")
    if isinstance(val, (int, torch.SymInt)) and not isinstance(val, bool):
        try:
            return sizes.size(val)
        except ValueError as e:
            return _Unusable(str(e))
    return _Unusable(f"{node.name} holds {type(val).__name__}, which segfuse cannot take")


class _Unusable:
    """A value no lowering may read (a size that depends on the data, ...): why, for the refusal."""

    def __init__(self, why: str):
        self.why = why


def lower_node(fd: FusionDefinition, node: torch.fx.Node, env: dict, sizes: SizeNames, origin: dict):
    """The builder values of one call node: Tensors, a tuple of them, a size, or None for a check.
    `env`: the values of the nodes before it; `origin`: tensor name -> the node that made it (this
    node's results are added)."""
    target = node.target
    if target is operator.getitem:
        return env[node.args[0]][node.args[1]]
    if target in CHECKS:
        return None
    val = node.meta.get("val")
    cx = LowerContext(fd, node, sizes, MappingProxyType(origin))
    if target in SIZE_OPS or isinstance(val, (torch.SymInt, torch.SymBool, torch.SymFloat)):
        return size_value(node, sizes)
    fn = lowering_of(target)
    if fn is None:
        cx.refuse("no segfuse equivalent for this ATen op", alternative=alternative_for(target))
    for v in (val if isinstance(val, (tuple, list)) else (val,)):
        if isinstance(v, torch.Tensor) and torch_to_dtype(v.dtype) is None:
            cx.refuse(f"its result's dtype {v.dtype} is not supported by segfuse", alternative=supported_dtypes_text())
    args, kwargs = node.args, node.kwargs
    if target not in _SIZES_AS_WRITTEN and getattr(target, "overloadpacket", None) not in _SIZES_AS_WRITTEN:
        args, kwargs = sizes_as_numbers(node, cx.size_operand)
    args = _replace(args, env, cx)
    kwargs = {k: _replace(v, env, cx) for k, v in kwargs.items()}
    try:
        result = fn(cx, *args, **kwargs)
    except CaptureError:
        raise
    except (GraphError, OpError, TypeError, ValueError) as e:
        cx.refuse(f"segfuse refuses it: {e}")
    _check_result(cx, result, val)
    for t in (result if isinstance(result, tuple) else (result,)):
        if isinstance(t, Tensor) and t.name not in origin:
            origin[t.name] = node
    return result


def _replace(a, env, cx):
    if isinstance(a, torch.fx.Node):
        v = env[a]
        if isinstance(v, _Unusable):
            cx.refuse(v.why)
        return v
    if isinstance(a, (list, tuple)):
        return type(a)(_replace(x, env, cx) for x in a)
    if isinstance(a, torch.dtype):
        return cx.dtype(a)
    if isinstance(a, (torch.SymInt,)):
        return cx.size(a)
    return a


def _check_result(cx: LowerContext, result, val) -> None:
    """Refuse a lowering whose dtype or shape is not PyTorch's (a rule that differs from torch)."""
    got = result if isinstance(result, tuple) else (result,)
    want = val if isinstance(val, (tuple, list)) else (val,)
    if len(got) != len(want):
        cx.refuse(f"segfuse gives {len(got)} results where PyTorch gives {len(want)}")
    for g, w in zip(got, want):
        if not isinstance(w, torch.Tensor):
            continue
        if not isinstance(g, Tensor):
            cx.refuse(f"the lowering made {type(g).__name__} where PyTorch makes a tensor")
        want_dt = cx.dtype(w.dtype)
        want_shape = [cx.size(d) for d in w.shape]
        if g.dtype is not want_dt or not _same_shape(g.shape, want_shape, cx.sizes):
            cx.refuse(f"segfuse computes {g.dtype}{list(g.shape)} where PyTorch computes {want_dt}{want_shape}")


def _same_shape(got, want, sizes: SizeNames) -> bool:
    if len(got) != len(want):
        return False
    for g, w in zip(got, want):
        w = w if isinstance(w, int) else parse_size(w)
        if dims_equal(g, w) is False:
            return False
    return True
