"""Capture a PyTorch function as a segfuse graph: `segfuse.torch.capture(fn, *example_inputs)`.

    def prologue(topk_ids):
        counts = torch.zeros(16, dtype=torch.int64)
        counts.scatter_add_(0, topk_ids.reshape(-1), torch.ones_like(topk_ids.reshape(-1)))
        return counts

    fd = segfuse.torch.capture(prologue, torch.randint(0, 16, (8, 4)), dynamic={"topk_ids": {0: "T"}})
    fd.to_json()    # a graph for Client.register, Engine.run, segfuse.torch.fusion

`fn` is traced with `torch.export` (strict, so the graph's nodes carry the user's file:line), its
ATen graph is decomposed where segfuse lacks an op (ops segfuse has stay whole: softmax, var_mean,
scatter_reduce ...), and each ATen op is lowered to registry ops (lowering.py; the families:
pointwise.py, creation.py, shape.py, index.py, reduce.py, sort_scan.py). Constants fn makes
(`torch.tensor(3.0)`, the value of `x[i] = 2.0`) are written into the graph when small (constants.py).
What segfuse cannot express is refused with a `CaptureError`, never approximated.
"""

from __future__ import annotations

import importlib
import inspect
import re
import warnings
from collections.abc import Callable, Mapping

import torch
from segfuse.compiler.builder import FusionDefinition

from .constants import MAX_CONSTANT_ELEMENTS, too_large
from .errors import CaptureError
from .graph import fusion_from_graph
from .lowering import LowerContext, has_lowering, lowers, unsupported_reason, user_location

__all__ = ["CaptureError", "LowerContext", "capture", "decompositions", "fusion_from_graph", "lowers",
           "unsupported_reason"]

# The op families: importing a module registers its lowerings. A family module that is not there
# (yet) leaves its ops refused, not the package broken.
for _family in ("pointwise", "creation", "shape", "index", "reduce", "sort_scan"):
    try:
        importlib.import_module(f"{__name__}.{_family}")
    except ModuleNotFoundError as _e:
        if _e.name != f"{__name__}.{_family}":
            raise


def decompositions() -> dict:
    """torch.export's default decomposition table without the ops segfuse lowers itself."""
    table = torch.export.default_decompositions()
    for op in list(table.keys()):
        if has_lowering(op):
            table.pop(op)
    return table


def capture(fn: Callable, *example_inputs, name: str | None = None, dynamic=None) -> FusionDefinition:
    """`fn` as a segfuse graph, traced on `example_inputs` (see the module doc).

    Inputs are named after `fn`'s parameters (tensor arguments only; other arguments are constants of
    the trace); outputs after the keys when `fn` returns a dict, else output_0, output_1, ... (a key
    that names an input gets "_out"). An input `fn` updates in place is an output with `alias_of` it:
    the output `fn` returns it as, or, when fn does not return it (or returns it under the input's
    own name), `<input>_updated` after fn's outputs. `dynamic` is torch.export's `dynamic_shapes`
    keyed by parameter name (or a tuple in parameter order), where a dim may also be a string, the
    size symbol's name: {"topk_ids": {0: "T"}}. A dynamic dim without a name is named after its
    parameter and dim ("topk_ids_0")."""
    params = _parameter_names(fn, len(example_inputs))
    specs, names = _dynamic_shapes(dynamic, params, example_inputs)
    with warnings.catch_warnings():
        # torch's own deprecation inside export (pytree's LeafSpec), not the user's to act on
        warnings.filterwarnings("ignore", message=".*LeafSpec", category=FutureWarning)
        ep = _export(fn, example_inputs, specs)
        ep = ep.run_decompositions(decompositions())
    sig = ep.graph_signature
    gm = ep.graph_module
    placeholders = {n.name: n for n in gm.graph.nodes if n.op == "placeholder"}
    user_inputs = list(sig.user_inputs)
    constants = {}  # placeholder -> a small constant fn made (torch.tensor(3.0), x[i] = 2.0's value)
    for spec in sig.input_specs:
        if spec.kind.name == "USER_INPUT":
            continue
        value = ep.constants.get(spec.target) if spec.kind.name == "CONSTANT_TENSOR" else None
        if isinstance(value, torch.Tensor) and not too_large(value):
            constants[spec.arg.name] = value
            continue
        size = f", {value.numel()} elements; segfuse writes up to {MAX_CONSTANT_ELEMENTS} into a graph" \
            if isinstance(value, torch.Tensor) else ""
        raise CaptureError(f"fn reads the tensor {spec.target or spec.arg.name} that is not one of its arguments "
                           f"({spec.kind.name.lower().replace('_', ' ')}{size})", op="constant tensor",
                           location=_first_use(placeholders.get(spec.arg.name)),
                           alternative="pass it as an argument, or make it inside fn with torch.full/"
                                       "torch.arange")
    input_names, symbols = [], {}
    by_placeholder = {}
    for pname, ex, ph in zip(params, example_inputs, user_inputs):
        if isinstance(ex, torch.Tensor):
            input_names.append(pname)
            by_placeholder[ph] = pname
            val = placeholders[ph].meta["val"]
            for dim, sym_name in names.get(pname, {}).items():
                d = val.shape[dim]
                if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol:
                    symbols[d.node.expr.name] = sym_name
    outputs = _outputs(ep, by_placeholder)
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    out_node.args = (tuple(node for node, _, _ in outputs),)  # (ep is this call's own copy)
    try:
        return fusion_from_graph(gm, input_names=input_names, output_names=[n for _, n, _ in outputs],
                                 name=name or _graph_name(fn), symbols=symbols,
                                 alias_of={n: inp for _, n, inp in outputs if inp is not None}, constants=constants)
    except CaptureError as e:
        if e.location is not None:
            raise
        # (an input or an output: where fn is defined)
        raise CaptureError(e.reason, op=e.op, location=_definition(fn), alternative=e.alternative) from None


