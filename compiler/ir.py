"""The typed DAG: a validated graph with every tensor's dtype and (symbolic) shape.

`Fusion.from_spec` validates a `GraphSpec` and collects every problem it finds as an `Issue`
with a location (`ops[3].inputs[1]`), then raises one `GraphError`. `Fusion.bind` checks
run-time input shapes and dtypes and infers concrete shapes (cached per set of sizes).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import pydantic

from . import ops as _ops
from .dtypes import DType
from .errors import BindError, GraphError, Issue, OpError
from .ops.registry import (
    REGISTRY,
    Attrs,
    Expansion,
    InferCtx,
    OpDef,
    OpKind,
    Scalar,
    TensorType,
)
from .schema import GraphSpec, OpSpec, OutputSpec
from .shapes import dims_equal, fmt_shape, is_identifier
from .spec_errors import did_you_mean, pydantic_issues, spec_fields


@dataclass(frozen=True)
class Limits:
    """Size limits a server can configure; validation reports violations as issues."""

    max_ops: int = 4096
    max_rank: int = 8
    max_inputs: int = 256


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class Node:
    index: int  # position in the graph's `ops` list
    op: OpDef
    inputs: tuple  # tensor names (str) or Scalar literals
    attrs: Attrs
    outputs: tuple[str, ...]

    @property
    def kind(self) -> OpKind:
        return self.op.kind

    def tensor_inputs(self) -> list[str]:
        return [x for x in self.inputs if isinstance(x, str)]

    def label(self) -> str:
        return f"ops[{self.index}] {self.op.name} -> {', '.join(self.outputs)}"


@dataclass(frozen=True)
class Output:
    name: str
    alias_of: str | None = None


MAX_BOUND = 1024  # bound input signatures remembered per fusion (past it the memo starts over)


def _bind_key(shapes: dict, dtypes: dict | None) -> tuple:
    return (tuple([(n, tuple(s)) for n, s in shapes.items()]),
            None if dtypes is None else tuple(dtypes.items()))


@dataclass(frozen=True)
class Bound:
    """A fusion with its sizes bound: the symbol values and every tensor's concrete type."""

    env: dict
    types: dict


