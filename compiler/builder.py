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

Code written for nvFuser's frontend runs with its import changed
(`from segfuse.compiler import FusionDefinition, DataType`):

    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Int)
        t1 = fd.ops.cumsum(fd.ops.sum(t0, dims=[0], dtype=DataType.Int), 0)
        fd.add_output(t1)
    (out,) = fd.execute([torch_tensor])      # a list in, a list out, torch tensors when given them

- `define_tensor(shape=..., contiguity=..., dtype=..., stride_order=..., is_cpu=...)`: unnamed
  inputs are named input_0, input_1, ...; each -1 in a shape is a fresh size symbol
  (`<input>_size<k>`), a 1 a broadcast dim. Contiguity and stride order are accepted and checked
  against the rank, and change nothing: a segfuse graph has no layout, and a run reads its inputs
  with whatever strides they have. `from_pytorch(t)` defines an input like `t`.
- `define_scalar(value, dtype)` is the number itself (a literal, converted to dtype's kind);
  `define_scalar(dtype=...)` with no value is a 0-d tensor input, given as a number to execute
  (it promotes as a 0-d tensor does in PyTorch).
- `DataType` (compiler/builder_dtypes.py) is taken wherever a dtype is; complex, 8- and 4-bit
  floats are refused there. nvFuser's argument orders and names of ops bind as
  compiler/builder_forms.py says (`fd.ops.gather(x, index, dim)`, `fd.ops.max`,
  `fd.ops.index_put_accumulate`), as do `fd.ops.shape`, `fd.ops.size`, `fd.ops.broadcast` and
  nvFuser's `fd.ops.slice(x, start_indices, end_indices, strides)`.
- `add_output(t, alias_input)` updates `alias_input` in place and, as in nvFuser, leaves `t` out
  of execute's list; `add_output(t, stride_order=...)` takes only the row-major order.
- `execute([...])` takes the inputs in definition order and returns the outputs in order
  (compiler/builder_io.py); `execute({name: array})` returns a dict, as it always did.
- A subclass may define its graph in `definition(self)`, which runs on first use.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .builder_dtypes import DataType, dtype_name
from .builder_forms import bind_call, nvfuser_names, signature
from .dtypes import DType
from .errors import GraphError
from .ir import Fusion, canonical_dict
from .ops.registry import REGISTRY, OpDef, literals_to_json
from .schema import FORMAT, GraphSpec
from .shapes import parse_size

__all__ = ["DataType", "FusionDefinition", "Tensor", "signature"]


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

    def size(self, dim: int):
        """Dim `dim`'s size as a size attribute takes it: an int, or a size expression (nvFuser's
        `t.size(dim)`)."""
        return size_attr(self.shape[dim])

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


class _Ops:
    """`fd.ops.<name>`: the registry's ops (and nvFuser's names of them, builder_forms.py), and
    nvFuser's shape queries and compositions below."""

    def __init__(self, fd: FusionDefinition):
        self._fd = fd

    def __getattr__(self, name: str):
        if name.startswith("__") or (name not in REGISTRY and name not in nvfuser_names()):
            raise AttributeError(f"no op named '{name}'")
        return lambda *args, **kwargs: self._fd._record(name, args, kwargs)

    def __dir__(self):
        return sorted({*REGISTRY, *nvfuser_names(), "shape", "size", "broadcast"})

    def shape(self, arg: Tensor) -> list:
        """nvFuser's `fd.ops.shape(t)`: t's sizes, as size attributes take them."""
        return [size_attr(d) for d in arg.shape]

    def size(self, arg: Tensor, dim: int):
        return arg.size(dim)

    def broadcast(self, arg: Tensor, is_broadcast_dim: list[bool]) -> Tensor:
        """nvFuser's `broadcast`: a size-1 dim inserted at each True of `is_broadcast_dim`."""
        sizes = iter(self.shape(arg))
        shape = [1 if b else next(sizes, None) for b in is_broadcast_dim]
        if None in shape or next(sizes, None) is not None:
            raise ValueError(f"broadcast(): is_broadcast_dim has {is_broadcast_dim.count(False)} False entries for a "
                             f"tensor of rank {len(arg.shape)}")
        return self.broadcast_in_dim(arg, shape, [k for k, b in enumerate(is_broadcast_dim) if not b])

    def slice(self, arg, *args, **kwargs):
        """PyTorch's `slice(x, dim, start, end, step)`, or nvFuser's `slice(x, start_indices,
        end_indices, strides=None)`: one slice per dim it changes."""
        first = args[0] if args else kwargs.get("start_indices")
        if not isinstance(first, (list, tuple)):
            return self._fd._record("slice", (arg, *args), kwargs)
        params = ("start_indices", "end_indices", "strides", "manual_normalization")
        bound = dict(zip(params, args), **kwargs)
        if set(bound) - set(params) or len(args) > len(params):
            raise TypeError(f"slice() takes {', '.join(('arg',) + params)}")
        starts, ends = list(bound["start_indices"]), list(bound.get("end_indices") or [])
        steps = list(bound.get("strides") or [1] * len(starts))
        if not len(starts) == len(ends) == len(steps) == len(arg.shape):
            raise ValueError(f"slice(): start_indices, end_indices and strides need {len(arg.shape)} entries each")
        out = arg
        for d, (start, end, step) in enumerate(zip(starts, ends, steps)):
            if (start, step) != (0, 1) or str(end) != str(arg.shape[d]):  # (the whole dim: no slice)
                out = self._fd._record("slice", (out, d, start, end, step), {})
        return out


def size_attr(d):
    """A dim as a size attribute takes it: an int, or the text of its size expression."""
    if isinstance(d, int) or getattr(d, "is_Integer", False):
        return int(d)
    text = str(d)
    try:
        if parse_size(text) == d:
            return text
    except ValueError:
        pass
    raise ValueError(f"the size {d} cannot be written as a size expression (names, integers, + - * //)")


class FusionDefinition:
    def __init__(self, name: str = "fusion"):
        self.name = name
        self._inputs: list[dict] = []
        self._ops: list[dict] = []
        self._outputs: list[Any] = []
        self._hidden: set[str] = set()  # outputs execute's list leaves out (nvFuser's alias_input)
        self._counter = 0
        self._fusion: Fusion | None = None
        self._defined = False  # a subclass's definition() has run
        self.ops = _Ops(self)

    def __enter__(self) -> FusionDefinition:
        return self

    def __exit__(self, *exc) -> None:
        if exc[0] is None:
            self.fusion()  # validate the finished graph

    # ---- definition --------------------------------------------------------------------
    def define_tensor(self, name: str | None = None, shape=None, dtype=None, is_cpu: bool = False, stride_order=None,
                      *, contiguity=None, sizes=None, strides=None, static_sizes: bool = False) -> Tensor:
        """An input: `define_tensor("x", ["T", 4], "float32")`, or nvFuser's forms
        `define_tensor(shape, contiguity, dtype, is_cpu, stride_order)` (each -1 a fresh size symbol)
        and `define_tensor(sizes=, strides=, dtype=, static_sizes=)`."""
        if name is not None and not isinstance(name, str):  # nvFuser's positional (shape, contiguity, ...)
            if contiguity is not None:
                raise TypeError("define_tensor() got contiguity twice")
            name, shape, contiguity = None, name, shape
        if sizes is not None:
            if shape is not None:
                raise TypeError("define_tensor() takes shape or sizes, not both")
            if strides is not None and len(strides) != len(sizes):
                raise ValueError(f"define_tensor(): {len(sizes)} sizes but {len(strides)} strides")
            shape = list(sizes) if static_sizes else [1 if d == 1 else -1 for d in sizes]
        if shape is None:
            raise TypeError("define_tensor() needs a shape")
        shape = list(shape)
        _check_layout(shape, contiguity, stride_order, is_cpu)
        name = name if name is not None else self._fresh_input()
        shape = [self._fresh_symbol(name, k) if _is_minus_one(d) else d for k, d in enumerate(shape)]
        dt = dtype_name(dtype if dtype is not None else DType.float32)
        self._inputs.append({"name": name, "dtype": dt, "shape": shape})
        try:
            self._check_partial()
        except GraphError:
            self._inputs.pop()  # the definition stays usable after a mistake
            raise
        return Tensor(self, name)

    def from_pytorch(self, tensor, static_sizes: bool = False) -> Tensor:
        """An input shaped like `tensor` (nvFuser's): its dtype; its sizes when `static_sizes`, else
        a fresh size symbol for each dim but those of size 1."""
        return self.define_tensor(sizes=list(tensor.shape), dtype=tensor.dtype, static_sizes=static_sizes)

    def define_scalar(self, value=None, dtype=None):
        """nvFuser's scalars. With a value: the number itself (a literal wherever an op takes one),
        converted to `dtype`'s kind. With no value: an input, a 0-d tensor of `dtype` (nvFuser's
        default Double), given to `execute` as a number."""
        if value is None:
            return self.define_tensor(shape=[], dtype=dtype_name(dtype) or DType.float64)
        if isinstance(value, complex):
            raise TypeError("define_scalar(): segfuse does not compute in complex numbers")
        name = dtype_name(dtype)
        if name is None:
            return value
        dt = DType(name)
        return bool(value) if dt.is_bool else (int(value) if dt.is_int else float(value))

    def define_vector(self, values, dtype=None) -> list:
        """nvFuser's vector of sizes: the list itself (segfuse has no vector inputs)."""
        if not isinstance(values, (list, tuple)):
            raise TypeError("define_vector(): segfuse has no vector inputs; give the sizes as a list of ints, "
                            "size symbols or fd.ops.size(t, dim)")
        return list(values)

    def add_output(self, t: Tensor, name: str | None = None, alias_of: Tensor | str | None = None, *,
                   alias_input: Tensor | None = None, stride_order=None) -> None:
        """Declare `t` an output (renamed to `name` if given); checked at once, like every call.
        nvFuser's `add_output(t, alias_input)` updates alias_input in place with t and leaves t out
        of execute's list; `add_output(t, stride_order)` takes only the row-major order."""
        if isinstance(name, Tensor):
            name, alias_input = None, name
        elif isinstance(name, (list, tuple)):
            name, stride_order = None, name
        if stride_order and list(stride_order) != list(range(len(t.shape)))[::-1]:
            raise ValueError(f"add_output(): stride_order {list(stride_order)} is not supported: segfuse's outputs are "
                             "row-major (stride_order [rank-1, ..., 0]); permute the result instead")
        if alias_input is not None:
            if alias_of is not None:
                raise TypeError("add_output() takes alias_of or alias_input, not both")
            alias_of = alias_input
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
        if alias_input is not None:
            self._hidden.add(t.name)

    def _fresh(self) -> str:
        while True:
            n = f"t{self._counter}"
            self._counter += 1
            if self._unused(n):
                return n

    def _fresh_input(self) -> str:
        k = len(self._inputs)
        while not self._unused(f"input_{k}"):
            k += 1
        return f"input_{k}"

    def _fresh_symbol(self, name: str, k: int) -> str:
        """A size symbol no input uses yet, named after the input and the dim."""
        base = re.sub(r"\W", "_", name)[:48] + f"_size{k}"
        used = {d for i in self._inputs for d in i["shape"] if isinstance(d, str)}
        sym, n = base, 0
        while sym in used:
            n += 1
            sym = f"{base}_{n}"
        return sym

    def _unused(self, n: str) -> bool:
        return all(n != i["name"] for i in self._inputs) and all(n not in _outs(o) for o in self._ops)

    def _rename(self, old: str, new: str) -> None:
        for o in self._ops:
            o["out"] = [new if x == old else x for x in o["out"]] if isinstance(o["out"], list) else (
                new if o["out"] == old else o["out"])
            o["inputs"] = [new if x == old else x for x in o["inputs"]]
        self._outputs = [new if x == old else ({**x, "name": new} if isinstance(x, dict) and x["name"] == old else x)
                         for x in self._outputs]
        self._hidden = {new if x == old else x for x in self._hidden}

    def _record(self, name: str, args, kwargs):
        call = bind_call(name, args, kwargs, lambda v: isinstance(v, Tensor))
        op, bound = call.op, call.values
        for operand, (shape_of, dtype_of) in (call.form or {}).get("expand_scalar", {}).items():
            bound[operand] = self._expand_scalar(bound.get(operand), bound.get(shape_of), bound.get(dtype_of))
        operands: list[Any] = []
        for p in op.operands:
            if p in bound:
                v = bound.pop(p)
                if op.variadic:
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
        attrs = {k: _attr_value(v) for k, v in bound.items() if v is not None or k in ("start", "end")}
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

    def _expand_scalar(self, value, like, dtype_of):
        """nvFuser's scalar operand given as a 0-d tensor: `like`'s shape, `dtype_of`'s dtype."""
        if not isinstance(value, Tensor) or value.shape != () or not isinstance(like, Tensor):
            return value
        if isinstance(dtype_of, Tensor) and dtype_of.dtype is not value.dtype:
            value = self.ops.cast(value, dtype_of.dtype)
        return self.ops.expand(value, self.ops.shape(like))

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
        if not self._defined and not (self._inputs or self._ops) and callable(getattr(self, "definition", None)):
            self._defined = True  # nvFuser's subclass habit: the graph is defined on first use
            self.definition()
        if self._fusion is None:
            self._fusion = Fusion.from_json(self.to_dict())
        return self._fusion

    def execute(self, inputs, backend: str | None = None, *, device=None):
        """Run the graph. `inputs` a dict {name: array} -> a dict {name: array} on `backend`
        (default "numpy"); or a list in definition order -> a list of the outputs in order,
        torch tensors when given torch tensors (CUDA ones run on the CUDA backend): see
        compiler/builder_io.py."""
        from .engine import Engine

        fusion = self.fusion()
        if isinstance(inputs, dict):
            return Engine.default(backend or "numpy").run(fusion, inputs).outputs
        from .builder_io import run_positional

        names = [o["name"] if isinstance(o, dict) else o for o in self._outputs]
        return run_positional(fusion, [(n, t.dtype) for n, t in fusion.inputs], list(inputs),
                              [n for n in names if n not in self._hidden], backend, device)

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


def _is_minus_one(d) -> bool:
    return isinstance(d, int) and not isinstance(d, bool) and d == -1


def _attr_value(v):
    """An attribute as the graph writes it: dtypes by name, enums by value."""
    if isinstance(v, (DataType, DType)) or type(v).__module__ == "torch":
        return dtype_name(v)
    if hasattr(v, "value") and not isinstance(v, (bool, int, float)):
        return str(v)
    return v


def _check_layout(shape: list, contiguity, stride_order, is_cpu: bool) -> None:
    """nvFuser's layout arguments, checked against the rank. They change nothing: a segfuse graph
    has no layout, and a run reads its inputs with whatever strides they have."""
    rank = len(shape)
    if isinstance(contiguity, (list, tuple)) and len(contiguity) != rank:
        raise ValueError(f"define_tensor(): contiguity has {len(contiguity)} entries for a tensor of rank {rank}")
    if stride_order and sorted(stride_order) != list(range(rank)):
        raise ValueError(f"define_tensor(): stride_order {list(stride_order)} is not a permutation of 0..{rank - 1}")
    if is_cpu and rank:
        raise ValueError("define_tensor(): is_cpu is for 0-d (scalar) tensors, as in nvFuser")
