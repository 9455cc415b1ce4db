"""Every kernel the test corpus generates compiles with offline NVRTC to an sm_90 cubin.

No GPU needed: `cuda.bindings.nvrtc` (the `nvrtc` extra) compiles in-process. The corpus covers
every op, every dtype, every segment kind (real segmenter plans, plus forced grid-mode and
single-block lowerings), both index widths, and the benchmark graphs. Kernels are deduplicated
by source and compiled in batches (one prelude per compile unit) to keep this fast on 2 cores.
"""

from __future__ import annotations

import concurrent.futures as cf

import numpy as np
import pytest

pytest.importorskip("cuda.bindings.nvrtc")

from corpus import all_cases, case_inputs, modules_for, moe_graphs  # noqa: E402
from segfuse.compiler.codegen.lazy import Unsupported  # noqa: E402
from segfuse.compiler.codegen.prelude import one_program  # noqa: E402
from segfuse.compiler.codegen.segment import generate  # noqa: E402
from segfuse.compiler.cuda.nvrtc import CompileError, compile_cubin  # noqa: E402
from segfuse.compiler.engine import Engine  # noqa: E402
from segfuse.compiler.ir import Fusion  # noqa: E402

BATCH = 48


def _big_cases():
    """Shapes only (no data): 64-bit indexing and the benchmark sizes."""
    big = 2**31 + 8
    g64 = {"format": "segfuse.fusion/1", "name": "big", "inputs": [{"name": "x", "dtype": "int8", "shape": [big]},
                                                                   {"name": "b", "dtype": "bool", "shape": [big]}],
           "ops": [{"op": "add", "out": "y", "inputs": ["x", 1]}, {"op": "logical_not", "out": "nb", "inputs": ["b"]},
                   {"op": "sum", "out": "s", "inputs": ["x"]}],
           "outputs": ["y", "nb", "s"]}
    chain = {"format": "segfuse.fusion/1", "name": "chain",
             "inputs": [{"name": n, "dtype": "float32", "shape": [2**28]} for n in "abc"],
             "ops": [{"op": "gt", "out": "p", "inputs": ["a", 0]}, {"op": "mul", "out": "ab", "inputs": ["a", "b"]},
                     {"op": "add", "out": "abc", "inputs": ["ab", "c"]}, {"op": "exp", "out": "e", "inputs": ["c"]},
                     {"op": "mul", "out": "h", "inputs": ["e", 0.5]}, {"op": "where", "out": "o", "inputs": ["p", "abc", "h"]}],
             "outputs": ["o"]}
    hist = {"format": "segfuse.fusion/1", "name": "hist",
            "inputs": [{"name": "dst", "dtype": "float32", "shape": ["M"]}, {"name": "i", "dtype": "int64", "shape": ["N"]},
                       {"name": "v", "dtype": "float32", "shape": ["N"]}],
            "ops": [{"op": "scatter", "out": "o", "inputs": ["dst", "i", "v"], "dim": 0, "reduce": "add"}],
            "outputs": [{"name": "o", "alias_of": "dst"}]}
    out = [(g64, {"x": (big,), "b": (big,)}), (chain, {n: (2**28,) for n in "abc"})]
    for m in (256, 2**24):
        out.append((hist, {"dst": (m,), "i": (2**26,), "v": (2**26,)}))
    for idt in ("int64", "int32"):
        for g, _ in moe_graphs(idt=idt):
            for T in (4096, 65536):
                shp = {"topk_ids": (T, 8)} if "topk_ids" in str(g["inputs"]) else {"tokens_per_expert": (256,)}
                out.append((g, shp))
    return out


@pytest.fixture(scope="module")
def sources():
    srcs: dict[str, str] = {}
    eng = Engine("numpy")
    for case in all_cases():
        f = Fusion.from_json(case[1])
        ins = case_inputs(case)
        for mode in ("grid", "block"):
            if mode == "block" and case[0].startswith(("pw_", "mv_")):
                continue  # the same expressions as in grid mode; keeps this test fast on 2 cores
            for m in modules_for(f, ins, mode):
                if not isinstance(m, Unsupported):
                    srcs.setdefault(m.source, f"{case[0]}/{mode}")
        _plan_sources(eng, f, {k: np.shape(v) for k, v in ins.items()}, case[0], srcs)
    for g, shapes in _big_cases():
        _plan_sources(eng, Fusion.from_json(g), shapes, g["name"], srcs)
    return srcs


def _plan_sources(eng, f, shapes, name, srcs):
    types = f.bind(shapes).types
    for seg in eng.plan(f, shapes).segments:
        try:
            m = generate(f, seg, types, single_block=seg.kind.value == "single_block")
        except Unsupported:
            continue  # the runtime splits these segments; the pieces are compiled in grid mode
        srcs.setdefault(m.source, f"{name}/plan")


