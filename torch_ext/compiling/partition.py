"""The rewrite of `torch.compile(backend="segfuse")`: an ATen graph's subgraphs that segfuse supports,
each replaced by one call of its `segfuse.torch` op, and what was taken and left (`CompileStats`).

A node is supported when capture's lowering takes it (`unsupported_reason`), its result is a tensor
and it writes to none of its arguments. torch.fx's `CapabilityBasedPartitioner` grows the largest
subgraphs of supported nodes along data edges; `worth_a_kernel` says which are worth a segfuse op;
capture's `fusion_from_graph` lowers each of those, and `segfuse.torch.fusion` makes its op. A
subgraph's input may be the result of an op left out, of a size PyTorch derives from its symbols
(2*s0): it gets a size symbol of its own (`fresh_symbols`), bound from the tensor at each call. A
small constant tensor (get_attr) joins the subgraph reading it and is written into its graph; a
subgraph reading a larger one is left (the constant is no input of the compiled graph to pass on).
"""

from __future__ import annotations

import inspect
import logging
import operator
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase
from torch.fx.passes.tools_common import stable_topological_sort
from torch.fx.passes.utils.fuser_utils import fuse_as_graphmodule

from ..capturing import CaptureError, fusion_from_graph, unsupported_reason
from ..capturing.constants import small_constant
from ..capturing.lowering import CHECKS, SIZE_OPS, aten_name

log = logging.getLogger("segfuse.torch.compile")

SUBGRAPH_NAME = "compiled_subgraph"  # one name for all: equal subgraphs are one op (the id hashes the name)


# ---- statistics ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Subgraph:
    """One subgraph taken: its segfuse op and the ATen ops it holds, in graph order."""

    op: str  # "segfuse::f_<fusion id>"
    aten_ops: tuple[str, ...]


@dataclass(frozen=True)
class CompileStats:
    """What `take_subgraphs` did to one graph."""

    graph: str  # "forward" or "inference"
    subgraphs: tuple[Subgraph, ...]
    left: tuple[tuple[str, str], ...]  # (ATen op, why segfuse left it) for every op not taken
    rest: str  # who runs the ops left: "inductor" or "eager"

    @property
    def ops_taken(self) -> int:
        return sum(len(s.aten_ops) for s in self.subgraphs)

    @property
    def ops_left(self) -> Counter:
        """ATen op name -> how many of them were left."""
        return Counter(op for op, _ in self.left)

    def summary(self) -> str:
        taken = "; ".join(f"{s.op}: {', '.join(s.aten_ops)}" for s in self.subgraphs)
        left = ", ".join(f"{op} x{n}" if n > 1 else op for op, n in sorted(self.ops_left.items()))
        return (f"{self.graph} graph: {len(self.subgraphs)} subgraphs as segfuse ops ({self.ops_taken} ATen ops"
                f"{': ' + taken if taken else ''}); {sum(self.ops_left.values())} ops left to {self.rest}"
                f"{': ' + left if left else ''}")


# ---- which nodes segfuse takes ------------------------------------------------------------
def _is_op(node: torch.fx.Node) -> bool:
    """A node that computes a tensor (not a placeholder, a getitem, size arithmetic or a check)."""
    return node.op == "call_function" and node.target is not operator.getitem \
        and node.target not in SIZE_OPS and node.target not in CHECKS


def _tensors(val) -> list | None:
    """The tensors of a node's value, or None when it holds anything else."""
    vals = val if isinstance(val, (tuple, list)) else (val,)
    if not vals or not all(isinstance(v, torch.Tensor) for v in vals):
        return None
    return list(vals)


class _Support(OperatorSupportBase):
    """segfuse's support of a node, for the partitioner; remembers why a node was refused. A small
    constant tensor (a get_attr node: `torch.tensor([1.0, 2.0])` in the compiled code) joins the
    subgraph that reads it, which writes it into its graph."""

    def __init__(self, gm: torch.fx.GraphModule):
        self.gm = gm
        self.reasons: dict[torch.fx.Node, str | None] = {}

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        if node.op == "get_attr":
            return small_constant(self.gm, node) is not None
        if node.op != "call_function":
            return False
        if node.target is operator.getitem:
            src = node.args[0]
            return isinstance(src, torch.fx.Node) and self.is_node_supported(submodules, src)
        if node not in self.reasons:
            self.reasons[node] = _reason(node)
        return self.reasons[node] is None