def _graph_name(fn) -> str:
    """fn's name as a graph name (letters, digits, _ . -; "<lambda>" -> "_lambda_")."""
    n = re.sub(r"[^A-Za-z0-9_.\-]", "_", getattr(fn, "__name__", "") or "captured")
    return n if re.match(r"[A-Za-z_]", n) else f"_{n}"


def _parameter_names(fn, n: int) -> list[str]:
    try:
        ps = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        ps = []
    names = []
    for p in ps:
        if p.kind is inspect.Parameter.VAR_POSITIONAL:
            names += [f"{p.name}_{k}" for k in range(n - len(names))]
            break
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
    if len(names) < n:
        raise TypeError(f"{getattr(fn, '__name__', fn)} takes {len(names)} positional arguments, got {n} "
                        "example inputs")
    return names[:n]


def _dynamic_shapes(dynamic, params, example_inputs):
    """torch.export's dynamic_shapes (a tuple in parameter order) and the size-symbol names asked
    for: {parameter: {dim: name}}."""
    if dynamic is None:
        return None, {}
    if isinstance(dynamic, Mapping):
        unknown = set(dynamic) - set(params)
        if unknown:
            raise TypeError(f"dynamic names {sorted(unknown)}, which are not parameters of fn ({', '.join(params)})")
        per_input = [dynamic.get(p) for p in params]
    else:
        per_input = list(dynamic) + [None] * (len(params) - len(dynamic))
    dims: dict[str, object] = {}  # a name -> its Dim (one name, one symbol)
    specs, names = [], {}
    for p, ex, spec in zip(params, example_inputs, per_input):
        if spec is None or not isinstance(ex, torch.Tensor):
            specs.append(None)
            continue
        items = spec.items() if isinstance(spec, Mapping) else enumerate(spec)
        out = {}
        for dim, d in items:
            dim = dim % max(ex.dim(), 1)
            if isinstance(d, str):
                if not d.isidentifier():
                    raise ValueError(f"dynamic size name {d!r} of {p} is not an identifier")
                names.setdefault(p, {})[dim] = d
                d = dims.setdefault(d, torch.export.Dim(d))
            elif isinstance(d, torch.export.Dim):
                names.setdefault(p, {})[dim] = d.__name__
            if d is not None:
                out[dim] = d
        specs.append(out or None)
    return (tuple(specs),), names