@dataclass
class Fusion:
    spec: GraphSpec
    inputs: list[tuple[str, TensorType]]
    nodes: list[Node]
    outputs: list[Output]
    types: dict[str, TensorType]
    symbols: frozenset
    id: str
    producer: dict[str, int] = field(default_factory=dict)  # tensor -> node position (absent: graph input)
    uses: dict[str, list[tuple[int, int]]] = field(default_factory=dict)  # tensor -> [(node pos, operand pos)]
    # `bind`'s results by (input shapes, dtypes): a serving loop sees the same sizes again and
    # again, and binding costs more than a small run on the host
    _bound: dict = field(default_factory=dict, repr=False)

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def input_names(self) -> list[str]:
        return [n for n, _ in self.inputs]

    def to_json(self) -> dict:
        return canonical_dict(self.spec)

    def input_shapes(self, env: dict[str, int]) -> dict[str, tuple]:
        """Each input's concrete shape once its size symbols take the values in `env` (KeyError if one is missing)."""
        return {name: tuple(d if isinstance(d, int) else env[str(d)] for d in t.shape) for name, t in self.inputs}

    # ---- construction ------------------------------------------------------------------
    @classmethod
    def from_json(cls, data: Any, limits: Limits = DEFAULT_LIMITS) -> Fusion:
        if isinstance(data, (str, bytes)):
            try:
                data = json.loads(data)
            except json.JSONDecodeError as e:
                raise GraphError(f"not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
        if not isinstance(data, dict):
            raise GraphError("a graph must be a JSON object")
        try:
            spec = GraphSpec.model_validate(data)
        except pydantic.ValidationError as e:
            raise GraphError(pydantic_issues(e, fields=spec_fields)) from None
        return cls.from_spec(spec, limits)

    @classmethod
    def from_spec(cls, spec: GraphSpec, limits: Limits = DEFAULT_LIMITS) -> Fusion:
        return _Validator(spec, limits).run()

    # ---- binding ------------------------------------------------------------------------
    def bind(self, shapes: dict[str, tuple], dtypes: dict[str, DType] | None = None,
             loc_prefix: tuple = ("inputs",)) -> Bound:
        """Check run-time inputs (shapes, and dtypes if given) and infer every concrete shape.
        Remembered per (shapes, dtypes): the same inputs bind to the same object."""
        key = _bind_key(shapes, dtypes)
        hit = self._bound.get(key)
        if hit is not None:
            return hit
        issues = []
        given = set(shapes)
        env: dict[str, int] = {}
        bound_by: dict[str, str] = {}
        for name, t in self.inputs:
            if name not in shapes:
                issues.append(Issue(loc_prefix + (name,), "missing input (the graph declares it)"))
                continue
            shape = tuple(int(s) for s in shapes[name])
            if dtypes is not None and name in dtypes and dtypes[name] is not t.dtype:
                issues.append(Issue(loc_prefix + (name,), f"dtype {dtypes[name]} does not match the graph's {t.dtype}"))
            if len(shape) != t.rank:
                issues.append(Issue(loc_prefix + (name,), f"shape {list(shape)} has rank {len(shape)}, "
                                                          f"the graph declares {fmt_shape(t.shape)}"))
                continue
            for k, (d, s) in enumerate(zip(t.shape, shape)):
                if isinstance(d, int):
                    if d != s:
                        issues.append(Issue(loc_prefix + (name,), f"size {s} at dim {k} should be {d}"))
                else:
                    sym = d.name
                    if sym in env and env[sym] != s:
                        issues.append(Issue(loc_prefix + (name,), f"size {s} at dim {k} disagrees with "
                                                                  f"{sym}={env[sym]} bound by input '{bound_by[sym]}'"))
                    env.setdefault(sym, s)
                    bound_by.setdefault(sym, name)
        for extra in sorted(given - set(self.input_names)):
            issues.append(Issue(loc_prefix + (extra,), f"unknown input (the graph's inputs are: "
                                                       f"{', '.join(self.input_names) or 'none'})"))
        if issues:
            raise BindError(issues)
        types: dict[str, TensorType] = {}
        for name, t in self.inputs:
            types[name] = TensorType(t.dtype, tuple(int(s) for s in shapes[name]))
        ctx = InferCtx(self.symbols, env)
        for node in self.nodes:
            operands = [types[x] if isinstance(x, str) else x for x in node.inputs]
            try:
                outs = node.op.infer(ctx, operands, node.attrs)
            except OpError as e:
                raise BindError([Issue(("ops", node.index) + e.where, e.msg)]) from None
            for n, t in zip(node.outputs, outs):
                types[n] = t
        for k, o in enumerate(self.outputs):  # sizes unknown at validation are checked now
            if o.alias_of is not None and types[o.name].shape != types[o.alias_of].shape:
                raise BindError([Issue(("outputs", k, "alias_of"), f"output '{o.name}' has shape "
                                       f"{list(types[o.name].shape)} but input '{o.alias_of}' has "
                                       f"{list(types[o.alias_of].shape)}; an in-place update needs the same shape")])
        bound = Bound(env, types)
        if len(self._bound) >= MAX_BOUND:
            self._bound.clear()  # (dict operations only: threads may bind one fusion at once)
        self._bound[key] = bound
        return bound

    def bound_for(self, shapes: dict, dtypes: dict | None = None) -> Bound | None:
        """What `bind` returned before for these inputs, or None (it never binds)."""
        return self._bound.get(_bind_key(shapes, dtypes))


def canonical_dict(spec: GraphSpec) -> dict:
    """The graph as JSON values; NaN and infinite literals as their strings (schema.py), so the
    content id tells -inf, +inf and NaN apart."""
    return json.loads(spec.model_dump_json(exclude_none=True))


def content_id(spec: GraphSpec) -> str:
    text = json.dumps(canonical_dict(spec), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:20]


class _Validator:
    def __init__(self, spec: GraphSpec, limits: Limits):
        self.spec, self.limits = spec, limits
        self.issues: list[Issue] = []
        self.types: dict[str, TensorType] = {}
        self.defined_at: dict[str, tuple] = {}  # name -> loc of its definition
        self.later: dict[str, int] = {}  # name -> op index that defines it (for use-before-def messages)
        self.broken: set[str] = set()  # inputs whose declaration failed (already reported)

    def err(self, loc, msg):
        self.issues.append(Issue(tuple(loc), msg))

    def run(self) -> Fusion:
        spec, lim = self.spec, self.limits
        if len(spec.ops) > lim.max_ops:
            self.err(("ops",), f"{len(spec.ops)} ops exceed the limit of {lim.max_ops}")
            raise GraphError(self.issues)
        if len(spec.inputs) > lim.max_inputs:
            self.err(("inputs",), f"{len(spec.inputs)} inputs exceed the limit of {lim.max_inputs}")
        symbols: set[str] = set()
        inputs = []
        from .shapes import symbol

        for i, inp in enumerate(spec.inputs):
            loc = ("inputs", i)
            if inp.name in self.defined_at:
                self.err(loc + ("name",), f"tensor '{inp.name}' is defined twice (first at "
                                          f"{_fmt(self.defined_at[inp.name])})")
                continue
            if len(inp.shape) > lim.max_rank:
                self.err(loc + ("shape",), f"rank {len(inp.shape)} exceeds the limit of {lim.max_rank}")
                self.broken.add(inp.name)
                continue
            dims = []
            ok = True
            for k, d in enumerate(inp.shape):
                if isinstance(d, bool) or (isinstance(d, int) and d < 0):
                    self.err(loc + ("shape", k), f"size {d!r} is not a non-negative integer or a symbol name")
                    ok = False
                elif isinstance(d, str):
                    if not is_identifier(d):
                        self.err(loc + ("shape", k), f"symbolic size '{d}' must be a name like 'T' "
                                                     "(expressions are allowed in op attributes only)")
                        ok = False
                    else:
                        symbols.add(d)
                        dims.append(symbol(d))
                else:
                    dims.append(d)
            if not ok:
                self.broken.add(inp.name)
                continue
            t = TensorType(inp.dtype, tuple(dims))
            self.types[inp.name] = t
            self.defined_at[inp.name] = loc
            inputs.append((inp.name, t))

        for i, o in enumerate(spec.ops):
            for name in o.outs():
                self.later.setdefault(name, i)

        ctx = InferCtx(frozenset(symbols))
        nodes = []
        for i, o in enumerate(spec.ops):
            nodes += self.check_op(i, o, ctx)

        outputs = self.check_outputs()
        if self.issues:
            raise GraphError(self.issues)
        f = Fusion(spec=spec, inputs=inputs, nodes=nodes, outputs=outputs, types=self.types,
                   symbols=frozenset(symbols), id=content_id(spec))
        for pos, n in enumerate(nodes):
            for name in n.outputs:
                f.producer[name] = pos
            for k, x in enumerate(n.inputs):
                if isinstance(x, str):
                    f.uses.setdefault(x, []).append((pos, k))
        return f

    def check_op(self, i: int, o, ctx: InferCtx) -> list[Node]:
        """The op's nodes (one, or a composite op's primitive nodes); [] when it is invalid."""
        loc = ("ops", i)
        op = REGISTRY.get(o.op)
        if op is None:
            self.err(loc + ("op",), f"unknown op '{o.op}'{did_you_mean(o.op, REGISTRY.keys())}")
            return []
        try:
            text = json.dumps(o.attrs(), allow_nan=True)
        except (TypeError, ValueError) as e:
            self.err(loc, f"attributes must be JSON values ({e})")
            return []
        try:
            # strict, as JSON: "1" is not a dim, 1 is not a bool, true is not an int
            attrs = op.attrs.model_validate_json(text, strict=True)
        except pydantic.ValidationError as e:
            names = list(op.attrs.model_fields)
            for iss in pydantic_issues(e, loc, fields=lambda _: names + list(OpSpec.model_fields),
                                       synonyms=op.attrs.synonyms):
                msg = iss.msg
                if msg.startswith("unknown field"):
                    allowed = ", ".join(names) or "none"
                    msg = (f"unknown attribute for op '{op.name}' (its attributes: {allowed})"
                           + msg.removeprefix("unknown field"))
                self.issues.append(Issue(iss.loc, msg))
            return []
        lo, hi = op.arity()
        n = len(o.inputs)
        if n < lo or (hi is not None and n > hi):
            want = f"{lo}" if hi == lo else (f"at least {lo}" if hi is None else f"{lo} to {hi}")
            noun = "input" if want.endswith(" 1") or want == "1" else "inputs"
            self.err(loc + ("inputs",), f"op '{op.name}' takes {want} {noun} ({', '.join(op.operands)}), got {n}")
            return []
        operands = []
        ok = True
        for k, x in enumerate(o.inputs):
            if isinstance(x, str):
                t = self.types.get(x)
                if t is None:
                    if x in self.later and self.later[x] >= i:
                        self.err(loc + ("inputs", k), f"tensor '{x}' is used before it is defined "
                                                      f"(by ops[{self.later[x]}])")
                    elif x in self.later or x in self.broken:
                        ok = False  # its producer or declaration failed validation; already reported
                        continue
                    else:
                        self.err(loc + ("inputs", k), f"unknown tensor '{x}'")
                    ok = False
                    continue
                operands.append(t)
            else:
                if isinstance(x, int) and not isinstance(x, bool) and not -2**63 <= x < 2**63:
                    self.err(loc + ("inputs", k), f"integer literal {x} does not fit in int64")
                    ok = False
                    continue
                if k not in op.literal_ok and not (op.variadic and False):
                    self.err(loc + ("inputs", k), f"op '{op.name}' needs a tensor here, not the number {x!r}")
                    ok = False
                    continue
                operands.append(Scalar(x))
        outs = o.outs()
        if len(outs) != op.n_outputs:
            self.err(loc + ("out",), f"op '{op.name}' has {op.n_outputs} result(s); name "
                                     f"{'one' if op.n_outputs == 1 else op.n_outputs} in 'out'")
            ok = False
        for k, name in enumerate(outs):
            if name in self.defined_at:
                where = loc + (("out",) if isinstance(o.out, str) else ("out", k))
                self.err(where, f"tensor '{name}' is already defined (at {_fmt(self.defined_at[name])})")
                ok = False
        if not ok:
            return []
        try:
            types = op.infer(ctx, operands, attrs)
        except OpError as e:
            self.err(loc + e.where, e.msg)
            return []
        for name, t in zip(outs, types):
            if t.rank > self.limits.max_rank:
                self.err(loc, f"result '{name}' has rank {t.rank}, over the limit of {self.limits.max_rank}")
                return []
        lits = tuple(Scalar(x) if not isinstance(x, str) else x for x in o.inputs)
        if op.decompose is not None:
            e = Expansion(tuple(outs))
            if op.decompose(e, tuple(o.inputs), operands, attrs) is not False:
                return self.expand(i, e, types, ctx)
        for name, t in zip(outs, types):
            self.types[name] = t
            self.defined_at[name] = loc
        return [Node(index=i, op=op, inputs=lits, attrs=attrs, outputs=tuple(outs))]

    def expand(self, i: int, e: Expansion, types: list, ctx: InferCtx) -> list[Node]:
        """A composite op's primitive nodes, validated as the graph's ops are, at the composite's
        position (so run-time errors name it); they must make what the composite's rule says."""
        before = len(self.issues)
        nodes = [n for o in e.ops for n in self.check_op(i, OpSpec.model_construct(**o), ctx)]
        if len(self.issues) == before:
            for name, t in zip(e.outs, types):
                got = self.types[name]
                if got.dtype is not t.dtype or len(got.shape) != t.rank or any(
                        dims_equal(a, b) is False for a, b in zip(got.shape, t.shape)):
                    raise AssertionError(f"ops[{i}]: the expansion of {nodes[-1].op.name} makes {got}, "
                                         f"its rule says {t}")
        return nodes

    def check_outputs(self) -> list[Output]:
        outs = []
        seen: dict[str, int] = {}
        aliased: dict[str, int] = {}
        input_names = {i.name for i in self.spec.inputs}
        specs: list[OutputSpec] = self.spec.output_specs()
        if not specs:
            self.err(("outputs",), "a graph needs at least one output")
        for k, o in enumerate(specs):
            loc = ("outputs", k)
            if o.name in seen:
                self.err(loc, f"output '{o.name}' is listed twice (also outputs[{seen[o.name]}])")
                continue
            seen[o.name] = k
            if o.name not in self.types:
                if o.name not in self.later and o.name not in self.broken:
                    self.err(loc + ("name",), f"unknown tensor '{o.name}'")
                continue
            if o.alias_of is not None:
                a = o.alias_of
                if a == o.name:
                    self.err(loc + ("alias_of",), f"output '{o.name}' cannot alias itself")
                    continue
                if a not in input_names:
                    self.err(loc + ("alias_of",), f"'{a}' is not a graph input; alias_of names the input "
                                                  "this output updates in place")
                    continue
                if a in aliased:
                    self.err(loc + ("alias_of",), f"input '{a}' is already updated in place by "
                                                  f"outputs[{aliased[a]}]")
                    continue
                if o.name in input_names:
                    self.err(loc + ("alias_of",), f"output '{o.name}' is itself a graph input; aliasing it to "
                                                  f"'{a}' would make a cycle of in-place updates")
                    continue
                ti, to = self.types.get(a), self.types[o.name]
                if ti is not None and (ti.dtype is not to.dtype or len(ti.shape) != len(to.shape) or any(
                        dims_equal(p, q) is False for p, q in zip(ti.shape, to.shape))):
                    self.err(loc + ("alias_of",), f"output '{o.name}' is {to} but input '{a}' is {ti}; an "
                                                  "in-place update needs the same dtype and shape")
                    continue
                aliased[a] = k
            outs.append(Output(o.name, o.alias_of))
        # An input updated in place may not also be returned as itself (it would change under the caller).
        for o in outs:
            if o.alias_of is None and o.name in aliased:
                self.err(("outputs", seen[o.name]), f"input '{o.name}' is returned and also updated in place by "
                                                    f"outputs[{aliased[o.name]}]: a cycle through aliases")
        return outs


def _fmt(loc) -> str:
    from .errors import format_loc

    return format_loc(loc)


_ = _ops
