"""Every registered op is complete (issue 14, item 4). The registry is the one op table, so an op
needs nothing outside its entry: its `lowering` names a renderer of the code generator (or it has a
library routine), it has a NumPy reference, and the test corpus exercises both (so the kernel
digests, the offline compile test and the GPU tests cover it)."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest
from corpus import all_cases, case_inputs, modules_for
from segfuse.compiler.codegen.lazy import Unsupported
from segfuse.compiler.codegen.segment import SegmentCodegen
from segfuse.compiler.ir import Fusion
from segfuse.compiler.numpy_backend import run_graph
from segfuse.compiler.ops import REGISTRY
from segfuse.compiler.ops.registry import LAZY_KINDS, LibrarySort, Lowering, OpKind


def test_every_op_has_a_cuda_renderer_or_a_library_routine():
    # (a composite op is rendered through its expansion into primitive ops: see the next test)
    rendered = SegmentCodegen.lowerings()
    missing = sorted(n for n, op in REGISTRY.items()
                     if op.lowering not in rendered and not op.library and op.decompose is None)
    assert not missing, f"ops with neither a codegen renderer nor a library routine: {missing}"


def test_composite_ops_expand_to_rendered_primitives_only():
    """A composite op (registry `decompose`) never reaches the plan: the IR expands it into
    primitive nodes at the composite's position, each with a renderer; the corpus expands each."""
    rendered = SegmentCodegen.lowerings()
    composites = {n for n, op in REGISTRY.items() if op.decompose is not None}
    assert composites, "no composite op in the registry"
    expanded = set()
    for case in all_cases():
        spec_ops = case[1]["ops"]
        for nd in Fusion.from_json(case[1]).nodes:
            assert nd.op.lowering in rendered, (case[0], nd.label())
            if nd.op.name != spec_ops[nd.index]["op"]:
                expanded.add(spec_ops[nd.index]["op"])
    assert expanded == composites, f"composites no corpus case expands: {sorted(composites - expanded)}"


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
    assert cases, f"no corpus case (tests/corpus/) uses {name}"
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


def test_every_library_sort_has_a_routine_and_every_library_op_a_library_sort():
    """The GPU runtime keys its library sorts by the registry's `library_sort` trait: each member has a
    routine, and each op whose description promises a library routine names one."""
    from segfuse.compiler.cuda.library_sorts import LIBRARY

    assert set(LIBRARY) == set(LibrarySort)
    described = {n for n, op in REGISTRY.items() if op.library}
    routed = {n for n, op in REGISTRY.items() if op.library_sort is not None}
    assert described == routed == {n for n, op in REGISTRY.items() if op.kind is OpKind.sort}


def _op_name_uses(tree) -> list[int]:
    """Lines where an op's name (`<x>.op.name`, `op.name`, `op_name`) is compared or used as a key."""

    def is_name(e) -> bool:
        return (isinstance(e, ast.Attribute) and e.attr == "name" and (
            (isinstance(e.value, ast.Attribute) and e.value.attr == "op")
            or (isinstance(e.value, ast.Name) and e.value.id == "op"))) or (
            isinstance(e, ast.Name) and e.id == "op_name")

    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare) and any(is_name(e) for e in [node.left, *node.comparators]):
            lines.append(node.lineno)
        elif isinstance(node, ast.Subscript) and is_name(node.slice):
            lines.append(node.lineno)
    return lines


def _name_tables(tree) -> list[int]:
    """Lines of set/dict/tuple/list literals of two or more op names (a table keyed by op name)."""
    lines = []
    for node in ast.walk(tree):
        elts = node.keys if isinstance(node, ast.Dict) else getattr(node, "elts", None) \
            if isinstance(node, (ast.Set, ast.Tuple, ast.List)) else None
        if not elts:
            continue
        names = [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        if len(names) >= 2 and len(names) == len(elts) and all(n in REGISTRY for n in names):
            lines.append(node.lineno)
    return lines


def test_no_module_outside_the_registry_keys_anything_by_op_name():
    """Rule: no tables or if/elif chains keyed by op names outside compiler/ops (the corpus in
    tests/corpus/ is test data: its op names are fusion JSON, not a table)."""
    root = Path(__file__).resolve().parents[1]
    found = []
    for d in ("compiler", "server", "client", "cli"):
        for f in sorted((root / d).rglob("*.py")) if (root / d).is_dir() else []:
            rel = f.relative_to(root).as_posix()
            if rel.startswith("compiler/ops/"):
                continue
            tree = ast.parse(f.read_text())
            found += [f"{rel}:{n}" for n in _op_name_uses(tree) + _name_tables(tree)]
    assert not found, f"op names compared or used as keys outside the registry: {found}"


def test_the_op_name_guard_sees_a_name_table_and_a_comparison():
    # (the guard above must be able to fail)
    tree = ast.parse('T = {"argsort": 1, "sort": 2}\nif nd.op.name == "topk": pass\nx = LIB[op_name]\n')
    assert _name_tables(tree) == [1] and _op_name_uses(tree) == [2, 3]