def test_corpus_is_broad(sources):
    assert len(sources) > 300
    assert any("long long l =" in s for s in sources), "no 64-bit index variant generated"
    assert any("sf_v4<float>" in s for s in sources), "no vectorized pointwise kernel generated"
    assert any("sf_atomic<sf_op_add, int, int>" in s or "sf_atomic<sf_op_add, float, float>" in s for s in sources)


def test_no_user_names_in_source(sources):
    for s in sources:
        for bad in ("topk_ids", "dst_updated", "input_permutation", "expert_offsets"):
            assert bad not in s


def _compile_batch(batch):
    src = one_program(batch)
    try:
        cubin, _ = compile_cubin(src)
    except CompileError as e:
        return e.log[:4000]
    return None if cubin[:4] == b"\x7fELF" else "not an ELF cubin"


@pytest.mark.timeout(1500)  # ~1,500 distinct sources: minutes of NVRTC on a 2-core CI machine
def test_every_kernel_compiles_to_sm90_cubin(sources):
    items = sorted(sources)
    batches = [items[i:i + BATCH] for i in range(0, len(items), BATCH)]
    failures = []
    # processes, not threads: NVRTC holds the GIL through cuda.bindings
    import multiprocessing as mp
    import os

    ctx = mp.get_context("fork") if hasattr(os, "fork") else None
    with cf.ProcessPoolExecutor(max(2, min(4, os.cpu_count() or 2)), mp_context=ctx) as ex:
        for batch, err in zip(batches, ex.map(_compile_batch, batches)):
            if err:
                failures.append((sorted({sources[s] for s in batch})[:6], err))
    assert not failures, "\n\n".join(f"{names}:\n{err}" for names, err in failures[:3])


def test_kernel_cache_single_flight_disk_and_counters(tmp_path):
    """Concurrent requests for one kernel compile it once; a new cache on the same directory
    (a restarted server) loads the cubin from disk without compiling."""
    import threading

    from segfuse.compiler.cuda.cache import KernelCache

    f = Fusion.from_json(all_cases()[0][1])
    src = modules_for(f, case_inputs(all_cases()[0]), "grid")[0].source
    cache = KernelCache(str(tmp_path))
    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.get(src))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert cache.stats.misses == 1 and cache.stats.hits == 3
    assert len({id(r) for r in results}) == 1 and results[0][:4] == b"\x7fELF"
    assert cache.stats.compile_s > 0
    again = KernelCache(str(tmp_path))
    assert again.get(src) == results[0]
    assert again.stats.misses == 0 and again.stats.disk_hits == 1


def test_index_width_variants():
    """Sizes decide the index type: 32-bit below 2^31 elements, 64-bit above (separate sources)."""
    g = {"format": "segfuse.fusion/1", "name": "w", "inputs": [{"name": "x", "dtype": "int8", "shape": ["N"]}],
         "ops": [{"op": "add", "out": "y", "inputs": ["x", 1]}], "outputs": ["y"]}
    f = Fusion.from_json(g)
    small = modules_for(f, {"x": np.zeros(16, np.int8)}, "grid")[0]
    big_types = f.bind({"x": (2**31 + 8,)}).types
    from segfuse.compiler.plan import Segment, SegmentKind

    big = generate(f, Segment(0, SegmentKind.pointwise, [0], ["x"], ["y"], "t"), big_types)
    assert small.index_bits == 32 and big.index_bits == 64
    assert "long long l =" in big.source and "long long l =" not in small.source


def test_split_lowering_covers_single_block_segments():
    """A segment the codegen cannot emit in one block is split per anchor; every piece generates."""
    from segfuse.compiler.plan import Segment, SegmentKind
    from segfuse.compiler.segmenter.reference import split_nodes

    for g, mk in moe_graphs():
        f = Fusion.from_json(g)
        ins = mk(64)(np.random.default_rng(0))
        types = f.bind({k: v.shape for k, v in ins.items()}).types
        outs = [o.name for o in f.outputs]
        groups = split_nodes(f, list(range(len(f.nodes))), list(ins), outs)
        made = set(ins)
        for nodes, gins, gouts in groups:
            assert set(gins) <= made
            generate(f, Segment(0, SegmentKind.pointwise, nodes, gins, gouts, "split"), types)
            made.update(gouts)
        assert set(outs) <= made


def test_block_radix_sort_compiles(monkeypatch):
    """The single-block radix sort (off by default, see segment.RADIX_MIN) still compiles."""
    from segfuse.compiler.codegen import segment as segmod
    from segfuse.compiler.plan import Segment, SegmentKind

    monkeypatch.setattr(segmod, "RADIX_MIN", 2048)
    for g, _ in moe_graphs():
        if g["name"] != "moe_argsort":
            continue
        f = Fusion.from_json(g)
        types = f.bind({"topk_ids": (4096, 8)}).types
        seg = Segment(0, SegmentKind.single_block, list(range(len(f.nodes))), ["topk_ids"],
                      ["input_permutation", "output_permutation"], "t")
        m = generate(f, seg, types, single_block=True)
        assert "radix sort" in m.source and len(m.launches) == 1
        compile_cubin(m.source)
