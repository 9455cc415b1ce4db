"""The argsort epilogue fusion (compiler/codegen/sort_epilogue.py) on the CPU: which regions it
recognizes and which it leaves alone, the plans (the MoE argsort fusion at T = 4096 and 65536 is
one library segment, one launch), the fused kernel's source compiling with NVRTC to sm_90 for
int32/int64 ids, fused plans executed by the NumPy plan executor against the op-by-op reference,
and the runtime hook's wiring with a stand-in for the GPU. Results on the GPU:
tests/gpu/test_fused_sort_gpu.py."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from corpus import _graph, moe_graphs, sort_consumers_graph
from segfuse.compiler.codegen import sort_epilogue as se
from segfuse.compiler.cuda import nvrtc, radix_sort
from segfuse.compiler.engine import Engine
from segfuse.compiler.errors import RunError
from segfuse.compiler.ir import Fusion
from segfuse.compiler.numpy_backend import run_graph
from segfuse.compiler.plan import LibraryRoutine
from segfuse.compiler.segmenter import segment
from segfuse.compiler.segmenter import sort_epilogue as sep
from segfuse.compiler.segmenter.cache import PlanCache
from segfuse.compiler.segmenter.capability import DEFAULT_CAPABILITY

K = 8
BASE = [{"op": "reshape", "out": "flat", "inputs": ["ids"], "shape": [-1]}]


def argsort_op(desc, src="flat"):
    return {"op": "argsort", "out": "order", "inputs": [src], "dim": 0, "descending": desc, "stable": True}


def graph(name, ops, outs, idt="int64"):
    return Fusion.from_json(_graph(name, [{"name": "ids", "dtype": idt, "shape": ["T", K]}], ops, outs))


def moe(idt="int64", desc=True):
    """nvFuser's MoE argsort fusion (tests/corpus/) with either sort order."""
    g, _ = moe_graphs(idt=idt)[-1]
    ops = [dict(op, descending=desc) if op["op"] == "argsort" else op for op in g["ops"]]
    return Fusion.from_json({**g, "ops": ops})


def wide(idt="int64"):
    return Fusion.from_json(sort_consumers_graph(idt, K))


def scatter_tail(index="order", reduce="none", extra=()):
    ops = BASE + [argsort_op(True),
                  {"op": "full", "out": "z", "inputs": [], "shape": [f"T*{K}"], "value": 0, "dtype": "int64"},
                  {"op": "iota", "out": "ar", "inputs": [], "length": f"T*{K}"}]
    if index != "order":
        ops.append({"op": "floor_divide", "out": index, "inputs": ["order", K]})
    ops.append({"op": "scatter", "out": "o", "inputs": ["z", index, "ar"], "dim": 0, "reduce": reduce})
    return ops + list(extra)


def shapes(f, T):
    return {f.inputs[0][0]: (T, K)}


def plan(f, T, cap=DEFAULT_CAPABILITY):
    return segment(f, f.bind(shapes(f, T)), cap)


def fused(p):
    return [s for s in p.segments if s.fused_sort]


def matched(f, T):
    (seg,) = fused(plan(f, T))
    types = f.bind(shapes(f, T)).types
    return seg, sep.match(f, seg.nodes, seg.inputs, seg.outputs, types), types


# ---- plans --------------------------------------------------------------------------------
@pytest.mark.parametrize("idt", ["int32", "int64"])
@pytest.mark.parametrize("T", [4096, 65536])
def test_moe_argsort_is_one_library_segment(idt, T):
    f = moe(idt)
    p = plan(f, T)
    (seg,) = p.segments
    assert seg.kind.value == "library" and seg.routine is LibraryRoutine.sort_epilogue and p.kernel_count == 1
    # the plan records the match (planned at the class's sizes) as matching at these sizes finds it
    types = f.bind(shapes(f, T)).types
    assert seg.sort_epilogue == sep.match(f, seg.nodes, seg.inputs, seg.outputs, types).epilogue()
    assert seg.nodes == list(range(len(f.nodes))) and seg.inputs == ["topk_ids"]
    assert set(seg.outputs) == {"input_permutation", "output_permutation"}
    assert "one launch" in seg.reason and "fit shared memory" in seg.reason
    (alias,) = seg.aliases  # the scatter still writes into its self's (the output's) buffer
    assert (alias.tensor, alias.mode) == ("output_permutation", "inplace")
    # the flag restores the old plan: key copy, library sort, consumers
    old = plan(f, T, dataclasses.replace(DEFAULT_CAPABILITY, fuse_sort_epilogues=False))
    assert [s.kind.value for s in old.segments] == ["pointwise", "library", "scatter"]


