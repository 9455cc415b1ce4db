"""The op registry: the single table that defines every op.

Each `OpDef` holds everything the rest of the pipeline needs to know about one op:
its operands and attributes (a pydantic model, so the JSON Schema is generated from it),
its shape/dtype rule (`infer`), its NumPy reference semantics (`ref`), and typed traits for the
rest of the pipeline: which codegen renderer emits it (`lowering`) with what combine, guard and
rounding rules, its library routine, its Python operators. Validation, the NumPy backend, the
segmenter, codegen and the builder all read this table; none of them keys a table by op name.
Attribute models may add traits as properties (`SortAttrs.descending`, the scatter family's
`reduce` and `include_self`), so one rule covers every op of a family.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Annotated, Any, ClassVar

import ml_dtypes
import numpy as np
from pydantic import AfterValidator, BaseModel, ConfigDict

from ..dtypes import DType
from ..errors import OpError
from ..shapes import fmt_shape, norm, parse_size


class OpKind(str, Enum):
    pointwise = "pointwise"  # elementwise over broadcast operands
    creation = "creation"  # full, full_like, iota: no tensor data read
    view = "view"  # reshape/squeeze/unsqueeze/expand/broadcast_in_dim: no data moves
    movement = "movement"  # permute/slice/pad/cat: each output element reads one input element
    reduction = "reduction"
    scan = "scan"
    sort = "sort"
    gather = "gather"  # reads its data operand at computed positions
    scatter = "scatter"  # writes into its `self` operand's buffer (in place in the kernel)


class Lowering(str, Enum):
    """Which renderer of the code generator emits an op (compiler/codegen keys its renderers by
    this, never by op name). An op without one runs as a library routine or on the host."""

    pointwise = "pointwise"  # the op's `cuda` expression over its converted operands
    fill = "fill"  # full, full_like: the `value` attribute at every position
    iota = "iota"  # start + step * position
    relinearize = "relinearize"  # reshape, squeeze, unsqueeze: the same row-major element order
    expand = "expand"  # size-1 dims read at 0, trailing dims aligned
    broadcast_in_dim = "broadcast_in_dim"  # size-1 dims read at 0, dims placed by broadcast_dims
    permute = "permute"
    slice = "slice"
    select = "select"  # one index along a dim, which goes away
    pad = "pad"
    cat = "cat"
    gather = "gather"
    take_along_axis = "take_along_axis"
    index_select = "index_select"
    reduce = "reduce"  # every element of a row combined with the op's `combiner`
    argreduce = "argreduce"  # the position of a row's first extreme (`combiner` amax or amin)
    scan = "scan"  # inclusive prefix with the op's `combiner`
    # the running extreme (`combiner` amax or amin) and its position: ties and NaN take the later one
    argscan = "argscan"
    sort = "sort"  # (key, index) pairs ordered by `attrs.descending`; outputs keep the first positions
    scatter = "scatter"  # self[.., index[c], ..] (reduce)= src[c] along dim
    index_add = "index_add"  # self[.., index[c_dim], ..] (reduce)= alpha * source[c] (index_add, index_reduce)
    index_put = "index_put"  # self[index[c..]] = values (or +=) on dim 0, negative indices wrap


class Combiner(str, Enum):
    """An associative combine with an identity (the codegen prelude's sf_op_<value>)."""

    add = "add"
    mul = "mul"
    amax = "amax"
    amin = "amin"

    @property
    def selects(self) -> bool:
        """amax and amin return one of their operands, exact in any type; add and mul round."""
        return self is Combiner.amax or self is Combiner.amin

    def is_identity(self, value, is_float: bool) -> bool:
        """Whether `value` (a pad's fill, say) leaves every combine unchanged: 0 for add, 1 for
        mul, -inf (+inf) for a floating-point amax (amin)."""
        if isinstance(value, bool):
            return False
        if self is Combiner.add or self is Combiner.mul:
            return value == (0 if self is Combiner.add else 1)
        return is_float and value == (float("-inf") if self is Combiner.amax else float("inf"))


class LibrarySort(str, Enum):
    """Which library sort a sort op's library segment runs on the GPU (compiler/cuda/library_sorts.py
    keys its routines by this, never by op name); each member names what the routine returns."""

    indices = "indices"  # argsort: the int64 index row only
    values_and_indices = "values_and_indices"  # sort: the sorted values and their indices
    first_k = "first_k"  # topk: values and indices of the first k of the sorted row


class Guard(str, Enum):
    """A check the kernel makes on an integer operand, so a bad value fails the run instead of being
    undefined behaviour on the GPU (the NumPy reference raises the same error)."""

    nonzero = "nonzero"  # an integer divisor
    nonnegative = "nonnegative"  # an integer exponent


# Op kinds whose ops are computed where they are used (lambdas in a kernel), never materialized.
LAZY_KINDS = (OpKind.pointwise, OpKind.creation, OpKind.view, OpKind.movement, OpKind.gather)


# PyTorch's names of dtypes (torch.float, torch.long, ...), for "did you mean" hints.
TORCH_DTYPE_NAMES = {"float": "float32", "half": "float16", "double": "float64", "long": "int64", "int": "int32",
                     "short": "int16", "bfloat": "bfloat16", "char": "int8", "byte": "uint8"}


class Attrs(BaseModel):
    """Base of every op's attribute model: unknown attributes are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    # Per attribute, other names of its values that users try (PyTorch's): a validation error for
    # a value that is not allowed says which value is meant ("sum" -> did you mean "add"?).
    synonyms: ClassVar[dict[str, dict[str, str]]] = {"dtype": TORCH_DTYPE_NAMES}


class NoAttrs(Attrs):
    pass


@dataclass(frozen=True)
class TensorType:
    dtype: DType
    shape: tuple

    @property
    def rank(self) -> int:
        return len(self.shape)

    def __str__(self) -> str:
        return f"{self.dtype}{fmt_shape(self.shape)}"


# Number literals JSON has no number for: NaN and the infinities are written as these strings, as
# tensor data writes them (protobuf's JSON mapping). Graphs read them as floats (`Number` below, and
# OpSpec.inputs) and write them back as strings (`literals_to_json`).
NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


class NonFinite(str, Enum):
    """NaN or an infinity, as a string (JSON has no number for it)."""

    nan = "NaN"
    inf = "Infinity"
    neg_inf = "-Infinity"


def literal_from_json(v):
    """A graph literal as read from JSON: "NaN", "Infinity", "-Infinity" become floats."""
    return NONFINITE[v] if isinstance(v, str) and v in NONFINITE else v


def literal_to_json(v):
    """A number as a graph writes it: a NaN or infinite float as its string."""
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")
    return v


def literals_to_json(doc):
    """`doc` (a graph or any part of one) with every NaN or infinite float written as its string."""
    if isinstance(doc, dict):
        return {k: literals_to_json(v) for k, v in doc.items()}
    if isinstance(doc, (list, tuple)):
        return [literals_to_json(v) for v in doc]
    return literal_to_json(doc)


# A number attribute (a fill value, a pad value, alpha): JSON numbers and the NonFinite strings.
Number = Annotated[bool | int | float | NonFinite, AfterValidator(literal_from_json)]


@dataclass(frozen=True)
class Scalar:
    """A number literal operand; behaves like a Python scalar in PyTorch (weakly typed)."""

    value: bool | int | float

    def __str__(self) -> str:
        return repr(self.value)


Operand = TensorType | Scalar


@dataclass
class InferCtx:
    """What shape rules may consult: the graph's size symbols, and their values once bound."""

    symbols: frozenset = frozenset()
    env: dict | None = None

    def size(self, value, where: tuple):
        """A size attribute (int or expression string) as a dim (int when bound or static)."""
        if isinstance(value, bool):
            raise OpError("a size must be an integer or a size expression, not a bool", where)
        if isinstance(value, int):
            return value
        try:
            d = parse_size(value, set(self.symbols))
        except ValueError as e:
            raise OpError(str(e), where) from None
        if self.env is not None and not isinstance(d, int):
            d = int(d.subs({s: self.env[s.name] for s in d.free_symbols}))
        return norm(d)


@dataclass(frozen=True)
class OpDef:
    name: str
    kind: OpKind
    operands: tuple[str, ...]  # operand names, for docs and messages ("self", "index", "src")
    infer: Callable[[InferCtx, list[Operand], Any], list[TensorType]]
    ref: Callable[[list[Any], Any, list[TensorType]], list[np.ndarray]]
    attrs: type[Attrs] = NoAttrs
    min_operands: int | None = None  # default: len(operands)
    variadic: bool = False  # cat: any number of tensors
    literal_ok: frozenset = frozenset()  # operand positions that accept number literals
    n_outputs: int = 1
    doc: str = ""
    # Operand positions read at computed (not own-thread) positions: gather data, scatter self.
    compute_dtype: Callable[[list[Operand], Any], DType] | None = None
    cuda: Any = None  # a pointwise op's C expression: a function of its operands' C expressions
    extra: dict = field(default_factory=dict)
    # ---- traits the code generator, the segmenter and the builder read (no tables by op name) ----
    lowering: Lowering | None = None  # the codegen renderer; None: library routine or host
    combiner: Combiner | None = None  # reductions, scans (argmax: amax, the extreme it looks for)
    divide_by_count: bool = False  # mean: the combined sum over the number of reduced elements
    guard: tuple[int, Guard] | None = None  # (operand position, check) for integer operands
    raw_operands: frozenset = frozenset()  # operand positions read unconverted (where's condition)
    # operands round to the common dtype before computing in opmath (False: the reference computes
    # in opmath directly)
    round_operands: bool = True
    scalar_opmath: bool = False  # a 0-d or literal second operand is read at opmath precision
    library: str = ""  # what a library segment of the op runs on the GPU (the plan's Segment.routine)
    library_sort: LibrarySort | None = None  # the library sort routine that runs it (sort ops)
    py_operator: tuple[str, ...] = ()  # builder Tensor operators: (method, reflected method)
    # view ops: `view(xp, x, attrs, out_type)` makes the view of array x with array module xp
    # (numpy or cupy) without moving data; the NumPy reference is the same function with numpy,
    # and the CUDA runtime runs a plan's view segments with it (no kernel)
    view: Callable[[Any, Any, Any, TensorType], Any] | None = None
    # A composite op: decompose(expansion, inputs, operand types, attrs) writes the primitive ops it
    # stands for into `expansion` (see Expansion; inputs are tensor names and number literals, as in
    # the graph), or returns False where these attributes need none (scatter with a reduce other
    # than "mean"). The IR expands it when it validates the graph, so the plan, the backends and the
    # codegen see only primitive nodes; `ref` states the op's semantics directly (the oracle its
    # expansion is tested against).
    decompose: Callable[..., bool | None] | None = None

    @property
    def keeps_row_major_order(self) -> bool:
        """A view whose output lists its input's elements in the same row-major order (reshape,
        squeeze, unsqueeze): by definition the ops the `relinearize` renderer emits."""
        return self.lowering is Lowering.relinearize

    def arity(self) -> tuple[int, int | None]:
        lo = len(self.operands) if self.min_operands is None else self.min_operands
        return lo, (None if self.variadic else len(self.operands))


class Expansion:
    """The primitive ops a composite op expands to, in order: `e("amax", x, dims=[1])` adds one and
    returns its result's name; `out=k` makes it the composite's k-th output. Intermediate names
    start with the composite's first output and contain '#', which no user name may."""

    def __init__(self, outs: tuple[str, ...]):
        self.outs, self.ops = tuple(outs), []

    def __call__(self, op: str, *inputs, out: int | None = None, **attrs) -> str:
        name = self.outs[out] if out is not None else f"{self.outs[0]}#{len(self.ops)}.{op}"
        self.ops.append({"op": op, "out": name, "inputs": list(inputs),
                         **{k: v for k, v in attrs.items() if v is not None}})
        return name


REGISTRY: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    if op.name in REGISTRY:
        raise ValueError(f"op {op.name} registered twice")
    REGISTRY[op.name] = op
    return op


def get(name: str) -> OpDef | None:
    return REGISTRY.get(name)


# ---- helpers shared by the rule modules -------------------------------------------------

def tensor(operands: list[Operand], i: int, name: str | None = None) -> TensorType:
    x = operands[i]
    if not isinstance(x, TensorType):
        raise OpError(f"{name or 'operand'} must be a tensor, not the literal {x}", ("inputs", i))
    return x


def norm_dim(dim: int, rank: int, where: tuple = ("dim",), allow_end: bool = False) -> int:
    """Wrap a negative dim like PyTorch; a 0-d tensor accepts dims 0 and -1."""
    r = max(rank, 1) + (1 if allow_end else 0)
    if not -r <= dim < r:
        raise OpError(f"dim {dim} is out of range for a tensor of rank {rank} "
                      f"(expected {-r} to {r - 1})", where)
    return dim % r


def broadcast_shapes(shapes: list[tuple], where_of: Callable[[int], tuple] = lambda i: ()) -> tuple:
    """NumPy/PyTorch broadcasting over possibly symbolic dims."""
    from ..shapes import dims_equal

    rank = max((len(s) for s in shapes), default=0)
    out = []
    for k in range(rank):
        dim = 1
        for i, s in enumerate(shapes):
            j = len(s) - rank + k
            if j < 0:
                continue
            d = s[j]
            if d == 1:
                continue
            if dim == 1:
                dim = d
                continue
            eq = dims_equal(dim, d)
            if eq is False:
                raise OpError(f"shapes {', '.join(fmt_shape(x) for x in shapes)} cannot be broadcast "
                              f"(size {dim} against {d} at dim {k - rank})", where_of(i))
            # unknown (symbolic): assume equal; checked again with bound sizes
        out.append(dim)
    return tuple(norm(d) if not isinstance(d, int) else d for d in out)


def check_scalar(value, dt: DType, where: tuple = ("value",)) -> None:
    """PyTorch's checked conversion of a Python number to `dt` (c10::checked_convert), used for
    fill values and scalar sources: raise where torch says "value cannot be converted to type
    ... without overflow". Floats to integers truncate; integers may wrap into unsigned types
    from -max (two's complement); any number converts to bool."""
    if dt.is_bool:
        return
    if dt.is_float:
        top = float(ml_dtypes.finfo(dt.np).max)
        bad = (isinstance(value, float) and math.isfinite(value) and abs(value) > top) or (
            not isinstance(value, float) and abs(int(value)) > top)
    elif isinstance(value, float):
        info = np.iinfo(dt.np)
        bad = not math.isfinite(value) or not info.min <= value <= info.max
    else:
        info = np.iinfo(dt.np)
        lo = -int(info.max) if info.min == 0 else int(info.min)
        bad = not lo <= int(value) <= info.max
    if bad:
        raise OpError(f"value {value!r} cannot be converted to {dt} without overflow", where)


def scalar_array(value, dt: DType) -> np.ndarray:
    """A number converted to `dt` as PyTorch converts a Scalar (after `check_scalar`), 0-d."""
    if dt.is_bool:
        return np.array(value != 0)
    if not dt.is_float:
        v = math.trunc(value) if isinstance(value, float) else int(value)
        return np.array(v, dtype=np.int64).astype(dt.np)  # negative values wrap into unsigned types
    return np.array(float(value), dtype=np.float64).astype(dt.np)
