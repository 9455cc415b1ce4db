"""Buffers of a plan: which tensors need device memory, which share it, and for how long.

- A tensor crossing a segment boundary (or a graph input/output) is *materialised*; tensors made
  and consumed inside one segment live in registers or shared memory and get no buffer.
- A pure view of a materialised tensor has no buffer of its own (`Plan.views`).
- A scatter's result and its `self` share one buffer (rule 1's in-place write). When the result is
  a graph output, that buffer is the output buffer, so `self` is initialised straight into it.
- Intermediate buffers are freed after their last use and reused by later tensors whose
  lifetimes do not overlap (strictly later segments, so no kernel reads what it also overwrites).
"""

from __future__ import annotations

from ..limits import charge
from ..plan import Buffer
from .graph import WorkGraph
from .shapes import fmt, nbytes


class _UnionFind:
    def __init__(self):
        self.parent: dict[str, str] = {}

    def find(self, x: str) -> str:
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, a: str, b: str) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def assign(g: WorkGraph, segments: list, where: dict, order_of) -> tuple[list[Buffer], dict, dict, dict]:
    """(buffers, tensor -> buffer id, views, frees) for segments in execution order."""
    n_segs = len(segments)
    materialised = set(g.graph_inputs)
    for s in segments:
        materialised |= set(s.inputs) | set(s.outputs)

    views: dict[str, str] = {}
    for t in sorted(materialised, key=order_of):
        b = g.view_base.get(t)
        while b is not None and b not in materialised:
            b = g.view_base.get(b)
        if b is not None:
            views[t] = b

    def storage(t: str) -> str:
        while t in views:
            t = views[t]
        return t

    uf = _UnionFind()
    for t in materialised:
        if t not in views:
            uf.find(t)
    def write_target(t: str) -> str:
        """The tensor whose storage a write into t reaches (through views)."""
        while t not in materialised and t in g.view_base:
            t = g.view_base[t]
        return storage(t) if t in materialised else t

    for step in g.steps:
        if step.is_scatter:  # the result is written into self's storage (views included)
            uf.union(step.outputs[0], write_target(step.operands[0]))
    groups: dict[str, list[str]] = {}
    for t in list(uf.parent):
        groups.setdefault(uf.find(t), []).append(t)
    groups = {r: sorted(m, key=order_of) for r, m in groups.items() if any(
        x in materialised and x not in views for x in m)}

    made_in = {o: where[s] for s in g.steps for o in s.outputs}
    read_in: dict[str, int] = {}
    for s in g.steps:
        for _, t in s.tensor_operands():
            read_in[t] = max(read_in.get(t, -1), where[s])

    def life(members: list[str]) -> tuple[int, int]:
        fam = set(members) | {v for v in views if storage(v) in members}
        first = min((made_in[t] for t in fam if t in made_in), default=-1)
        last = max([read_in.get(t, -1) for t in fam] + [made_in.get(t, -1) for t in fam])
        return first, last

    def kind(members: list[str]) -> str:
        fam = set(members) | {v for v in views if storage(v) in members}
        if fam & g.graph_inputs:
            return "input"
        if fam & g.graph_outputs:
            return "output"
        return "intermediate"

    ordered = sorted(groups.values(), key=lambda m: ({"input": 0, "output": 1, "intermediate": 2}[kind(m)],
                                                     _input_rank(g, m), _output_rank(g, m, views, storage),
                                                     life(m)[0], order_of(m[0])))
    buffers: list[Buffer] = []
    tensor_buffer: dict[str, int] = {}
    frees: dict[str, list[str]] = {}
    pool: list[tuple[Buffer, int]] = []  # freed intermediate buffers, with the segment that freed them
    for members in ordered:
        charge(len(members) + len(views) + len(pool))  # life() and kind() pass over the views
        k = kind(members)
        size = nbytes(g.types[members[0]])
        first, last = life(members)
        buf = None
        if k == "intermediate":
            for cand, freed_at in pool:
                if freed_at < first and _fits(size, cand.nbytes):
                    buf = cand
                    pool.remove((cand, freed_at))
                    break
        if buf is None:
            buf = Buffer(id=len(buffers), nbytes=fmt(size), tensors=[], kind=k,
                         live=[-1 if k == "input" else first, n_segs - 1 if k != "intermediate" else last])
            buffers.append(buf)
        else:
            buf.live = [buf.live[0], last]
        buf.tensors.extend(members)
        for t in members:
            tensor_buffer[t] = buf.id
        if k == "intermediate":
            frees.setdefault(str(last), []).extend(members)
            pool.append((buf, last))
    return buffers, tensor_buffer, views, frees


def _fits(need, have) -> bool:
    if isinstance(need, int) and isinstance(have, int):
        return need <= have
    return str(need) == str(have)


def _input_rank(g: WorkGraph, members) -> int:
    names = g.fusion.input_names
    return min((names.index(t) for t in members if t in g.graph_inputs), default=len(names))


def _output_rank(g: WorkGraph, members, views, storage) -> int:
    names = [o.name for o in g.fusion.outputs]
    fam = set(members) | {v for v in views if storage(v) in members}
    return min((names.index(t) for t in fam if t in g.graph_outputs), default=len(names))