def _prologue(idt="int64"):
    from torch_graphs import prologue_graph

    return Fusion.from_json(prologue_graph(idt))


@pytest.mark.parametrize("T", [4096, 16384, 65536])
def test_whole_prologue_sort_takes_its_scatter_target_from_another_segment(T):
    """The whole MoE prologue: the planner puts `full -> z2` (the output permutation's target) next
    to the counts' work; the epilogue pass moves it into the sort's region, so the consumers of the
    sort run in its final pass instead of a launch of their own (T = 4096: 4 launches -> 2; the
    histogram stays outside the sort here, Capability.fuse_sort_histograms off)."""
    f = _prologue()
    p = plan(f, T, dataclasses.replace(DEFAULT_CAPABILITY, fuse_sort_histograms=False))
    (seg,) = fused(p)
    names = {f.nodes[n].outputs[0] for n in seg.nodes}
    assert {"order", "input_perm", "z2", "ar", "output_perm"} <= names
    assert set(seg.outputs) == {"input_perm", "output_perm"}
    assert seg.inputs == ["flat"]  # the keys: a view of topk_ids (no data moves)
    assert "moved here from the segment that made it" in seg.reason
    others = [s for s in p.segments if s is not seg]
    assert all("z2" not in s.outputs for s in others)
    assert not any("order" in b.tensors for b in p.buffers)  # never materialized
    if T == 4096:
        assert [s.kind.value for s in p.segments] == ["single_block", "library"] and p.kernel_count == 2
    old = plan(f, T, dataclasses.replace(DEFAULT_CAPABILITY, fuse_sort_epilogues=False))
    assert p.kernel_count < old.kernel_count