def _reason(node: torch.fx.Node) -> str | None:
    if not _is_op(node):
        return "not an op"
    vals = _tensors(node.meta.get("val"))
    if vals is None:
        return "its result is not a tensor"
    if isinstance(node.target, torch._ops.OpOverload) and node.target._schema.is_mutable:
        return "it writes to its arguments (a functional graph holds such ops only to update inputs)"
    try:
        return unsupported_reason(node)
    except Exception as e:  # (a lowering's bug must not stop the model: the node is left)
        log.warning("segfuse could not tell whether it lowers %s: %s: %s", node.format_node(), type(e).__name__, e)
        return f"segfuse could not lower it: {type(e).__name__}: {e}"


def _views_or_creation(node: torch.fx.Node) -> bool:
    """Whether a node moves no data: a view (its result aliases an argument) or a tensor made from
    sizes alone (no tensor argument, or a `*_like` fill)."""
    t = node.target
    if isinstance(t, torch._ops.OpOverload):
        if any(r.alias_info is not None for r in t._schema.returns):
            return True
        if t.overloadpacket in _LIKE:
            return True
    return not any(isinstance(a.meta.get("val"), torch.Tensor) for a in node.all_input_nodes)


_aten = torch.ops.aten
_LIKE = frozenset({_aten.full_like, _aten.zeros_like, _aten.ones_like, _aten.empty_like})
# elementwise ops Inductor fuses with their neighbours: the pointwise tag, and casts
_CAST = frozenset({_aten._to_copy, _aten.clone})


def _elementwise(node: torch.fx.Node) -> bool:
    t = node.target
    return isinstance(t, torch._ops.OpOverload) and (torch.Tag.pointwise in t.tags or t.overloadpacket in _CAST)


def worth_a_kernel(nodes: Sequence[torch.fx.Node], min_ops: int = 2) -> str | None:
    """Why a supported subgraph is not worth a segfuse op (None: it is). Views and tensors made from
    sizes cost nothing; an elementwise chain is one kernel of Inductor's too; one op alone is the
    kernel Inductor (or ATen) runs anyway, and a segfuse op in its place would stop Inductor fusing it
    with its neighbours. So a subgraph is taken when it holds at least `min_ops` ops that compute,
    one of them not elementwise (a reduction, scan, sort, scatter, gather, normalization ...)."""
    computing = [n for n in nodes if _is_op(n) and not _views_or_creation(n)]
    if len(computing) < min_ops:
        return f"a subgraph of {len(computing)} computing ops (fewer than {min_ops}) gains nothing as a segfuse op"
    if all(_elementwise(n) for n in computing):
        return "an elementwise subgraph is one kernel of Inductor's already"
    return None


def _devices(nodes, inputs) -> set:
    devs = set()
    for n in (*nodes, *inputs):
        for v in _tensors(n.meta.get("val")) or ():
            devs.add(v.device)
    return devs


# ---- the rewrite --------------------------------------------------------------------------
# partitions grow along data edges only where torch's partitioner takes the argument; an older one
# may merge independent parts into one subgraph (one segfuse op computing both: still correct)
_DATA_EDGES_ONLY = ({"skip_horizontal_fusion": True}
                    if "skip_horizontal_fusion" in inspect.signature(CapabilityBasedPartitioner.__init__).parameters
                    else {})


