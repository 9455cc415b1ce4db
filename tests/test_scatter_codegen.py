"""Grid scatter codegen (compiler/codegen/scatter.py) without a GPU: which variants are emitted
(vector loads, privatized histograms, L2 windows) for which shapes, and that every dtype/reduce/
index-width combination of them compiles to an sm_90 cubin. The GPU results are checked against
PyTorch in tests/gpu/test_scatter_gpu.py."""

from __future__ import annotations

import pytest
from corpus import scatter_graph
from segfuse.compiler.codegen import scatter as sc
from segfuse.compiler.codegen.prelude import PRELUDE
from segfuse.compiler.codegen.segment import generate
from segfuse.compiler.ir import Fusion
from segfuse.compiler.segmenter.reference import simple_plan


def _graph(dt="float32", idt="int64", reduce="add", include_self=True, rank=1, alias=False):
    return Fusion.from_json(scatter_graph(dt, idt, reduce, include_self, alias, rank))


def _module(f, shapes, strides=None, aliased=()):
    types = f.bind(shapes).types
    segs = [s for s in simple_plan(f, types, small=-1).segments if s.nodes]
    assert len(segs) == 1
    return generate(f, segs[0], types, strides, aliased=set(aliased))


def _kernels(m):
    return [ln for ln in m.launches]


def test_histogram_gets_a_vector_variant_before_the_scalar_kernel():
    m = _module(_graph(), {"dst": (256,), "i": (1 << 20,), "v": (1 << 20,)}, aliased={"o"})
    vec = [ln for ln in m.launches if ln.vector_of]
    assert len(vec) == 1 and vec[0].block == sc.HIST_THREADS and vec[0].smem > 0
    k = m.launches.index(vec[0])
    assert m.launches[k + 1].kernel == vec[0].vector_of and m.launches[k + 1].smem == vec[0].smem
    assert vec[0].grid % 132 == 0 or vec[0].grid < 132
    assert "__ldcs((const uint4*)" in m.source


def test_strided_or_broadcast_sources_get_no_vector_variant():
    f = _graph()
    shapes = {"dst": (256,), "i": (1 << 20,), "v": (1 << 20,)}
    m = _module(f, shapes, strides={"dst": (1,), "i": (2,), "v": (1,)}, aliased={"o"})
    assert not any(ln.vector_of for ln in m.launches)
    m = _module(f, shapes, strides={"dst": (1,), "i": (1,), "v": (0,)}, aliased={"o"})
    assert not any(ln.vector_of for ln in m.launches)


@pytest.mark.parametrize("nw", [1, 2, 4, 8])
def test_window_count_follows_target_bytes(monkeypatch, nw):
    monkeypatch.setattr(sc, "WINDOW_BYTES", (64 << 20) // nw)
    f = _graph()
    shapes = {"dst": (1 << 24,), "i": (1 << 26,), "v": (1 << 26,)}
    m = _module(f, shapes, aliased={"o"})
    assert len(m.launches) == 2 * nw  # (vector, scalar) per window, no init (aliased)
    assert sum(1 for ln in m.launches if ln.vector_of) == nw
    m = _module(f, shapes)  # not aliased: each window is initialized right before its pass
    assert len(m.launches) == 3 * nw


def test_few_sources_or_many_windows_make_one_pass(monkeypatch):
    f = _graph()
    m = _module(f, {"dst": (1 << 24,), "i": (1 << 16,), "v": (1 << 16,)}, aliased={"o"})
    assert len(m.launches) == 2
    monkeypatch.setattr(sc, "WINDOW_BYTES", 1 << 20)  # 64 windows > MAX_WINDOWS
    m = _module(f, {"dst": (1 << 24,), "i": (1 << 26,), "v": (1 << 26,)}, aliased={"o"})
    assert len(m.launches) == 2


def _variants():
    out = []
    for dt in ("float32", "float64", "float16", "bfloat16", "int32", "int64", "int8", "uint8"):
        for red in ("add", "mul", "amax", "amin"):
            out.append((dt, "int64", red, True, 1))
    for idt in ("int32", "int64"):
        out.append(("float32", idt, "add", False, 1))
        out.append(("float32", idt, "amax", True, 2))
    return out


def test_every_variant_compiles(monkeypatch):
    nvrtc = pytest.importorskip("cuda.bindings.nvrtc")  # noqa: F841
    from segfuse.compiler.cuda.nvrtc import compile_cubin

    monkeypatch.setattr(sc, "WINDOW_BYTES", 1 << 14)
    monkeypatch.setattr(sc, "WINDOW_MIN_SOURCES", 1)
    srcs = []
    for dt, idt, red, inc, rank in _variants():
        f = _graph(dt, idt, red, inc, rank)
        lead = (3,) if rank == 2 else ()
        for bins, n in ((256, 4099 * 8), (10000, 4099)):  # privatized histogram; windowed atomics
            m = _module(f, {"dst": lead + (bins,), "i": lead + (n,), "v": lead + (n,)})
            assert any(ln.vector_of for ln in m.launches), (dt, idt, red, bins)
            srcs.append(m.source)
    # a 64-bit index variant of both paths
    f = _graph()
    for bins in (256, 1 << 24):
        m = _module(f, {"dst": (bins,), "i": (2**31 + 5,), "v": (2**31 + 5,)})
        assert "long long sf_g0" in m.source
        srcs.append(m.source)
    unit = PRELUDE + "".join(s[len(PRELUDE):] for s in srcs)
    cubin, _ = compile_cubin(unit)
    assert cubin[:4] == b"\x7fELF"


def _moe_histogram(T: int, idt: str):
    import numpy as np
    from corpus import moe_graphs
    from segfuse.compiler.segmenter import segment

    g, mk = moe_graphs(idt=idt)[0]
    f = Fusion.from_json(g)
    bound = f.bind({k: v.shape for k, v in mk(T)(np.random.default_rng(0)).items()})
    (seg,) = segment(f, bound).segments
    return generate(f, seg, dict(bound.types), None, single_block=True, sm_count=132)


@pytest.mark.parametrize("idt", ["int64", "int32"])
@pytest.mark.parametrize("T, blocks", [(128, 1), (2048, 1), (3000, 1), (3500, 4), (4096, 4)])
def test_long_single_block_histograms_share_their_sources_across_blocks(T, blocks, idt):
    """One SM's loads bound a one-block histogram of T*8 ids; from 3 batches of 1024 threads on,
    blocks share the sources and the last one to finish combines their partial histograms (kept
    in scratch) and writes the counts. 32-bit counters: the ones the MoE histogram adds fit."""
    from segfuse.compiler.codegen.scatter_block import HIST_BLOCK_SOURCES

    m = _moe_histogram(T, idt)
    (ln,) = m.launches
    assert ln.grid == blocks and ln.block == 1024
    assert ("atomicAdd(sf_ctr, 1u)" in m.source) is (blocks > 1)
    assert m.scratch_bytes == (blocks * 256 * 4 if blocks > 1 else 0)
    assert blocks == 1 or (blocks - 1) * HIST_BLOCK_SOURCES < T * 8 <= blocks * HIST_BLOCK_SOURCES
    assert "sf_atomic<sf_op_add, int, int>" in m.source


def test_multi_block_histograms_compile():
    pytest.importorskip("cuda.bindings.nvrtc")
    from segfuse.compiler.cuda.nvrtc import compile_cubin

    for idt in ("int64", "int32"):
        compile_cubin(_moe_histogram(4096, idt).source)
