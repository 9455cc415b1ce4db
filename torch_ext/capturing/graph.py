"""An ATen-level FX graph -> a `FusionDefinition`, node by node through the lowerings (lowering.py).

Placeholders holding tensors become the definition's inputs (`define_tensor` with the FakeTensor's
dtype and shape; a symbolic dim becomes a size symbol); placeholders holding sizes (SymInts, as
dynamo passes them) are not inputs: their values come from the tensors' shapes. Small constant
tensors (torch.export's lifted constants, given as `constants`, and `get_attr` nodes) are written into
the graph (constants.py). Size arithmetic (`sym_size`, `operator.mul` on sizes) is read from each
node's value, never lowered. Each lowered result is checked against PyTorch's dtype and shape for the
node.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from segfuse.compiler.builder import FusionDefinition, Tensor
from segfuse.compiler.errors import GraphError

from .constants import constant_tensor, small_constant
from .errors import CaptureError
from .lowering import define_input, lower_node, size_value, user_location
from .sizes import SizeNames


def fusion_from_graph(gm: torch.fx.GraphModule, *, input_names: Sequence[str], output_names: Sequence[str],
                      name: str, symbols: Mapping[str, str] | None = None,
                      alias_of: Mapping[str, str] | None = None,
                      constants: Mapping[str, torch.Tensor] | None = None,
                      fresh_symbols: bool = False) -> FusionDefinition:
    """Lower `gm` (ATen ops, functional; placeholder and node values in `node.meta["val"]`).

    `input_names`: one per placeholder holding a tensor (other than `constants`), in order.
    `output_names`: one per entry of the output node's (flat) tuple, None to leave that entry out.
    `symbols`: PyTorch's size symbols (their names, "s0") -> the graph's size symbols; a symbol not
    listed is named after the first input dim that has it ("x_0"). `alias_of`: output name -> the
    input it updates in place. `constants`: placeholder name -> its value, a real tensor written
    into the graph (constants.py). `fresh_symbols`: an input dim whose size PyTorch derives from its
    symbols (2*s0: the input is a result of ops outside `gm`) gets a size symbol of its own
    (`SizeNames.fresh`) instead of a refusal. Raises CaptureError for what segfuse cannot express."""
    fd = FusionDefinition(name)
    sizes = SizeNames(dict(symbols or {}))
    constants = dict(constants or {})
    tensors = [n for n in gm.graph.nodes if n.op == "placeholder" and n.name not in constants
               and isinstance(n.meta.get("val"), torch.Tensor)]
    if len(tensors) != len(input_names):
        raise ValueError(f"{len(input_names)} input names for {len(tensors)} tensor placeholders")
    env: dict = {}
    origin: dict = {}
    for node, iname in zip(tensors, input_names):  # (dims that are symbols first: they name them)
        for k, d in enumerate(node.meta["val"].shape):
            if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol:
                sizes.name(d.node.expr.name, f"{iname}_{k}")
    for node, iname in zip(tensors, input_names):
        env[node] = define_input(fd, node.meta["val"], iname, sizes, derived_ok=fresh_symbols)
        origin[iname] = node
    out_node = None
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            if node.name in constants:
                env[node] = constant_tensor(fd, constants[node.name], f"constant {node.name}")
            elif node not in env:
                env[node] = size_value(node, sizes)
        elif node.op == "call_function":
            env[node] = lower_node(fd, node, env, sizes, origin)
        elif node.op == "output":
            out_node = node
        elif node.op == "get_attr" and small_constant(gm, node) is not None:
            env[node] = constant_tensor(fd, small_constant(gm, node), f"constant {node.target}")
        else:
            raise CaptureError(f"FX {node.op} nodes are not supported (the function reads a tensor that is "
                               "not one of its arguments)", op=str(node.target),
                               location=user_location(node.meta.get("stack_trace")),
                               alternative="pass the tensor as an argument")
    return _add_outputs(fd, out_node, env, input_names, output_names, dict(alias_of or {}))


def _add_outputs(fd, out_node, env, input_names, output_names, alias_of) -> FusionDefinition:
    flat = out_node.args[0] if out_node is not None else ()
    flat = flat if isinstance(flat, (tuple, list)) else (flat,)
    if len(flat) != len(output_names):
        raise ValueError(f"{len(output_names)} output names for {len(flat)} outputs")
    chosen = []
    used: set[str] = set(input_names)
    for node, oname in zip(flat, output_names):
        if oname is None:  # (an entry the caller leaves out: a mutation that is also returned)
            continue
        t = env.get(node) if isinstance(node, torch.fx.Node) else None
        if not isinstance(t, Tensor):
            raise CaptureError(f"output {oname} is {type(node).__name__ if t is None else type(t).__name__}, "
                               "not a tensor; a fusion returns tensors", op=f"output {oname}")
        if t.name in used:  # an input returned as it is, or a tensor returned twice: a copy of it
            t = fd.ops.cast(t, t.dtype)
        used.add(t.name)
        chosen.append((t.name, oname))
    if _clashes(fd, chosen):
        return _renamed(fd, chosen, alias_of)
    for tname, oname in chosen:
        try:
            fd.add_output(Tensor(fd, tname), oname, alias_of=alias_of.get(oname))
        except (GraphError, ValueError) as e:
            raise CaptureError(str(e), op=f"output {oname}") from None
    return fd


def _results(spec: dict) -> set[str]:
    return {o for op in spec["ops"] for o in (op["out"] if isinstance(op["out"], list) else [op["out"]])}


def _clashes(fd: FusionDefinition, chosen) -> bool:
    """Whether an output name is the name the builder gave another tensor ("t1")."""
    taken = _results(fd.to_dict())
    return any(o in taken and o != t for t, o in chosen)


def _renamed(fd: FusionDefinition, chosen, alias_of) -> FusionDefinition:
    """fd's graph with each output tensor under its output name and the intermediates those names
    were taken by renamed (v0, v1, ...)."""
    spec = fd.to_dict()
    final = dict(chosen)
    names = set(final.values())
    everything = _results(spec) | names | {i["name"] for i in spec["inputs"]}
    rename, k = {}, 0
    for n in sorted(_results(spec)):
        if n in final:
            rename[n] = final[n]
        elif n in names:
            while f"v{k}" in everything:
                k += 1
            rename[n] = f"v{k}"
            everything.add(rename[n])
    for op in spec["ops"]:
        out = op["out"]
        op["out"] = [rename.get(o, o) for o in out] if isinstance(out, list) else rename.get(out, out)
        op["inputs"] = [rename.get(x, x) if isinstance(x, str) else x for x in op["inputs"]]
    spec["outputs"] = [{"name": o, "alias_of": alias_of[o]} if o in alias_of else o for _, o in chosen]
    try:
        return FusionDefinition.from_json(spec)
    except (GraphError, ValueError) as e:
        raise CaptureError(str(e), op="outputs") from None