def take_subgraphs(gm: torch.fx.GraphModule, *, graph: str = "inference", min_ops: int = 2,
                   rest: str = "inductor") -> CompileStats:
    """Replace, in place, each subgraph of `gm` (an ATen graph with FakeTensor values in
    node.meta["val"]) that segfuse supports and `worth_a_kernel` keeps by one call of its
    segfuse.torch op. Returns what was taken and what was left, and why."""
    from .. import fusion

    support = _Support(gm)
    partitions = CapabilityBasedPartitioner(gm, support, allows_single_node_partition=True,
                                            **_DATA_EDGES_ONLY).propose_partitions()
    order = {n: i for i, n in enumerate(gm.graph.nodes)}
    taken, left_why = [], {}
    for part in sorted(partitions, key=lambda p: min(order[n] for n in p.nodes)):
        nodes = sorted(part.nodes, key=order.__getitem__)
        ops = [n for n in nodes if _is_op(n)]
        why = worth_a_kernel(nodes, min_ops)
        if why is None:
            sub, inputs, outputs = fuse_as_graphmodule(gm, nodes, "SegfuseSubgraph", always_return_tuple=True)
            why = _check_inputs(nodes, inputs)
        if why is None:
            try:
                fd = fusion_from_graph(sub, input_names=[f"in{k}" for k in range(len(_tensor_inputs(inputs)))],
                                       output_names=[f"out{k}" for k in range(len(outputs))], name=SUBGRAPH_NAME,
                                       fresh_symbols=True)
                tf = fusion(fd)
            except CaptureError as e:
                why = f"segfuse could not lower the subgraph: {e}"
            except Exception as e:  # (a lowering's bug must not stop the model: the subgraph is left)
                log.warning("segfuse could not lower a subgraph of %s (%s): %s: %s", graph,
                            ", ".join(n.name for n in ops), type(e).__name__, e)
                why = f"segfuse could not lower the subgraph: {type(e).__name__}: {e}"
        if why is not None:
            for n in ops:
                left_why[n] = why
            continue
        _replace(gm, nodes, _tensor_inputs(inputs), outputs, tf.op)
        taken.append(Subgraph(tf.qualname, tuple(aten_name(n.target) for n in ops)))
        log.debug("%s graph: %s replaces %s", graph, tf.qualname, ", ".join(n.name for n in nodes))
    left = []
    for n in gm.graph.nodes:
        if _is_op(n) and not _is_segfuse(n):
            left.append((aten_name(n.target), left_why.get(n) or support.reasons.get(n) or "not in a subgraph"))
    if taken:
        stable_topological_sort(gm)  # (the calls stand where their last node was)
        gm.graph.lint()
        gm.recompile()
    return CompileStats(graph, tuple(taken), tuple(left), rest)


def _is_segfuse(node: torch.fx.Node) -> bool:
    return isinstance(node.target, torch._ops.OpOverload) and node.target.namespace == "segfuse"


def _tensor_inputs(inputs) -> list:
    return [n for n in inputs if isinstance(n.meta.get("val"), torch.Tensor)]


def _check_inputs(nodes, inputs) -> str | None:
    """Why a subgraph's inputs cannot feed a segfuse op (None: they can)."""
    if not _tensor_inputs(inputs):
        return "the subgraph reads no tensor (it makes tensors from sizes alone: Inductor's to make)"
    if any(n.op == "get_attr" for n in inputs):
        return "the subgraph reads a constant tensor too large to write into its graph (a segfuse op takes tensors " \
            "as inputs, and the constant is no input of the compiled graph)"
    devices = _devices(nodes, inputs)
    if len(devices) > 1:
        return "the subgraph's tensors are on several devices (a segfuse op runs on one)"
    if any(d.type not in ("cpu", "cuda") for d in devices):
        return f"the subgraph's tensors are on {devices.pop()} (segfuse runs CPU and CUDA tensors)"
    return None


def _replace(gm, nodes, inputs, outputs, op) -> None:
    """One call of `op` on `inputs` in place of `nodes`, its results in place of `outputs`."""
    inside = set(nodes)
    g = gm.graph
    with g.inserting_after(nodes[-1]):
        call = g.call_function(op, tuple(inputs))
    vals = [o.meta.get("val") for o in outputs]
    call.meta["val"] = vals[0] if len(outputs) == 1 else tuple(vals)
    results = [call]
    if len(outputs) > 1:
        results = []
        for k, o in enumerate(outputs):
            with g.inserting_after(call if not results else results[-1]):
                r = g.call_function(operator.getitem, (call, k))
            r.meta["val"] = o.meta.get("val")
            results.append(r)
    for o, r in zip(outputs, results):
        o.replace_all_uses_with(r, delete_user_cb=lambda user: user not in inside)
    for n in reversed(nodes):
        g.erase_node(n)


def log_stats(stats: CompileStats) -> None:
    """The INFO record of one graph's rewrite (the stats in its `segfuse_stats` attribute)."""
    log.info("%s", stats.summary(), extra={"segfuse_stats": stats})
