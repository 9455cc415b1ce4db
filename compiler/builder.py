"""`FusionDefinition`: build graphs in Python, in the style of nvFuser's frontend.

    with FusionDefinition("moe_problem_sizes") as fd:
        ids = fd.define_tensor("topk_ids", shape=["T", "K"], dtype="int64")
        flat = fd.ops.reshape(ids, [-1])
        counts = fd.ops.scatter(fd.ops.full([16], 0, "int64"), 0, flat, fd.ops.full_like(flat, 1), reduce="add")
        fd.add_output(counts, "counts")
    fd.execute({"topk_ids": ids_array})

Every op in the registry is available as `fd.ops.<name>`; its positional parameters are the
op's operands and attributes in the order of the matching PyTorch function. Each call is
checked at once, so a mistake raises where it is made.
"""

from __future__ import annotations

import json
from typing import Any

from .errors import GraphError
from .ir import Fusion, canonical_dict
from .ops.registry import REGISTRY, OpDef, literals_to_json
from .schema import FORMAT, GraphSpec


class Tensor:
    """A tensor being defined; Python operators record pointwise ops."""

    __slots__ = ("fd", "name")

    def __init__(self, fd: FusionDefinition, name: str):
        self.fd, self.name = fd, name

    def __repr__(self) -> str:
        t = self.fd._fusion_types().get(self.name)
        return f"Tensor({self.name!r}, {t})"

    @property
    def dtype(self):
        return self.fd._fusion_types()[self.name].dtype

    @property
    def shape(self):
        return self.fd._fusion_types()[self.name].shape

    def _bin(self, op, other, reflected=False):
        a, b = (other, self) if reflected else (self, other)
        return getattr(self.fd.ops, op)(a, b)

    # the arithmetic operators are the registry's (OpDef.py_operator), installed below the class
    __hash__ = object.__hash__


def _operator(op: OpDef, reflected: bool):
    if len(op.operands) == 1:
        return lambda s: getattr(s.fd.ops, op.name)(s)
    return lambda s, o: s._bin(op.name, o, reflected)


for _op in REGISTRY.values():
    for _k, _method in enumerate(_op.py_operator):  # (method, reflected method)
        setattr(Tensor, _method, _operator(_op, _k == 1))


def signature(op: OpDef) -> tuple[str, ...]:
    """Python call order of an op's operands and attributes (PyTorch's argument order)."""
    sig = op.extra.get("signature")
    if sig is not None:
        rest = tuple(a for a in op.attrs.model_fields if a not in sig)
        return tuple(sig) + rest
    return tuple(op.operands) + tuple(op.attrs.model_fields)


class _Ops:
    def __init__(self, fd: FusionDefinition):
        self._fd = fd

    def __getattr__(self, name: str):
        op = REGISTRY.get(name)
        if op is None:
            raise AttributeError(f"no op named '{name}'")
        return lambda *args, **kwargs: self._fd._record(op, args, kwargs)

    def __dir__(self):
        return sorted(REGISTRY)


