"""Every registered op is complete (issue 14, item 4). The registry is the one op table, so an op
needs nothing outside its entry: its `lowering` names a renderer of the code generator (or it has a
library routine), it has a NumPy reference, and the test corpus exercises both (so the kernel
digests, the offline compile test and the GPU tests cover it)."""

from __future__ import annotations

import functools

import pytest
from segfuse.compiler.codegen.corpus import all_cases, case_inputs, modules_for
from segfuse.compiler.codegen.lazy import Unsupported
from segfuse.compiler.codegen.segment import SegmentCodegen
from segfuse.compiler.ir import Fusion
from segfuse.compiler.numpy_backend import run_graph
from segfuse.compiler.ops import REGISTRY
from segfuse.compiler.ops.registry import LAZY_KINDS, Lowering


def test_every_op_has_a_cuda_renderer_or_a_library_routine():
    rendered = SegmentCodegen.lowerings()
    missing = sorted(n for n, op in REGISTRY.items() if op.lowering not in rendered and not op.library)
    assert not missing, f"ops with neither a codegen renderer nor a library routine: {missing}"


def test_every_lowering_has_a_renderer():
    # (a renderer without a Lowering member, or a member no family renders, is a gap in one place)
    assert SegmentCodegen.lowerings() == set(Lowering)


@functools.cache
def _cases_of() -> dict:
    out: dict = {}
    for case in all_cases():
        for o in case[1]["ops"]:
            out.setdefault(o["op"], []).append(case)
    return out


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_op_renders_and_runs_its_reference_in_the_corpus(name):
    cases = _cases_of().get(name)
    assert cases, f"no corpus case (compiler/codegen/corpus.py) uses {name}"
    rendered = ran = False
    for case in cases[:8]:
        f = Fusion.from_json(case[1])
        ins = case_inputs(case)
        outs = run_graph(f, ins)  # every node's reference, its outputs checked against the inferred types
        assert set(outs) == {o.name for o in f.outputs}
        ran = True
        # one segment per anchor (lazy ops are inlined into every segment that reads them)
        mods = modules_for(f, ins, "grid")
        if mods and not any(isinstance(m, Unsupported) for m in mods):
            rendered = rendered or all(m.source and m.launches for m in mods)
    assert ran
    assert rendered or REGISTRY[name].library, f"no corpus case with {name} renders in grid mode"


def test_lazy_ops_render_as_lambdas_and_anchors_materialize():
    """The registry's kinds split ops between the lambda renderers and the anchor families."""
    from segfuse.compiler.codegen.lazy import RENDERERS

    for name, op in REGISTRY.items():
        assert (op.kind in LAZY_KINDS) == (op.lowering in RENDERERS), name
        if op.lowering in (Lowering.reduce, Lowering.argreduce, Lowering.scan):
            assert op.combiner is not None, name