def _independent_prologue(ids, E=256):
    """NumPy, written apart from the code under test: bincount, cumsum, stable argsort, inverse."""
    flat = ids.reshape(-1).astype(np.int64)
    counts = np.bincount(flat, minlength=E).astype(ids.dtype)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(ids.dtype)
    order = np.argsort(flat, kind="stable")
    inv = np.empty_like(order)
    inv[order] = np.arange(order.size)
    return {"counts": counts, "offsets": offsets, "input_perm": order // K, "output_perm": inv}


@pytest.mark.parametrize("idt", ["int32", "int64"])
@pytest.mark.parametrize("T", [1000, 4096, 16384])
def test_whole_prologue_plan_runs_right_on_numpy(idt, T):
    f = _prologue(idt)
    ids = np.random.default_rng(T).integers(0, 256, (T, K)).astype(idt)
    ids[: T // 4] = 7  # long runs of ties
    got = Engine().run(f, {"topk_ids": ids}).outputs
    want = _independent_prologue(ids)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_small_rows_keep_their_single_block_plan():
    p = plan(moe(), 128)
    assert [s.kind.value for s in p.segments] == ["single_block"] and not fused(p)


def test_plan_is_size_free_within_its_class():
    f = moe()
    assert plan(f, 8192).to_json() == plan(f, 65536).to_json()


# ---- recognition ---------------------------------------------------------------------------
@pytest.mark.parametrize("desc", [True, False])
def test_match_of_the_moe_fusion(desc):
    f = moe(desc=desc)
    seg, m, _ = matched(f, 4096)
    assert (m.key, m.n, m.descending, m.order) == ("topk_ids", 4096 * K, desc, "order")
    assert m.stores == ("input_permutation",)
    assert [(f.nodes[p].outputs[0], init) for p, init in m.scatters] == [("output_permutation", False)]


def test_match_of_every_consumer_kind():
    f = wide()
    seg, m, types = matched(f, 4096)
    assert seg.nodes == list(range(len(f.nodes)))
    assert m.stores == ("order", "slot", "tok32")
    assert {f.nodes[p].outputs[0]: init for p, init in m.scatters} == {"inv": False, "mark": True}
    epi, params = se.render(f, m, types)
    assert params == ["order", "slot", "tok32", "inv", "mark"]
    assert epi.params == ("long long", "long long", "int", "long long", "int")
    assert f"sf_i < {4096 * K + 5}LL" in epi.init  # only the longer target is filled first
    assert "e3[idx]" in epi.scatter and "e4[idx]" in epi.scatter and "e0[pos]" in epi.store
    assert "[idx]" not in epi.store and "[pos]" not in epi.scatter


@pytest.mark.parametrize("ops,outs", [
    (scatter_tail(reduce="add"), ["o"]),  # accumulation: not a permutation store
    (scatter_tail(index="q"), ["o"]),  # index is not argsort's output
])
def test_scatters_that_do_not_fit_stay_outside(ops, outs):
    f = graph("nofit", ops, outs)
    p = plan(f, 4096)
    (seg,) = fused(p)  # the sort still takes what it can (z is written at every position)
    assert not any(f.nodes[n].op.kind.value == "scatter" for n in seg.nodes)
    assert len(p.segments) == 2
    check_numpy(f, 4096)


def test_a_scatter_read_by_a_later_op_is_stored_by_the_sort_and_read_after_it():
    f = graph("read_after", scatter_tail(extra=[{"op": "add", "out": "o1", "inputs": ["o", 1]}]), ["o1"])
    p = plan(f, 4096)
    (seg,) = fused(p)  # the scatter's result is complete when the sort's launch ends
    assert any(f.nodes[n].outputs[0] == "o" for n in seg.nodes) and "o" in seg.outputs
    assert not any(f.nodes[n].outputs[0] == "o1" for n in seg.nodes)
    assert len(p.segments) == 2
    check_numpy(f, 4096)


def test_keys_made_by_a_pointwise_op_are_a_segment_input():
    f = graph("pwkey", BASE + [{"op": "neg", "out": "nf", "inputs": ["flat"]}, argsort_op(False, "nf"),
                               {"op": "floor_divide", "out": "q", "inputs": ["order", K]}], ["q"])
    p = plan(f, 4096)
    assert [s.kind.value for s in p.segments] == ["pointwise", "library"]
    seg, m, _ = matched(f, 4096)
    assert m.key == "nf" and m.stores == ("q",)
    check_numpy(f, 4096)


def test_no_match_returns_none():
    f = moe()
    types = f.bind({"topk_ids": (4096, K)}).types
    nodes = list(range(len(f.nodes)))
    outs = ["input_permutation", "output_permutation"]
    assert sep.match(f, nodes, ["topk_ids"], outs, types) is not None
    assert sep.match(f, nodes, ["topk_ids"], outs + ["flat"], types) is None  # the view is needed outside
    assert sep.match(f, nodes, [], outs, types) is None  # keys are not a segment input
    assert sep.match(f, nodes[:1] + nodes[2:], ["topk_ids"], outs, types) is None  # no argsort
    assert sep.match(f, nodes, ["topk_ids"], outs, types, copies=[object()]) is None


# ---- the kernel's source --------------------------------------------------------------------
@pytest.mark.skipif(not nvrtc.available(), reason="needs cuda-bindings (NVRTC)")
@pytest.mark.parametrize("idt", ["int32", "int64"])
@pytest.mark.parametrize("make", [moe, wide])
def test_fused_source_compiles_for_sm90(idt, make):
    f = make(idt)
    _, m, types = matched(f, 4096)
    epi, params = se.render(f, m, types)
    src, name = radix_sort.source(np.dtype(idt), epi)
    cubin, _ = nvrtc.compile_cubin(src, nvrtc.default_options("sm_90"))
    assert cubin and name.encode() in cubin
    sig = src[src.index(f" {name}("):]
    sig = sig[:sig.index(")")]
    assert sig.count(",") == 6 + len(params)  # x, n, desc, out, scratch, ctr, err, e0..
    assert "out[pos]" not in src  # the fused kernel stores only what the graph needs
    assert name != radix_sort.source(np.dtype(idt))[1]


# ---- the keys' histogram in the sort (Capability.fuse_sort_histograms) -----------------------
HIST = dataclasses.replace(DEFAULT_CAPABILITY, fuse_sort_histograms=True)
NOHIST = dataclasses.replace(DEFAULT_CAPABILITY, fuse_sort_histograms=False)


@pytest.mark.parametrize("idt", ["int32", "int64"])
@pytest.mark.parametrize("T", [4096, 16384, 65536])
def test_whole_prologue_is_one_launch_with_histograms(idt, T):
    f = _prologue(idt)
    p = plan(f, T, HIST)
    assert p.kernel_count == 1 and [s.kind.value for s in p.segments] == ["view", "library"]
    seg = p.segments[1]
    assert seg.fused_sort and set(seg.outputs) == {"counts", "offsets", "input_perm", "output_perm"}
    assert "the keys' histogram 'counts' (256 bins)" in seg.reason
    types = f.bind(shapes(f, T)).types
    m = sep.match(f, seg.nodes, seg.inputs, seg.outputs, types)
    assert (m.hist.counts, m.hist.csum, m.hist.offsets, m.hist.bins) == ("counts", "csum", "offsets", 256)
    assert set(m.hist.outputs) == {"counts", "offsets"}
    assert plan(f, T, NOHIST).kernel_count == 2  # the histogram in a kernel of its own


def test_histogram_outside_the_pattern_stays_out():
    """Not the keys' histogram: a scatter-add of 2, a target of 300 bins (more than a digit), a
    histogram of other ids, a cumsum read by a pointwise op: the sort fuses the rest only."""
    def prologue_with(**change):
        g = __import__("torch_graphs").prologue_graph("int64")
        ops = [dict(o) for o in g["ops"]]
        for o in ops:
            if o["out"] in change:
                o.update(change[o["out"]])
        return Fusion.from_json({**g, "ops": ops})

    for f in (prologue_with(ones={"value": 2}), prologue_with(zeros={"shape": [300]}),
              prologue_with(counts={"inputs": ["zeros", "flat", "ones"], "reduce": "amax"})):
        p = plan(f, 4096, HIST)
        (seg,) = fused(p)
        assert "counts" not in seg.outputs and p.kernel_count == 2
        check_numpy(f, 4096)


def _independent_with_bad(ids):
    bad = ids.copy()
    bad[5, 3] = 256
    return bad


@pytest.mark.skipif(not nvrtc.available(), reason="needs cuda-bindings (NVRTC)")
@pytest.mark.parametrize("idt", ["int32", "int64"])
def test_histogram_source_compiles_for_sm90(idt):
    f = _prologue(idt)
    p = plan(f, 4096, HIST)
    seg = p.segments[1]
    types = f.bind(shapes(f, 4096)).types
    m = sep.match(f, seg.nodes, seg.inputs, seg.outputs, types)
    epi, params = se.render(f, m, types)
    assert set(params) == {"input_perm", "output_perm", "counts", "offsets"}
    assert "scan256(sf_c, tmp)" in epi.hist and "sf_fail(sf_err, 1, 3, sf_v, 0, 256)" in epi.hist
    src, name = radix_sort.source(np.dtype(idt), epi)
    cubin, _ = nvrtc.compile_cubin(src, nvrtc.default_options("sm_90"))
    assert cubin and name.encode() in cubin
    # without a histogram the kernels' text is what it was (their cache keys unchanged)
    assert "$EPI_HIST" not in radix_sort.source(np.dtype(idt))[0]
    assert radix_sort.source(np.dtype(idt))[0].count("const unsigned g_d0 = tid < 256 ? __ldcg(&ghist[tid]) : 0u;\n") == 1


@pytest.mark.parametrize("T", [1000, 4096, 16384])
def test_histogram_plans_run_right_on_numpy(T):
    f = _prologue("int64")
    ids = np.random.default_rng(T).integers(0, 256, (T, K)).astype(np.int64)
    got = Engine(plan_cache=PlanCache(cap=HIST)).run(f, {"topk_ids": ids}).outputs
    want = _independent_prologue(ids)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)
    with pytest.raises(RunError, match="index 256 is out of bounds for dimension 0 with size 256"):
        Engine(plan_cache=PlanCache(cap=HIST)).run(f, {"topk_ids": _independent_with_bad(ids)})


def test_plain_source_is_the_plain_kernel():
    src, name = radix_sort.source("int64")
    assert "out[pos] = idx;" in src and "sf_err" not in src and "sf_cvt" not in src


# ---- the NumPy plan executor runs fused plans ---------------------------------------------
def check_numpy(f, T, seed=0, high=256):
    ids = np.random.default_rng(seed).integers(0, high, (T, K)).astype(f.inputs[0][1].dtype.np)
    name = f.inputs[0][0]
    want = run_graph(f, {name: ids.copy()})
    got = Engine().run(f, {name: ids}).outputs
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


@pytest.mark.parametrize("make", [moe, wide])
def test_fused_plans_run_on_numpy(make):
    check_numpy(make("int32"), 4096, seed=1)
    check_numpy(make("int64"), 4096, seed=2, high=3)


# ---- the runtime hook, with a stand-in for the GPU ------------------------------------------
class _DevArr(np.ndarray):
    """A NumPy array posing as a CuPy one: `.data.ptr` is its address."""

    @property
    def data(self):
        return type("Ptr", (), {"ptr": self.ctypes.data})()


class _FakeCp:
    @staticmethod
    def empty(shape, dtype):
        return np.zeros(shape, dtype).view(_DevArr)

    @staticmethod
    def ascontiguousarray(a):
        return np.ascontiguousarray(a).view(_DevArr)


def test_runtime_step_binds_and_fires_the_fused_launch_like_a_kernel_step(monkeypatch):
    """The fused sort is a step the fast paths bind with the plan's kernels and capture in their CUDA
    graphs: `bind` writes its parameter block (the key itself, no copy; the outputs; the scratch;
    the stream's counters; the error word zeroed) and launches nothing, `fire` launches once."""
    import ctypes

    from segfuse.compiler.cuda import library_sorts, prepare

    prepared, launches = [], []
    kernel = radix_sort._Kernel(0xF00, 1024, 264, 4)
    monkeypatch.setattr(radix_sort, "prepare", lambda dt, epi: prepared.append((dt, epi)))
    monkeypatch.setattr(radix_sort, "_kernel", lambda dt, epi=None: kernel)

    def coop(fptr, gx, gy, gz, bx, by, bz, smem, stream, addr):
        n = 9
        ptrs = (ctypes.c_void_p * n).from_address(addr)
        launches.append((fptr, gx, stream, [ctypes.c_uint64.from_address(p).value for p in ptrs]))

    monkeypatch.setattr(radix_sort, "_DRIVER", [(coop, None)])

    class FakeRt:
        cp = _FakeCp

    class Stream:
        ptr = 0x5157

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    class State:
        stream = Stream()
        err_ptr = 0xE220
        buffers: dict = {}

        def __init__(self):
            self.params = {radix_sort._STATE_KEY: type("L", (), {"ctr": _FakeCp.empty(8, np.uint8)})()}
            self.scratch = []

        def scratch_for(self, nbytes):
            self.scratch.append(_FakeCp.empty(nbytes, np.uint8))
            return self.scratch[-1]

    class Ctx:
        state = State()
        stream = State.stream
        sp = Stream.ptr

    f = moe("int32")
    T = 4096
    p = plan(f, T)
    types = f.bind({"topk_ids": (T, K)}).types
    prep = prepare.Prepared(p, types, [])
    step = prepare.segment_step(FakeRt(), f, p.segments[0], types, {}, prep)
    assert step.kind == "library" and prep.kernels == 1 and not prep.fallbacks
    assert step.launches_only and step.fires  # the fast paths graph it
    assert not prep.may_fail  # `order // 8` cannot fail: the run need not synchronize
    assert prepared and prepared[0][0] == np.dtype(np.int32)
    ids = _FakeCp.empty((T, K), np.int32)
    env = {"topk_ids": ids}
    rec = step.run.bind(env, Ctx())
    assert not launches  # binding launches nothing
    ctr = Ctx.state.params[radix_sort._STATE_KEY].ctr
    outs = env["input_permutation"], env["output_permutation"]
    assert [a.shape for a in outs] == [(T * K,), (T * K,)]
    grid = min(kernel.blocks, -(-T * K // radix_sort.TILE))
    want = [ids.ctypes.data, T * K, 1, 0, Ctx.state.scratch[-1].ctypes.data, ctr.ctypes.data, 0,
            outs[0].ctypes.data, outs[1].ctypes.data]  # the key itself: the input's memory, no copy
    assert list(rec[0]) == want
    step.run.fire(rec, 0xE1, Stream.ptr)
    assert launches == [(0xF00, grid, Stream.ptr, want[:6] + [0xE1] + want[7:])]
    # `run` is fire(bind): the state's error word, the state's stream
    launches.clear()
    env = {"topk_ids": ids}
    step.run(env, Ctx())
    assert launches[0][2] == Stream.ptr and launches[0][3][6] == State.err_ptr
    assert launches[0][3][7] == env["input_permutation"].ctypes.data
    # a key laid out with gaps: each run copies it (in the run's stream) and the step is not graphed
    strided = {"topk_ids": (2 * K, 1)}
    prep_s = prepare.Prepared(p, types, [])
    step_s = prepare.segment_step(FakeRt(), f, p.segments[0], types, dict(strided), prep_s)
    assert not step_s.launches_only and step_s.run.__name__ == "run_copying"
    # a checked divisor makes the plan one that may fail
    div0 = graph("div0", BASE + [argsort_op(False), {"op": "floor_divide", "out": "q", "inputs": ["order", 0]}],
                 ["q"])
    p0 = plan(div0, T)
    prep0 = prepare.Prepared(p0, div0.bind(shapes(div0, T)).types, [])
    assert prepare.segment_step(FakeRt(), div0, p0.segments[0], prep0.types, {}, prep0).kind == "library"
    assert prep0.may_fail and prep0.kernels == 1
    # a segment the sort epilogue pass did not make is not taken
    other = dataclasses.replace(p.segments[0], sort_epilogue=None)
    assert library_sorts.sort_epilogue_run(FakeRt(), f, other, types) is None
