"""The plan's contracts are declared, and the CUDA runtime's preparation agrees with them (issue
14): every `hints` key is one `SegmentHints` declares, alias modes are `AliasMode`s, a plan has no
attribute its dataclass does not declare, and the launches a run makes are the plan's
`kernel_count` (a segment split because the code generator refused it says so in the fallbacks).
Over the corpus, the MoE fusions at decode and prefill sizes, and the examples; no GPU needed."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from corpus import all_cases, case_inputs, moe_graphs
from segfuse.compiler.cuda.arrays import contiguous_strides
from segfuse.compiler.cuda.prepare import SourcesOnly, prepare_plan
from segfuse.compiler.engine import Engine
from segfuse.compiler.ir import Fusion
from segfuse.compiler.limits import SMEM_PER_BLOCK
from segfuse.compiler.plan import AliasMode, Plan, SegmentHints

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
