"""The segmenter's working graph: the fusion's ops as `Step`s, plus private copies of scatter
`self` operands that rule 1 decided on, with the facts the segment rules ask about.

Facts kept here (and nowhere else):
- how each op reads each operand (`access`): not at all, at its own thread's position, or at
  other positions (rule 2/3 only cut segments for the last kind);
- which tensors are pure views of another tensor's storage (`view_base`), so that a scatter's
  in-place write is known to reach every view of its buffer;
- producers and consumers in the working graph.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..limits import charge, memoized
from ..ops.registry import OpKind, TensorType
from ..shapes import dims_equal
from .shapes import numel

# Ops whose results are complete only when their kernel ends (rule 2).
HEAVY = frozenset({OpKind.reduction, OpKind.scan, OpKind.sort, OpKind.scatter})
COPY = "copy"  # the kind of a synthetic private-copy step

NONE, OWN, OTHER = "none", "own", "other"  # how an op reads an operand


@dataclass(eq=False)
class Step:
    """One unit of work: a fusion node, or a private copy of a scatter's `self` (pos None)."""

    key: float  # execution order inside a segment (a copy runs just before its scatter)
    pos: int | None  # position in Fusion.nodes
    node: object | None
    kind: object  # OpKind, or COPY
    operands: list  # tensor name per operand position, None for a number literal
    outputs: list
    library: str = ""  # why it runs as a library call ("" = generated)

    @property
    def heavy(self) -> bool:
        return self.kind in HEAVY

    @property
    def is_scatter(self) -> bool:
        return self.kind is OpKind.scatter

    def tensor_operands(self):
        return [(k, t) for k, t in enumerate(self.operands) if t is not None]

    def label(self) -> str:
        if self.node is None:
            return f"copy '{self.outputs[0]}'"
        return f"{self.node.op.name} '{self.outputs[0]}' (ops[{self.node.index}])"


@memoized(8192)
def _equal(a, b) -> bool:
    return a == b if isinstance(a, int) and isinstance(b, int) else dims_equal(a, b) is True


def same_shape(a: TensorType, b: TensorType) -> bool:
    return len(a.shape) == len(b.shape) and all(_equal(x, y) for x, y in zip(a.shape, b.shape))


def access(step: Step, k: int, types: dict) -> str:
    """How `step` reads operand k: NONE (shape only), OWN (at its own element) or OTHER."""
    kind = step.kind
    if kind == COPY:
        return OWN
    if kind is OpKind.creation:
        return NONE  # full_like reads only the shape
    if kind in HEAVY or kind is OpKind.movement:
        return OTHER
    t_in, t_out = types[step.operands[k]], types[step.outputs[0]]
    if kind is OpKind.gather:
        return OWN if k != 0 and same_shape(t_in, t_out) else OTHER
    if kind is OpKind.view:
        # reshape/squeeze/unsqueeze keep the linear index; expand/broadcast read one element many times
        return OWN if _equal(numel(tuple(t_in.shape)), numel(tuple(t_out.shape))) else OTHER
    return OWN if same_shape(t_in, t_out) else OTHER  # pointwise: broadcasting reads other positions


def _nonunit(shape) -> list:
    return [d for d in shape if d != 1]


@dataclass
class WorkGraph:
    fusion: object
    types: dict  # tensor -> TensorType (class types, plus copies)
    steps: list  # in a topological order (graph order, copies just before their scatter)
    producer: dict = field(default_factory=dict)  # tensor -> Step
    consumers: dict = field(default_factory=dict)  # tensor -> [(Step, operand position)]
    view_base: dict = field(default_factory=dict)  # pure view tensor -> the tensor whose storage it views
    broadcast: set = field(default_factory=set)  # views that read one element many times (stride 0)
    graph_inputs: frozenset = frozenset()
    graph_outputs: frozenset = frozenset()
    copy_of: dict = field(default_factory=dict)  # scatter Step -> its copy Step

    def root(self, t: str) -> str:
        while t in self.view_base:
            t = self.view_base[t]
        return t

    def family(self, root: str) -> list[str]:
        return [t for t in self.types if self.root(t) == root]

    def readers(self, tensors) -> list[tuple[Step, int]]:
        """Steps reading any of `tensors`, except view steps making another member (views are free)."""
        members = set(tensors)
        out = []
        for t in sorted(members, key=self.order_of):
            for s, k in self.consumers.get(t, []):
                if s.kind is OpKind.view and s.outputs[0] in members:
                    continue
                out.append((s, k))
        return out

    def order_of(self, t: str) -> float:
        p = self.producer.get(t)
        return -1.0 if p is None else p.key

    def descendants(self, step: Step) -> set:
        seen, todo = set(), [step]
        while todo:
            s = todo.pop()
            for o in s.outputs:
                for c, _ in self.consumers.get(o, []):
                    if c not in seen:
                        seen.add(c)
                        todo.append(c)
        return seen


def copy_name(fusion_types: dict, scatter_out: str) -> str:
    name = f"{scatter_out}.self"
    while name in fusion_types:
        name += "_"
    return name


def build(fusion, types: dict, copies: set[int], library: dict[int, str]) -> WorkGraph:
    """The working graph; `copies` holds positions of scatters that get a private copy of `self`."""
    charge(len(fusion.nodes) + len(copies))
    types = dict(types)
    steps: list[Step] = []
    copy_of = {}
    for pos, node in enumerate(fusion.nodes):
        operands = [x if isinstance(x, str) else None for x in node.inputs]
        step = Step(key=2.0 * pos, pos=pos, node=node, kind=node.kind, operands=operands,
                    outputs=list(node.outputs), library=library.get(pos, ""))
        if pos in copies:
            src = operands[0]
            dst = copy_name(types, node.outputs[0])
            types[dst] = types[src]
            cp = Step(key=2.0 * pos - 1, pos=None, node=None, kind=COPY, operands=[src], outputs=[dst])
            steps.append(cp)
            step.operands[0] = dst
            copy_of[step] = cp
        steps.append(step)
    g = WorkGraph(fusion=fusion, types=types, steps=steps, copy_of=copy_of,
                  graph_inputs=frozenset(fusion.input_names),
                  graph_outputs=frozenset(o.name for o in fusion.outputs))
    for s in steps:
        for o in s.outputs:
            g.producer[o] = s
        for k, t in s.tensor_operands():
            g.consumers.setdefault(t, []).append((s, k))
    for s in steps:
        if s.kind is not OpKind.view:
            continue
        src, out = s.operands[0], s.outputs[0]
        if access(s, 0, types) == OTHER:
            g.view_base[out] = src  # a stride-0 broadcast of src's storage
            g.broadcast.add(out)
        elif src in g.broadcast and _nonunit(types[src].shape) != _nonunit(types[out].shape):
            continue  # reshaping a broadcast needs a real copy: out owns its storage
        else:
            g.view_base[out] = src
            if src in g.broadcast:
                g.broadcast.add(out)
    return g
