"""The plan's contracts are declared, and the CUDA runtime's preparation agrees with them (issue
14): every `hints` key is one `SegmentHints` declares, alias modes are `AliasMode`s, a plan has no
attribute its dataclass does not declare, and the launches a run makes are the plan's
`kernel_count` (a segment split because the code generator refused it says so in the fallbacks);
the plan's decisions (library routine, row kernel, fused sort) are typed fields that survive JSON,
and neither codegen nor the CUDA runtime imports a planner analysis to decide them again. Over the
corpus, the MoE fusions at decode and prefill sizes, the row normalizations and the examples; no GPU
needed."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from corpus import all_cases, case_inputs, moe_graphs
from norm_graphs import NORMS, norm_graph
from segfuse.compiler.cuda.arrays import contiguous_strides
from segfuse.compiler.cuda.prepare import SourcesOnly, prepare_plan
from segfuse.compiler.engine import Engine
from segfuse.compiler.ir import Fusion
from segfuse.compiler.limits import SMEM_PER_BLOCK
from segfuse.compiler.plan import (
    AliasMode,
    LibraryRoutine,
    Plan,
    RowKernel,
    SegmentHints,
    SegmentKind,
    SortEpilogue,
)

ROOT = Path(__file__).resolve().parents[1]


def graphs():
    for case in all_cases():
        yield case[0], Fusion.from_json(case[1]), {k: np.shape(v) for k, v in case_inputs(case).items()}
    for idt in ("int64", "int32"):
        for g, _ in moe_graphs(idt=idt):
            f = Fusion.from_json(g)
            for T in (1, 128, 4096, 65536):
                yield (f"{g['name']}_{idt}_{T}", f,
                       {"topk_ids": (T, 8)} if "topk_ids" in f.input_names else {"tokens_per_expert": (256,)})
    for kind in NORMS:  # row_reduction segments: rows in registers, few rows split over a cluster
        for R, D in ((32768, 4096), (8, 65536)):
            f = norm_graph(kind)
            yield f"{kind}_{R}x{D}", f, f.input_shapes({"R": R, "D": D})
    for path in sorted((ROOT / "examples").glob("*.json")):
        f = Fusion.from_json(path.read_text())
        env = {"T": 128, "K": 8, "N": 4096, "M": 64, "E": 256}
        yield path.name, f, {k: tuple(v) for k, v in f.input_shapes({s: env[s] for s in f.symbols}).items()}


CASES = list(graphs())


@pytest.fixture(scope="module")
def planned():
    eng = Engine("numpy")
    out = []
    for name, f, shapes in CASES:
        bound = f.bind(shapes)
        plan = eng.plan(f, shapes)
        strides = {n: contiguous_strides(bound.types[n].shape) for n in f.input_names}
        out.append((name, f, plan, prepare_plan(SourcesOnly(), f, plan, bound, strides)))
    return out


def test_hints_keys_are_declared(planned):
    declared = set(SegmentHints.__annotations__)
    bad = [(name, s.id, sorted(set(s.hints) - declared)) for name, _, plan, _ in planned for s in plan.segments
           if set(s.hints) - declared]
    assert not bad, bad


def test_alias_modes_are_typed_and_plans_have_only_declared_attributes(planned):
    names = {f.name for f in dataclasses.fields(Plan)}
    for name, _, plan, _ in planned:
        assert set(vars(plan)) == names, (name, set(vars(plan)) ^ names)
        assert plan.checks is not None  # the plan cache replays them at other sizes
        for s in plan.segments:
            assert all(isinstance(a.mode, AliasMode) for a in s.aliases), (name, s.id)


def test_the_plans_decisions_are_typed_fields(planned):
    """A library segment names its routine (a `LibraryRoutine`), a row_reduction segment carries its
    `RowKernel` (its reductions among its nodes, its stored outputs among its outputs, its cached
    inputs among its inputs), a fused sort its `SortEpilogue`; no other segment has them."""
    kinds = set()
    for name, _, plan, _ in planned:
        for s in plan.segments:
            where = (name, s.id)
            assert (s.routine is not None) == (s.kind is SegmentKind.library), where
            assert s.routine is None or isinstance(s.routine, LibraryRoutine), where
            assert (s.row is not None) == (s.kind is SegmentKind.row_reduction), where
            if s.row is not None:
                assert isinstance(s.row, RowKernel) and set(s.row.reductions) <= set(s.nodes), where
                assert set(s.row.full_outputs + s.row.row_outputs) == set(s.outputs), where
                assert set(s.row.cached_inputs) <= set(s.row.in_place) | set(s.inputs) <= set(s.inputs), where
            assert (s.sort_epilogue is not None) == (s.routine is LibraryRoutine.sort_epilogue), where
            assert s.sort_epilogue is None or isinstance(s.sort_epilogue, SortEpilogue), where
            kinds.add(s.routine if s.kind is SegmentKind.library else s.kind)
    assert {LibraryRoutine.sort_epilogue, LibraryRoutine.library_sort, SegmentKind.row_reduction} <= kinds


def test_plans_round_trip_through_json_with_their_decisions(planned):
    for name, _, plan, _ in planned:
        again = Plan.from_dict(json.loads(plan.to_json()))
        assert again.to_json() == plan.to_json(), name
        assert [(s.routine, s.row, s.sort_epilogue) for s in again.segments] == \
            [(s.routine, s.row, s.sort_epilogue) for s in plan.segments], name


def test_the_code_generator_and_the_runtime_import_no_planner_analysis():
    """Codegen and the CUDA runtime read the plan's decisions; they never import the planner's row
    analysis or sort-epilogue matcher to decide again."""
    import ast

    analyses = {"segmenter.row_fusion", "segmenter.sort_epilogue"}
    found = []
    for path in sorted((ROOT / "compiler" / "codegen").glob("*.py")) + sorted((ROOT / "compiler" / "cuda").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and any((node.module or "").endswith(a) for a in analyses):
                found.append((path.name, node.module))
    assert not found, found


def test_a_run_makes_the_launches_the_plan_counts(planned):
    off = [(name, plan.kernel_count, prep.kernels) for name, _, plan, prep in planned
           if prep.kernels != plan.kernel_count and not any("split into" in x for x in prep.fallbacks)]
    assert not off, off
    assert len(planned) > 150


def test_kernels_use_the_index_width_the_plan_says_and_fit_shared_memory(planned):
    """For contiguous inputs (the plan's assumption; a strided input's stride extent may widen a
    kernel's indices at run time, compiler/limits.py) every module indexes with the plan's
    `index_bits`; and no kernel of a plan asks for more shared memory than limits.SMEM_PER_BLOCK.
    (A single-block segment's `intermediate_smem_bytes` hint is the planner's budget test for intermediates;
    the kernel may stage more, e.g. scatter targets and sort keys, within the same limit.)"""
    off = []
    for name, _, plan, prep in planned:
        segs = {s.id: s for s in plan.segments}
        for sid, mod in prep.modules:
            hints = segs[sid].hints
            if "index_bits" in hints and mod.index_bits != hints["index_bits"]:
                off.append((name, sid, "index_bits", hints["index_bits"], mod.index_bits))
            if max(ln.smem for ln in mod.launches) > SMEM_PER_BLOCK:
                off.append((name, sid, "smem", max(ln.smem for ln in mod.launches)))
    assert not off, off


def test_single_block_hints_name_the_planners_count_not_the_kernels_smem(planned):
    """A single-block segment's shared-memory hint is `intermediate_smem_bytes`: the planner's
    count of its shared-memory intermediates against the budget (Capability.smem_budget_bytes);
    the kernel's shared memory is the code generator's (each launch's `smem`)."""
    blocks = [(name, s) for name, _, plan, _ in planned for s in plan.segments if s.hints.get("single_block")]
    assert blocks
    for name, s in blocks:
        assert "smem_bytes" not in s.hints and "intermediate_smem_bytes" in s.hints, (name, s.id)
        if not s.intermediates:
            assert s.hints["intermediate_smem_bytes"] == 0, (name, s.id)


def test_a_scan_read_by_a_reduction_counts_its_bytes_in_shared_memory():
    g = {"format": "segfuse.fusion/1", "inputs": [{"name": "x", "dtype": "float32", "shape": ["N"]}],
         "ops": [{"op": "cumsum", "out": "y", "inputs": ["x"], "dim": 0}, {"op": "sum", "out": "s", "inputs": ["y"]},
                 {"op": "add", "out": "z", "inputs": ["y", "s"]}], "outputs": ["z"]}
    f = Fusion.from_json(g)
    (seg,) = Engine("numpy").plan(f, {"x": (1000,)}).segments
    assert seg.hints["single_block"] and seg.hints["intermediate_smem_bytes"] == "4*N + 4"  # y and s: float32
