"""A minimal reference planner: a second, simpler way to cut a graph into segments, which tests and
benchmarks hand to the CUDA runtime (`CupyRuntime(planner=...)`) to force lowerings the segmenter
would not pick; `split_nodes` also serves the runtime when the codegen refuses a segment.

Small graphs (every tensor at most SMALL elements) become one single-block segment: one kernel
launch for the whole graph (the MoE prologue case). Otherwise every anchor op (reduction, scan,
sort, scatter) gets its own segment with its lazy producers inlined by the codegen, and lazy
graph outputs get pointwise segments. Correct, though it recomputes shared lazy producers.
"""

from __future__ import annotations

import math

from ..ops.registry import LAZY_KINDS
from ..plan import Plan, Segment, SegmentKind, commits_for

SMALL = 8192

_KIND = {"reduction": SegmentKind.reduction, "scan": SegmentKind.scan, "sort": SegmentKind.sort,
         "scatter": SegmentKind.scatter}


def simple_plan(fusion, types: dict, small: int = SMALL) -> Plan:
    graph_outs = [o.name for o in fusion.outputs]
    inputs = set(fusion.input_names)
    n_all = [math.prod(t.shape) for t in types.values()]
    if fusion.nodes and max(n_all, default=0) <= small:
        made = {o for nd in fusion.nodes for o in nd.outputs}
        outs = [o for o in dict.fromkeys(graph_outs) if o in made]
        ins = [n for n in fusion.input_names if any(n in nd.inputs for nd in fusion.nodes)]
        return Plan(fusion.id, "", [Segment(0, SegmentKind.single_block, list(range(len(fusion.nodes))), ins, outs,
                                            "small graph: one block")],
                    commits=commits_for(fusion.outputs, fusion.input_names, {}))
    # anchors and what they materialize
    materialized = set(inputs)
    segs = []
    needed_later: dict[str, set] = {}
    for pos, nd in enumerate(fusion.nodes):
        for x in nd.inputs:
            if isinstance(x, str):
                needed_later.setdefault(x, set()).add(pos)
    for pos, nd in enumerate(fusion.nodes):
        if nd.op.kind in LAZY_KINDS:  # lazy: inlined into its consumers
            continue
        cone = _cone(fusion, pos, materialized)
        ins = sorted({x for p in cone for x in fusion.nodes[p].inputs if isinstance(x, str)
                      and x in materialized}, key=str)
        segs.append(Segment(len(segs), _KIND[nd.op.kind.value], sorted(cone), ins, list(nd.outputs), nd.op.name))
        materialized.update(nd.outputs)
    lazy_outs = [o for o in dict.fromkeys(graph_outs) if o not in materialized]
    for o in lazy_outs:
        pos = next(p for p, nd in enumerate(fusion.nodes) if o in nd.outputs)
        cone = _cone(fusion, pos, materialized)
        ins = sorted({x for p in cone for x in fusion.nodes[p].inputs if isinstance(x, str)
                      and x in materialized}, key=str)
        segs.append(Segment(len(segs), SegmentKind.pointwise, sorted(cone), ins, [o], "output"))
        materialized.add(o)
    return Plan(fusion.id, "", segs, commits=commits_for(fusion.outputs, fusion.input_names, {}))


def _cone(fusion, pos, materialized) -> set:
    producer = {o: p for p, nd in enumerate(fusion.nodes) for o in nd.outputs}
    cone, todo = set(), [pos]
    while todo:
        p = todo.pop()
        if p in cone:
            continue
        cone.add(p)
        for x in fusion.nodes[p].inputs:
            if isinstance(x, str) and x not in materialized and x in producer:
                todo.append(producer[x])
    return cone


def split_nodes(fusion, nodes: list[int], inputs: list[str], outputs: list[str]):
    """Split a segment's nodes into (nodes, inputs, outputs) groups with at most one anchor each
    (anchor outputs become materialized tensors), plus one group for lazily computed outputs."""
    materialized = set(inputs)
    groups = []
    mine = set(nodes)
    for pos in nodes:
        nd = fusion.nodes[pos]
        if nd.op.kind in LAZY_KINDS:  # lazy: inlined into its consumers
            continue
        cone = _cone(fusion, pos, materialized) & mine
        ins = sorted({x for p in cone for x in fusion.nodes[p].inputs if isinstance(x, str) and x in materialized})
        groups.append((sorted(cone), ins, list(nd.outputs)))
        materialized.update(nd.outputs)
    lazy = [o for o in outputs if o not in materialized]
    if lazy:
        cone = set()
        for o in lazy:
            pos = next(p for p in nodes if o in fusion.nodes[p].outputs)
            cone |= _cone(fusion, pos, materialized) & mine
        ins = sorted({x for p in cone for x in fusion.nodes[p].inputs if isinstance(x, str) and x in materialized})
        groups.append((sorted(cone), ins, lazy))
    return groups
