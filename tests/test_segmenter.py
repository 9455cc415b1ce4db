"""The segmenter (issue 3): each rule on minimal graphs with the exact segment structure and
reasons, nvFuser's four MoE fusions as one kernel each at their test sizes, shape classes, the
plan cache, determinism, and `segfuse explain` on every example graph."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from segfuse.compiler import Engine, FusionDefinition, RunError, load_fusion, run_graph
from segfuse.compiler.ops.registry import OpKind
from segfuse.compiler.plan import LibraryRoutine
from segfuse.compiler.segmenter import segment
from segfuse.compiler.segmenter.cache import PlanCache
from segfuse.compiler.segmenter.capability import DEFAULT_CAPABILITY, Capability

ROOT = Path(__file__).resolve().parent.parent
CAP = DEFAULT_CAPABILITY
BIG = 4 * CAP.single_block_max_elems  # above the single-block threshold, whatever it is tuned to
SMALL = 64


FUSING = replace(CAP, fuse_copies=True)  # the structures below assume copies ride along


def plan_of(f, shapes, cap=FUSING):
    return segment(f, f.bind(shapes), cap)


def structure(plan):
    """[(kind, [op names], [copies])] per segment."""
    return [(s.kind.value, s.nodes, [(c.src, c.dst) for c in s.copies]) for s in plan.segments]


def kinds(plan):
    return [s.kind.value for s in plan.segments]


def rand_inputs(f, shapes, seed=0, high=None):
    rng = np.random.default_rng(seed)
    out = {}
    for name, t in f.inputs:
        shape = shapes[name]
        if t.dtype.is_int:
            out[name] = rng.integers(0, high[name] if high else 4, shape).astype(t.dtype.np)
        else:
            out[name] = rng.standard_normal(shape).astype(t.dtype.np)
    return out


def check_run(f, shapes, high=None, seed=0):
    """Engine (plan executed segment by segment) == run_graph, and no input changes."""
    ins = rand_inputs(f, shapes, seed, high)
    before = {k: v.copy() for k, v in ins.items()}
    want = run_graph(f, {k: v.copy() for k, v in ins.items()})
    got = Engine().run(f, ins).outputs
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    for k in ins:
        if not any(o.alias_of == k for o in f.outputs):
            np.testing.assert_array_equal(ins[k], before[k], err_msg=f"input {k} changed")
    return got


# ---- graphs -----------------------------------------------------------------------------
def scatter_graph(reader: str):
    """y = scatter(self, idx, src) where self is the input x (reader 'input'), an intermediate
    a = x + 1 read by an independent op ('intermediate'), or read by an op using y ('after')."""
    with FusionDefinition(f"scatter_{reader}") as fd:
        x = fd.define_tensor("x", ["N"], "float32")
        idx = fd.define_tensor("idx", ["M"], "int64")
        src = fd.define_tensor("src", ["M"], "float32")
        self_t = x if reader == "input" else fd.ops.add(x, 1.0)
        y = fd.ops.scatter(self_t, 0, idx, src)
        if reader == "after":
            fd.add_output(fd.ops.mul(self_t, y), "w")
        else:
            fd.add_output(y, "y")
            fd.add_output(fd.ops.mul(self_t, 3.0), "w")
    return fd.fusion()


def xshapes(n, m):
    return {"x": (n,), "idx": (m,), "src": (m,)}


# ---- rule 1: in-place scatter -----------------------------------------------------------
def test_scatter_of_graph_input_read_elsewhere_gets_a_private_copy():
    f = scatter_graph("input")  # ops: 0 scatter y, 1 mul w
    plan = plan_of(f, xshapes(BIG, BIG // 2))
    assert structure(plan) == [("pointwise", [1], [("x", "y.self")]), ("scatter", [0], [])]
    seg = plan.segments[1]
    assert [(a.tensor, a.buffer, a.mode) for a in seg.aliases] == [("y", "y.self", "copy")]
    assert "'x' is a graph input" in seg.aliases[0].why
    assert "initialised straight into its buffer" in seg.aliases[0].why  # y is a graph output
    assert "writes in place into 'y.self'" in seg.reason
    # the copy lives in y's output buffer; x's buffer is only read
    by_id = {b.id: b for b in plan.buffers}
    assert by_id[plan.tensor_buffer["y"]].kind == "output"
    assert plan.tensor_buffer["y.self"] == plan.tensor_buffer["y"]
    assert by_id[plan.tensor_buffer["x"]].kind == "input"
    check_run(f, xshapes(BIG, BIG // 2), high={"idx": BIG})


def test_copies_get_their_own_segment_when_codegen_cannot_fuse_them():
    f = scatter_graph("input")
    plan = plan_of(f, xshapes(BIG, BIG // 2), Capability(fuse_copies=False))
    assert structure(plan) == [("copy", [], [("x", "y.self")]), ("scatter", [0, 1], [])]
    assert (plan.segments[0].inputs, plan.segments[0].outputs) == (["x"], ["y.self"])
    check_run(f, xshapes(BIG, BIG // 2), high={"idx": BIG})


def test_scatter_of_graph_input_in_one_block_copies_inside_the_kernel():
    f = scatter_graph("input")
    plan = plan_of(f, xshapes(SMALL, SMALL // 2))
    assert structure(plan) == [("single_block", [0, 1], [("x", "y.self")])]
    check_run(f, xshapes(SMALL, SMALL // 2), high={"idx": SMALL})


def test_scatter_of_intermediate_read_by_independent_op_is_ordered_after_it():
    f = scatter_graph("intermediate")  # ops: 0 add t0, 1 scatter y, 2 mul w
    plan = plan_of(f, xshapes(BIG, BIG // 2))
    assert structure(plan) == [("pointwise", [0, 2], []), ("scatter", [1], [])]
    alias = plan.segments[1].aliases[0]
    assert (alias.tensor, alias.buffer, alias.mode) == ("y", "t0", "ordered")
    assert "mul 'w' (ops[2])" in alias.why
    # t0 is computed straight into y's output buffer, read by w first, then scattered in place
    assert plan.tensor_buffer["t0"] == plan.tensor_buffer["y"]
    check_run(f, xshapes(BIG, BIG // 2), high={"idx": BIG})


def test_scatter_of_intermediate_read_after_the_scatter_gets_a_copy():
    f = scatter_graph("after")  # ops: 0 add t0, 1 scatter t1, 2 mul w (reads t0 and t1)
    plan = plan_of(f, xshapes(BIG, BIG // 2))
    assert structure(plan) == [("pointwise", [0], [("t0", "t1.self")]), ("scatter", [1], []),
                               ("pointwise", [2], [])]
    alias = plan.segments[1].aliases[0]
    assert alias.mode == "copy" and "mul 'w' (ops[2]) reads 't0' after the scatter" in alias.why
    assert "completes only when its kernel ends" in plan.segments[2].reason
    check_run(f, xshapes(BIG, BIG // 2), high={"idx": BIG})


def test_in_place_update_of_an_input_declared_alias_of():
    with FusionDefinition("kv_update") as fd:
        cache = fd.define_tensor("cache", ["N"], "float32")
        idx = fd.define_tensor("idx", ["M"], "int64")
        src = fd.define_tensor("src", ["M"], "float32")
        fd.add_output(fd.ops.scatter(cache, 0, idx, src, reduce="add"), "new_cache", alias_of=cache)
    f = fd.fusion()
    shapes = {"cache": (BIG,), "idx": (64,), "src": (64,)}
    plan = plan_of(f, shapes)
    alias = plan.segments[-1].aliases[0]
    assert alias.mode == "input" and alias.buffer == "cache"
    assert plan.tensor_buffer["new_cache"] == plan.tensor_buffer["cache"]
    ins = rand_inputs(f, shapes, high={"idx": BIG})
    want = run_graph(f, {k: v.copy() for k, v in ins.items()})
    cache_arr = ins["cache"]
    got = Engine().run(f, ins)
    np.testing.assert_array_equal(cache_arr, want["new_cache"])
    assert got.outputs["new_cache"] is cache_arr
    # an out-of-range index: RunError, and the input keeps its value
    before = cache_arr.copy()
    bad = dict(ins, idx=np.full(64, BIG + 5, np.int64))
    with pytest.raises(RunError):
        Engine().run(f, bad)
    np.testing.assert_array_equal(cache_arr, before)


def test_chain_of_scatters_shares_one_buffer():
    with FusionDefinition("chain") as fd:
        idx = fd.define_tensor("idx", ["M"], "int64")
        z = fd.ops.full([16], 0, "int64")
        a = fd.ops.scatter(z, 0, idx, 1, reduce="add")
        b = fd.ops.scatter(a, 0, idx, 2, reduce="amax")
        fd.add_output(b, "b")
    f = fd.fusion()
    plan = plan_of(f, {"idx": (BIG,)})
    # the zeros and the first (accumulating) scatter: one block's phases, the long index read by
    # the histogram that the grid's blocks share (spread.py); the second scatter: a grid kernel
    assert kinds(plan) == ["single_block", "scatter"]
    assert "histogram that the grid's blocks share" in plan.segments[0].reason
    assert "scatter 'b' (ops[2])" not in plan.segments[0].reason
    assert plan.tensor_buffer["t0"] == plan.tensor_buffer["t1"] == plan.tensor_buffer["b"]
    assert [a.mode for s in plan.segments for a in s.aliases] == ["inplace", "inplace"]
    check_run(f, {"idx": (BIG,)}, high={"idx": 16})


# ---- rules 2 and 3: completion and gathers ----------------------------------------------
def test_scatter_result_read_by_pointwise_op_starts_a_segment():
    with FusionDefinition("consume") as fd:
        idx = fd.define_tensor("idx", ["M"], "int64")
        y = fd.ops.scatter(fd.ops.full(["M"], 0.0, "float32"), 0, idx, 1.0, reduce="add")
        fd.add_output(fd.ops.add(y, 1.0), "w")
    f = fd.fusion()  # ops: 0 full, 1 scatter, 2 add
    plan = plan_of(f, {"idx": (BIG,)})
    assert structure(plan) == [("pointwise", [0], []), ("scatter", [1], []), ("pointwise", [2], [])]
    assert plan.segments[2].reason == ("add 'w' (ops[2]) reads 't1', which scatter 't1' (ops[1]) completes "
                                       "only when its kernel ends")
    check_run(f, {"idx": (BIG,)}, high={"idx": BIG})


def test_gather_of_pointwise_producer_needs_no_boundary():
    with FusionDefinition("gather_pw") as fd:
        x = fd.define_tensor("x", ["N"], "float32")
        idx = fd.define_tensor("idx", ["M"], "int64")
        a = fd.ops.exp(x)
        fd.add_output(fd.ops.gather(a, 0, idx), "g")
    f = fd.fusion()
    plan = plan_of(f, {"x": (BIG,), "idx": (BIG,)})
    assert structure(plan) == [("pointwise", [0, 1], [])]
    assert plan.segments[0].intermediates == ["t0"]  # recomputed at the gathered positions
    check_run(f, {"x": (BIG,), "idx": (BIG,)}, high={"idx": BIG})


def test_gather_of_scan_result_needs_a_boundary():
    with FusionDefinition("gather_scan") as fd:
        x = fd.define_tensor("x", ["N"], "float32")
        idx = fd.define_tensor("idx", ["M"], "int64")
        fd.add_output(fd.ops.gather(fd.ops.cumsum(x, 0), 0, idx), "g")
    f = fd.fusion()
    plan = plan_of(f, {"x": (BIG,), "idx": (BIG,)})
    assert len(plan.segments) == 2
    assert "reads 't0' at other positions" in plan.segments[1].reason
    check_run(f, {"x": (BIG,), "idx": (BIG,)}, high={"idx": BIG})


def test_epilogue_at_own_position_fuses_into_reduction():
    with FusionDefinition("sum_epilogue") as fd:
        x = fd.define_tensor("x", ["R", "C"], "float32")
        s = fd.ops.sum(x, [1])
        fd.add_output(fd.ops.mul(s, 2.0), "y")
    f = fd.fusion()
    plan = plan_of(f, {"x": (BIG, 4)})
    # (a block per row reads the sum and writes y: one launch, where a grid reduction kernel takes two)
    assert structure(plan) == [("row_reduction", [0, 1], [])]
    assert "row-persistent reduction: sum 't0' over dim 1" in plan.segments[0].reason


# ---- rule 4: single block ---------------------------------------------------------------
def test_same_graph_below_and_above_the_single_block_threshold():
    f = moe_problem_sizes(16)
    small = plan_of(f, {"topk_ids": (32, 4)})
    assert structure(small) == [("single_block", [0, 1, 2, 3], [])]
    assert small.segments[0].hints["single_block"] is True
    assert small.segments[0].reason.startswith("the whole region (4 ops) fits one thread block")
    big = plan_of(f, {"topk_ids": (BIG, 4)})
    # a histogram: still one block's phases, the long ids read only by the first phase, which the
    # grid's blocks share (spread.py; the last block to finish combines the partials)
    assert structure(big) == [("single_block", [0, 1, 2, 3], [])]
    assert "histogram that the grid's blocks share" in big.segments[0].reason
    assert big.shape_class != small.shape_class
    for shapes in ({"topk_ids": (32, 4)}, {"topk_ids": (BIG, 4)}):
        check_run(f, shapes, high={"topk_ids": 16})
    # a scatter that stores (no accumulation) has no such form: the zeros must be complete before
    # a multi-block scatter writes into them: fill, then scatter
    with FusionDefinition("store") as fd:
        ids = fd.define_tensor("topk_ids", ["T", "K"], "int64")
        flat = fd.ops.reshape(ids, [-1])
        fd.add_output(fd.ops.scatter(fd.ops.full([16], 0, "int64"), 0, flat, fd.ops.full_like(flat, 1)), "o")
    g = fd.fusion()
    assert structure(plan_of(g, {"topk_ids": (BIG, 4)})) == [("pointwise", [1], []), ("scatter", [0, 2, 3], [])]
    check_run(g, {"topk_ids": (BIG, 4)}, high={"topk_ids": 16})


# ---- rule 5: library segments -----------------------------------------------------------
def test_op_codegen_cannot_emit_becomes_a_library_segment():
    # (without the sort-epilogue fusion, which would take the consumers into the library call)
    no_grid_sort = Capability(grid_kinds=CAP.grid_kinds - {OpKind.sort}, fuse_sort_epilogues=False)
    f = moe_argsort(4)
    plan = plan_of(f, {"topk_ids": (BIG, 4)}, no_grid_sort)
    lib = [s for s in plan.segments if s.kind.value == "library"]
    # (the op's library sort: compiler/cuda/library_sorts.py runs it on the GPU)
    assert len(lib) == 1 and lib[0].routine is LibraryRoutine.library_sort
    assert lib[0].routine.describe(f.nodes[lib[0].nodes[0]].op) == "segfuse.radix_sort for one row, else cupy.argsort (stable)"
    assert "runs as a library call" in lib[0].reason
    # and at decode sizes the same op is generated inside one block
    assert kinds(plan_of(f, {"topk_ids": (8, 4)}, no_grid_sort)) == ["single_block"]


# ---- rule 6: views ----------------------------------------------------------------------
def test_pure_view_costs_no_kernel():
    with FusionDefinition("view_only") as fd:
        x = fd.define_tensor("x", ["A", "B"], "float32")
        fd.add_output(fd.ops.reshape(x, [-1]), "flat")
    f = fd.fusion()
    plan = plan_of(f, {"x": (BIG, 3)})
    assert kinds(plan) == ["view"] and plan.kernel_count == 0
    assert plan.views == {"flat": "x"}
    check_run(f, {"x": (BIG, 3)})


# ---- nvFuser's four MoE fusions ---------------------------------------------------------
def moe_problem_sizes(E):
    with FusionDefinition("moe_problem_sizes") as fd:
        ids = fd.define_tensor("topk_ids", ["T", "K"], "int64")
        flat = fd.ops.reshape(ids, [-1])
        z = fd.ops.full([E], 0, "int64")
        fd.add_output(fd.ops.scatter(z, 0, flat, fd.ops.full_like(flat, 1), reduce="add"), "counts")
    return fd.fusion()


def moe_expert_offsets():
    with FusionDefinition("moe_expert_offsets") as fd:
        t = fd.define_tensor("tokens_per_expert", ["E"], "int64")
        fd.add_output(fd.ops.pad(fd.ops.cumsum(t, 0), [1, 0]), "expert_offsets")
    return fd.fusion()


def moe_blockscale_offsets():
    with FusionDefinition("moe_blockscale_offsets") as fd:
        t = fd.define_tensor("tokens_per_expert", ["E"], "int64")
        fd.add_output(fd.ops.pad(fd.ops.cumsum(t, 0), [1, 0]), "expert_offsets")
        r = fd.ops.mul(fd.ops.ceil_div(t, 128), 128)
        fd.add_output(fd.ops.pad(fd.ops.cumsum(r, 0), [1, 0]), "blockscale_offsets")
    return fd.fusion()


def moe_argsort(topk):
    with FusionDefinition("moe_argsort") as fd:
        ids = fd.define_tensor("topk_ids", ["T", topk], "int64")
        flat = fd.ops.reshape(ids, [-1])
        s = fd.ops.argsort(flat, 0, descending=True, stable=True)
        fd.add_output(fd.ops.floor_divide(s, topk), "input_permutation")
        n = fd.ops.full_like(flat, 0)
        fd.add_output(fd.ops.scatter(n, 0, s, fd.ops.iota(f"T*{topk}")), "output_permutation")
    return fd.fusion()


NVFUSER_SIZES = [(16, t, k) for t in (32, 1) for k in (4, 1)]


@pytest.mark.parametrize("E,T,K", NVFUSER_SIZES)
def test_moe_fusions_are_one_kernel_at_nvfuser_sizes(E, T, K):
    cases = [(moe_problem_sizes(E), {"topk_ids": (T, K)}, {"topk_ids": E}),
             (moe_expert_offsets(), {"tokens_per_expert": (E,)}, {"tokens_per_expert": T * K}),
             (moe_blockscale_offsets(), {"tokens_per_expert": (E,)}, {"tokens_per_expert": T * K}),
             (moe_argsort(K), {"topk_ids": (T, K)}, {"topk_ids": T * K})]
    for f, shapes, high in cases:
        plan = plan_of(f, shapes)
        assert len(plan.segments) == 1 and plan.kernel_count == 1, (f.name, structure(plan))
        assert plan.segments[0].nodes == list(range(len(f.nodes)))
        check_run(f, shapes, high=high)


def test_moe_argsort_scatter_writes_into_the_output_buffer():
    plan = plan_of(moe_argsort(4), {"topk_ids": (32, 4)})
    (alias,) = plan.segments[0].aliases
    assert (alias.tensor, alias.mode) == ("output_permutation", "inplace")
    assert plan.tensor_buffer[alias.buffer] == plan.tensor_buffer["output_permutation"]
    assert {b.kind for b in plan.buffers} == {"input", "output"}  # nothing else in global memory


# ---- shape classes, cache, determinism --------------------------------------------------
def test_plans_are_deterministic_and_size_free_within_a_class():
    f = moe_argsort(4)
    a = plan_of(f, {"topk_ids": (BIG, 4)}).to_json()
    b = plan_of(moe_argsort(4), {"topk_ids": (BIG, 4)}).to_json()
    c = plan_of(f, {"topk_ids": (BIG + 123, 4)}).to_json()
    assert a == b == c
    assert str(BIG) not in a  # sizes are expressions in T


def test_cache_hits_for_another_batch_size_in_the_same_class():
    f = moe_problem_sizes(16)
    cache = PlanCache()
    p1, hit1 = cache.get(f, f.bind({"topk_ids": (BIG, 8)}))
    p2, hit2 = cache.get(f, f.bind({"topk_ids": (BIG + 1000, 8)}))  # (twice BIG: a histogram too long to spread)
    assert (hit1, hit2) == (False, True) and p2 is p1
    p3, hit3 = cache.get(f, f.bind({"topk_ids": (32, 4)}))  # fits one block: another class
    assert not hit3 and p3.shape_class != p1.shape_class
    p4, hit4 = cache.get(f, f.bind({"topk_ids": (1, 4)}))  # T=1: another class
    assert not hit4 and p4.shape_class.startswith("K=n,T=1")
    eng = Engine(plan_cache=PlanCache())
    r1 = eng.run(f, {"topk_ids": np.zeros((BIG, 8), np.int64)})
    r2 = eng.run(f, {"topk_ids": np.ones((BIG + 7, 8), np.int64)})
    assert (r1.cache_misses, r2.cache_hits) == (1, 1)
    assert "plan" in r2.timings_us
    assert r2.outputs["counts"][1] == (BIG + 7) * 8


def test_engine_plan_matches_segmenter():
    f = moe_expert_offsets()
    assert Engine().plan(f, {"tokens_per_expert": (16,)}).to_json() == plan_of(
        f, {"tokens_per_expert": (16,)}).to_json()


# ---- segfuse explain --------------------------------------------------------------------
EXAMPLES = sorted((ROOT / "examples").glob("*.json"))


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_explain_every_example(path, capsys):
    from segfuse.cli import main

    f = load_fusion(str(path))
    shape = ",".join(f"{s}=32" for s in sorted(f.symbols))
    args = ["explain", str(path)] + (["--shape", shape] if shape else [])
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "segments" in text and "reason" in text
    assert main(args + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["segments"] and all(s["reason"] for s in data["segments"])


def test_explain_reports_missing_sizes(capsys):
    from segfuse.cli import main

    path = ROOT / "examples" / "moe_argsort.json"
    if not path.exists():
        pytest.skip("examples not written yet")
    assert main(["explain", str(path)]) == 2
    assert "give a value for T" in capsys.readouterr().err


def test_plans_are_identical_across_processes():
    """No dependence on hash seeds or set order: two interpreters print the same plan."""
    import os
    import subprocess
    import sys

    code = ("import sys; sys.path.insert(0, 'tests'); import test_segmenter as T; "
            "f = T.scatter_graph('after'); print(T.plan_of(f, T.xshapes(T.BIG, 7)).to_json()); "
            "g = T.moe_argsort(4); print(T.plan_of(g, {'topk_ids': (T.BIG, 4)}).to_json())")
    outs = [subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")]
    assert outs[0] == outs[1] and '"segments"' in outs[0]


def test_derived_size_that_becomes_one_is_its_own_class():
    """pad/slice sizes like T-1 broadcast when they are 1: such runs do not share a plan."""
    with FusionDefinition("derived") as fd:
        x = fd.define_tensor("x", ["T"], "float32")
        y = fd.define_tensor("y", [5], "float32")
        head = fd.ops.slice(x, 0, 1)  # [T-1]
        fd.add_output(fd.ops.add(head, y), "z")  # broadcasts only when T-1 == 1
    f = fd.fusion()
    cache = PlanCache()
    p6, _ = cache.get(f, f.bind({"x": (6,), "y": (5,)}))
    p2, hit = cache.get(f, f.bind({"x": (2,), "y": (5,)}))
    assert not hit and p2 is not p6
    check_run(f, {"x": (2,), "y": (5,)})
    check_run(f, {"x": (6,), "y": (5,)})


def test_explain_takes_whole_input_shapes(capsys):
    from segfuse.cli import main

    path = ROOT / "examples" / "moe_problem_sizes.json"
    if not path.exists():
        pytest.skip("examples not written yet")
    assert main(["explain", str(path), "--shape", f"topk_ids={BIG}x8", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [s["kind"] for s in plan["segments"]] == ["single_block"]  # (a histogram: spread.py)
    assert main(["explain", str(path), "--shape", "Q=3"]) == 2
    assert "not a size symbol or input" in capsys.readouterr().err


def test_sort_row_too_long_for_shared_memory_is_a_library_segment_and_a_class_boundary():
    # The plan must say what runs: a sort row whose (key, index) pairs do not fit the block's
    # shared memory is CuPy's sort, not a single-block kernel the runtime would have to split;
    # in one block, a rank-1 row of integer keys is sorted by the block radix sort instead.
    from segfuse.compiler.dtypes import DType
    from segfuse.compiler.segmenter.capability import SINGLE_BLOCK, max_sort_row

    limit = max_sort_row(DType.int64, DEFAULT_CAPABILITY)
    radix = DEFAULT_CAPABILITY.radix_sort_max_row
    assert max_sort_row(DType.int64, DEFAULT_CAPABILITY, SINGLE_BLOCK, 1) == max(limit, radix)
    assert max_sort_row(DType.float32, DEFAULT_CAPABILITY, SINGLE_BLOCK, 1) == max_sort_row(DType.float32, CAP)
    # a Capability with a longer radix limit keeps longer integer rows in one block
    longer = dataclasses.replace(DEFAULT_CAPABILITY, radix_sort_max_row=4 * limit)
    assert max_sort_row(DType.int64, longer, SINGLE_BLOCK, 1) == 4 * limit
    f = load_fusion(ROOT / "examples" / "moe_argsort.json")
    K = f.inputs[0][1].shape[1]
    spec = json.loads((ROOT / "examples" / "moe_argsort.json").read_text())
    spec["inputs"][0]["dtype"] = "float32"
    from segfuse.compiler.ir import Fusion

    ff = Fusion.from_json(spec)
    cache = PlanCache()
    for fus, dt, lib_expected in ((f, np.int64, 2 * limit > radix), (ff, np.float32, True)):
        small, _ = cache.get(fus, fus.bind({"topk_ids": (limit // K, K)}))
        big, hit = cache.get(fus, fus.bind({"topk_ids": (2 * limit // K, K)}))
        assert not hit and small.shape_class != big.shape_class
        assert [s.kind.value for s in small.segments] == ["single_block"]
        lib = [s for s in big.segments if s.kind.value == "library"]
        if lib_expected:
            assert len(lib) == 1 and "fit shared memory" in lib[0].reason
            # the sort with its keys' views and consumers fused in (compiler/codegen/sort_epilogue.py)
            assert "argsort" in [fus.nodes[n].op.name for n in lib[0].nodes]
        else:
            assert [s.kind.value for s in big.segments] == ["single_block"]
        ids = np.random.default_rng(3).integers(0, 16, (2 * limit // K, K)).astype(dt)
        want = run_graph(fus, {"topk_ids": ids})
        got = Engine().run(fus, {"topk_ids": ids}).outputs
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