class _Traced(torch.nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def _export(fn, example_inputs, specs):
    # export specializes a dim whose example size is 0 or 1 (marked dynamic or not) unless sizes are
    # reasoned about size-obliviously: a prologue captured from a decode step's T = 1 must serve every T
    from torch.fx.experimental import _config as fx_config

    try:
        with fx_config.patch(backed_size_oblivious=specs is not None):
            return torch.export.export(_Traced(fn), tuple(example_inputs), dynamic_shapes=specs, strict=True)
    except CaptureError:
        raise
    except Exception as e:  # export's own refusal: say what and where, in the user's terms
        text = str(e)
        if "data-dependent" in text or "data dependent" in text or "GuardOnDataDependent" in type(e).__name__:
            what, op = "control flow or a size depends on tensor values, which a fusion cannot branch on", \
                "data-dependent control flow"
            alt = "torch.where(cond, a, b) computes both branches"
        else:
            what, op, alt = f"torch.export could not trace fn: {_export_reason(e)}", "torch.export", None
        raise CaptureError(what, op=op, location=user_location(text) or _traceback_location(e),
                           alternative=alt) from e


def _export_reason(e: BaseException) -> str:
    """The first line of export's error, its listed reasons ("  - ..."), or the Python error fn
    raised under it (an AttributeError in fn's code, say)."""
    chain, x = [], e
    while x is not None and len(chain) < 16:
        chain.append(x)
        x = x.__cause__ or x.__context__
    for x in reversed(chain):
        if type(x).__module__ == "builtins" and str(x):
            return f"{type(x).__name__}: {x}"
    lines = str(e).splitlines() or [type(e).__name__]
    reasons = [ln.strip()[2:] for ln in lines if ln.startswith("  - ")][:3]
    return " ".join([lines[0], *reasons])


def _traceback_location(e: BaseException) -> str | None:
    import traceback

    frames = traceback.extract_tb(e.__traceback__)
    text = "".join(f'File "{f.filename}", line {f.lineno}\n' for f in frames)
    return user_location(text)


def _definition(fn) -> str | None:
    try:
        return f"{inspect.getsourcefile(fn)}:{inspect.getsourcelines(fn)[1]}"
    except (TypeError, OSError):
        return None


def _first_use(node) -> str | None:
    for u in (node.users if node is not None else ()):
        loc = user_location(u.meta.get("stack_trace"))
        if loc:
            return loc
    return None


def _outputs(ep, by_placeholder: dict[str, str]) -> list[tuple[object, str, str | None]]:
    """(fx node, output name, the input it updates or None) per output of the captured graph: fn's
    outputs in order, then the inputs fn updates without returning them."""
    sig = ep.graph_signature
    spec = ep.call_spec.out_spec
    user_count = sum(s.kind.name == "USER_OUTPUT" for s in sig.output_specs)
    if spec is not None and spec.type is dict and len(spec.context) == user_count:
        user_names = [str(k) for k in spec.context]
    else:
        user_names = [f"output_{k}" for k in range(user_count)]
    out_node = next(n for n in ep.graph_module.graph.nodes if n.op == "output")
    flat = list(out_node.args[0])
    mutated = {}  # fx node -> the input it is the new value of
    for s, node in zip(sig.output_specs, flat):
        if s.kind.name == "USER_INPUT_MUTATION":
            mutated[node] = by_placeholder[s.target]
        elif s.kind.name != "USER_OUTPUT":
            raise CaptureError(f"fn's graph has an output of kind {s.kind.name}", op="output")
    inputs = set(by_placeholder.values())
    out, returned = [], set()
    users = [node for s, node in zip(sig.output_specs, flat) if s.kind.name == "USER_OUTPUT"]
    for node, n in zip(users, user_names):
        inp = mutated.get(node) if mutated.get(node) not in returned else None
        if inp is not None:
            returned.add(inp)
        if n in inputs:  # (an output cannot take an input's name)
            n = f"{inp}_updated" if inp is not None else f"{n}_out"
        out.append((node, n, inp))
    for node, inp in mutated.items():
        if inp not in returned:
            out.append((node, f"{inp}_updated", inp))
    return out