class FusionDefinition:
    def __init__(self, name: str = "fusion"):
        self.name = name
        self._inputs: list[dict] = []
        self._ops: list[dict] = []
        self._outputs: list[Any] = []
        self._counter = 0
        self._fusion: Fusion | None = None
        self.ops = _Ops(self)

    def __enter__(self) -> FusionDefinition:
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.fusion()  # validate the finished graph

    # ---- definition --------------------------------------------------------------------
    def define_tensor(self, name: str, shape, dtype="float32") -> Tensor:
        self._inputs.append({"name": name, "dtype": str(dtype), "shape": list(shape)})
        try:
            self._check_partial()
        except GraphError:
            self._inputs.pop()  # the definition stays usable after a mistake
            raise
        return Tensor(self, name)

    def add_output(self, t: Tensor, name: str | None = None, alias_of: Tensor | str | None = None) -> None:
        """Declare `t` an output (renamed to `name` if given); checked at once, like every call."""
        old = t.name
        if name is not None and name != t.name:
            if any(i["name"] == t.name for i in self._inputs):
                raise ValueError(f"'{t.name}' is a graph input; outputs cannot rename inputs")
            if any(i["name"] == name for i in self._inputs) or any(name in _outs(o) for o in self._ops):
                raise ValueError(f"'{name}' already names a tensor of this definition")
            self._rename(t.name, name)
            t.name = name
        entry: Any = t.name
        if alias_of is not None:
            entry = {"name": t.name, "alias_of": alias_of.name if isinstance(alias_of, Tensor) else alias_of}
        self._outputs.append(entry)
        self._fusion = None
        try:
            self.fusion()
        except GraphError:
            self._outputs.pop()
            if t.name != old:
                self._rename(t.name, old)
                t.name = old
            self._fusion = None
            raise

    def _fresh(self) -> str:
        while True:
            n = f"t{self._counter}"
            self._counter += 1
            if all(n != i["name"] for i in self._inputs) and all(n not in _outs(o) for o in self._ops):
                return n

    def _rename(self, old: str, new: str) -> None:
        for o in self._ops:
            o["out"] = [new if x == old else x for x in o["out"]] if isinstance(o["out"], list) else (
                new if o["out"] == old else o["out"])
            o["inputs"] = [new if x == old else x for x in o["inputs"]]
        self._outputs = [new if x == old else ({**x, "name": new} if isinstance(x, dict) and x["name"] == old else x)
                         for x in self._outputs]

    def _record(self, op: OpDef, args, kwargs):
        params = signature(op)
        bound: dict[str, Any] = {}
        operands: list[Any] = []
        variadic_first = op.variadic
        if len(args) > len(params):
            raise TypeError(f"{op.name}() takes {len(params)} arguments ({', '.join(params)}), got {len(args)}")
        for p, a in zip(params, args):
            bound[p] = a
        for k, v in kwargs.items():
            if k not in params:
                raise TypeError(f"{op.name}() got an unexpected argument '{k}' (takes {', '.join(params)})")
            bound[k] = v
        for p in op.operands:
            if p in bound:
                v = bound.pop(p)
                if variadic_first:
                    operands.extend(v)
                else:
                    operands.append(v)
        ins = []
        for v in operands:
            if isinstance(v, Tensor):
                ins.append(v.name)
            elif isinstance(v, (bool, int, float)):
                ins.append(v)
            else:
                raise TypeError(f"{op.name}(): operands are Tensors or numbers, got {type(v).__name__}")
        attrs = {k: (str(v) if hasattr(v, "value") and not isinstance(v, (bool, int, float)) else v)
                 for k, v in bound.items() if v is not None or k in ("start", "end")}
        attrs = {k: v for k, v in attrs.items() if v is not None}
        outs = [self._fresh() for _ in range(op.n_outputs)]
        entry = {"op": op.name, "out": outs[0] if op.n_outputs == 1 else outs, "inputs": ins, **attrs}
        self._ops.append(entry)
        try:
            self._check_partial()
        except GraphError:
            self._ops.pop()
            raise
        res = [Tensor(self, n) for n in outs]
        return res[0] if op.n_outputs == 1 else tuple(res)

    # ---- serialization and execution ---------------------------------------------------
    def to_dict(self) -> dict:
        """The graph as JSON values: NaN and infinite literals as "NaN", "Infinity", "-Infinity"."""
        return {"format": FORMAT, "name": self.name, "inputs": self._inputs, "ops": literals_to_json(self._ops),
                "outputs": self._outputs}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_json(cls, data) -> FusionDefinition:
        if isinstance(data, (str, bytes)):
            data = json.loads(data)
        Fusion.from_json(data)  # validate
        fd = cls(data.get("name", "fusion"))
        spec = canonical_dict(GraphSpec.model_validate(data))
        fd._inputs, fd._ops, fd._outputs = spec["inputs"], spec["ops"], spec["outputs"]
        return fd

    def fusion(self) -> Fusion:
        if self._fusion is None:
            self._fusion = Fusion.from_json(self.to_dict())
        return self._fusion

    def execute(self, inputs: dict, backend: str = "numpy") -> dict:
        from .engine import Engine

        return Engine.default(backend).run(self.fusion(), inputs).outputs

    def _fusion_types(self):
        return self._partial().types

    def _partial(self) -> Fusion:
        spec = {"format": FORMAT, "name": self.name, "inputs": self._inputs, "ops": self._ops,
                "outputs": [_outs(self._ops[-1])[0]] if self._ops else [self._inputs[-1]["name"]]
                if self._inputs else []}
        if not spec["outputs"]:
            spec["outputs"] = ["__none__"]
        return Fusion.from_json(spec)

    def _check_partial(self) -> None:
        if self._ops or self._inputs:
            self._partial()
        self._fusion = None


def _outs(o: dict) -> list[str]:
    return o["out"] if isinstance(o["out"], list) else [o["out"]]
