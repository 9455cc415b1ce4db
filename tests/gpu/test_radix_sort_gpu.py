"""Our radix argsort (compiler/cuda/radix_sort.py) against torch CPU's stable argsort: every dtype,
both orders, sizes from 1 to 2^22, duplicates, all-equal rows, full-range keys, negative values,
floats with NaN / +-inf / +-0.0, keys whose low or middle digit is constant (skipped passes),
a non-default stream; two streams used alternately without syncs and threads with their own
streams (each stream has its own counters, which every launch leaves zeroed); long-row sort / argsort /
topk graphs and the MoE argsort fusion through Engine("cupy") (the runtime's thread-state path)
against NumPy; and a grid too large to be resident, which the cooperative launch refuses and the host
retries smaller (last: with a plain launch it would hang)."""

from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")
torch = pytest.importorskip("torch")

from corpus import moe_graphs  # noqa: E402
from segfuse.compiler.codegen import radix_sort as radix_text  # noqa: E402
from segfuse.compiler.cuda import radix_sort  # noqa: E402
from segfuse.compiler.engine import Engine  # noqa: E402
from segfuse.compiler.ir import Fusion  # noqa: E402
from segfuse.compiler.numpy_backend import run_graph  # noqa: E402

pytestmark = pytest.mark.gpu

DTYPES = list(radix_text.SUPPORTED)
FLOATS = ("float16", "float32", "float64")


def oracle(h: np.ndarray, desc: bool) -> np.ndarray:
    h = np.ascontiguousarray(h)
    if h.dtype == np.uint64:  # torch's parallel CPU sort has no unsigned kernels: split into exact halves
        hi, lo = (h >> np.uint64(32)).astype(np.int64), (h & np.uint64(0xFFFFFFFF)).astype(np.int64)
        s = -1 if desc else 1
        return np.lexsort((np.arange(h.size), s * lo, s * hi)).astype(np.int64)  # ties: by position
    if h.dtype in (np.uint16, np.uint32):
        h = h.astype(np.int64)  # exact, same order
    return torch.argsort(torch.from_numpy(h), descending=desc, stable=True).numpy()


def ours(h: np.ndarray, desc: bool) -> np.ndarray:
    x = cp.asarray(h)
    assert radix_text.supported(x, 0)
    r = radix_sort.argsort(cp, x, 0, desc)
    assert r.dtype == np.int64 and r.shape == h.shape
    return cp.asnumpy(r)


def check(h, desc, what=""):
    got, want = ours(h, desc), oracle(h, desc)
    if not np.array_equal(got, want):
        bad = np.nonzero(got != want)[0]
        pytest.fail(f"{what} {h.dtype} n={h.size} desc={desc}: {bad.size} wrong, first at {bad[:5]}: "
                    f"got {got[bad[:5]]} want {want[bad[:5]]}")


def full_range(dt: str, n: int, rng) -> np.ndarray:
    d = np.dtype(dt)
    if dt == "bool":
        return rng.integers(0, 2, n).astype(bool)
    if d.kind == "f":  # every bit pattern: NaNs of any payload and sign, infinities, subnormals, -0.0
        u = np.dtype(f"uint{8 * d.itemsize}")
        return rng.integers(0, np.iinfo(u).max, n, dtype=u, endpoint=True).view(d)
    info = np.iinfo(d)
    return rng.integers(info.min, info.max, n, dtype=d, endpoint=True)


@pytest.mark.parametrize("n", [1, 2, 1000, 70000, 524288, 1 << 22])
@pytest.mark.parametrize("dt", DTYPES)
def test_full_range(dt, n):
    h = full_range(dt, n, np.random.default_rng(n))
    for desc in (False, True):
        check(h, desc, "full range")


def _pattern(name, dt, n, rng):
    d = np.dtype(dt)
    if name == "dups":
        return rng.integers(0, 4, n).astype(d)
    if name == "all_equal":
        return np.full(n, 3 if dt != "bool" else 1, d)
    if name == "negative":
        return rng.integers(-1000, 1000, n).astype(d)
    if name == "moe_ids":
        return rng.integers(0, 256, n).astype(d)
    if name == "low_digit_constant":  # digit 0 is 7 everywhere: that pass is skipped
        return (rng.integers(0, 256, n) * 256 + 7).astype(d)
    if name == "middle_digit_constant":  # digit 1 constant between two sorted digits
        return (rng.integers(0, 128, n) * 65536 + 5 * 256 + rng.integers(0, 256, n)).astype(d)
    if name == "specials":
        v = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 1e-40, -1e-40, 65504.0], d)
        return v[rng.integers(0, v.size, n)]
    raise AssertionError(name)


PATTERNS = [
    ("dups", DTYPES), ("all_equal", DTYPES),
    ("negative", ["int16", "int32", "int64"] + list(FLOATS)),
    ("moe_ids", ["uint8", "int16", "int32", "int64", "uint32", "uint64", "float32"]),
    ("low_digit_constant", ["int32", "int64", "uint32", "uint64"]),
    ("middle_digit_constant", ["int32", "int64", "uint64", "float64"]),
    ("specials", list(FLOATS)),
]


@pytest.mark.parametrize("n", [70000, 524288])
@pytest.mark.parametrize("name,dt", [(p, d) for p, ds in PATTERNS for d in ds])
def test_patterns(name, dt, n):
    h = _pattern(name, dt, n, np.random.default_rng(7))
    for desc in (False, True):
        check(h, desc, name)


def test_rows_of_other_shapes_and_a_side_stream():
    rng = np.random.default_rng(3)
    h = rng.integers(0, 50, (1, 100000)).astype(np.int32)
    with cp.cuda.Stream(non_blocking=True) as s:
        r = radix_sort.argsort(cp, cp.asarray(h), 1, True)
        s.synchronize()
    want = torch.argsort(torch.from_numpy(h), dim=1, descending=True, stable=True).numpy()
    np.testing.assert_array_equal(cp.asnumpy(r), want)
    # a strided view is sorted as its values
    big = rng.standard_normal(200000).astype(np.float32)
    np.testing.assert_array_equal(ours(big[::2], False), oracle(big[::2], False))


def test_runtime_dispatch_keeps_multi_row_fallback():
    from segfuse.compiler.cuda.library_sorts import argsort as _argsort

    h = np.random.default_rng(4).integers(0, 9, (3, 5000)).astype(np.int64)
    for desc in (False, True):
        got = cp.asnumpy(_argsort(cp, cp.asarray(h), 1, desc))
        want = torch.argsort(torch.from_numpy(h), dim=1, descending=desc, stable=True).numpy()
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("idt", ["int64", "int32"])
def test_moe_argsort_fusion(idt, monkeypatch):
    calls = []
    real = radix_sort.FusedStep.bind

    def spy(self, x, outputs, state):
        calls.append(x.size)
        return real(self, x, outputs, state)

    # the fused sort is a plan step that binds and fires like a kernel (its launch may be replayed
    # from a CUDA graph): every run on new inputs binds it
    monkeypatch.setattr(radix_sort.FusedStep, "bind", spy)
    g, mk = moe_graphs(idt=idt)[-1]
    assert g["name"] == "moe_argsort"
    f = Fusion.from_json(g)
    T = 65536
    eng = Engine("cupy")
    for seed in (11, 12, 13):  # the 2nd call onwards takes the per-signature fast path
        ins = {k: cp.asarray(v) for k, v in mk(T)(np.random.default_rng(seed)).items()}
        want = run_graph(f, {k: cp.asnumpy(v) for k, v in ins.items()})
        got = eng.run(f, ins).outputs
        for k in want:
            np.testing.assert_array_equal(cp.asnumpy(got[k]), want[k], err_msg=f"moe_argsort {idt} {k} seed {seed}")
    assert len(calls) >= 3 and set(calls) == {T * 8}  # every sort ran through our kernel
    from segfuse.compiler.cuda.runtime import get_runtime

    st = get_runtime()._thread_state()
    st.stream.synchronize()
    assert not cp.asnumpy(st.params[radix_sort._STATE_KEY].ctr).any()  # left zeroed for the next call


def _lib_graph(dt, n):
    from corpus import _graph

    ops = [{"op": "argsort", "out": "a", "inputs": ["x"], "dim": 0, "descending": True, "stable": True},
           {"op": "sort", "out": ["sv", "si"], "inputs": ["x"], "dim": 0, "stable": True},
           {"op": "topk", "out": ["tv", "ti"], "inputs": ["x"], "k": 1000, "dim": 0},
           {"op": "topk", "out": ["bv", "bi"], "inputs": ["x"], "k": 37, "dim": 0, "largest": False}]
    return Fusion.from_json(_graph(f"lib_{dt}", [{"name": "x", "dtype": dt, "shape": [n]}], ops,
                                   ["a", "sv", "si", "tv", "ti", "bv", "bi"]))


@pytest.mark.parametrize("dt", ["float32", "int64", "int16"])
def test_long_row_sort_argsort_topk_graphs(dt):
    n = 300000  # longer than any in-kernel sort: library steps
    rng = np.random.default_rng(5)
    h = (rng.integers(-500, 500, n) if dt != "float32" else rng.standard_normal(n).round(2)).astype(dt)
    f = _lib_graph(dt, n)
    want = run_graph(f, {"x": h.copy()})
    eng = Engine("cupy")
    for _ in range(2):
        got = eng.run(f, {"x": cp.asarray(h)}).outputs
        for k in want:
            np.testing.assert_array_equal(cp.asnumpy(got[k]), want[k], err_msg=f"{dt} {k}")


def test_two_streams_alternately_without_syncs():
    rng = np.random.default_rng(8)
    hs = [rng.integers(-1000, 1000, 300000 + 4096 * i).astype(np.int64 if i % 2 else np.int32) for i in range(8)]
    xs = [cp.asarray(h) for h in hs]
    cp.cuda.Device().synchronize()
    s1, s2 = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    res = []
    for i, x in enumerate(xs):
        with (s1 if i % 3 else s2):
            res.append(radix_sort.argsort(cp, x, 0, i % 4 == 1))
    s1.synchronize()
    s2.synchronize()
    for i, (h, r) in enumerate(zip(hs, res)):
        np.testing.assert_array_equal(cp.asnumpy(r), oracle(h, i % 4 == 1), err_msg=f"call {i}")
    for s in (s1, s2):
        assert not cp.asnumpy(radix_sort._stream_launch(cp, s).ctr).any()


def test_threads_with_their_own_streams():
    from concurrent.futures import ThreadPoolExecutor

    def work(seed):
        rng = np.random.default_rng(seed)
        with cp.cuda.Stream(non_blocking=True) as s:
            outs = []
            for j in range(6):
                h = rng.integers(0, 256 if j % 2 else 1 << 20, 200000 + 10000 * j).astype(np.int32 if seed % 2 else np.int64)
                outs.append((h, j % 3 == 0, radix_sort.argsort(cp, cp.asarray(h), 0, j % 3 == 0)))
            s.synchronize()
            return [(h, d, cp.asnumpy(r)) for h, d, r in outs]

    with ThreadPoolExecutor(4) as ex:
        for got in ex.map(work, range(4)):
            for h, d, r in got:
                np.testing.assert_array_equal(r, oracle(h, d))


def test_zz_grid_too_large_to_be_resident_is_refused_and_retried_smaller(monkeypatch):
    from cupy.cuda import driver
    from segfuse.compiler.cuda.runtime import get_runtime

    # a driver-API query needs this thread's context current: a runtime-API call (the upload) makes
    # it so (on the GPU, this test alone in a process failed with CUDA_ERROR_INVALID_CONTEXT)
    np.testing.assert_array_equal(ours(np.arange(5000, dtype=np.int32), True), np.arange(5000)[::-1])
    k = radix_sort._kernel(np.int32)
    resident = driver.occupancyMaxActiveBlocksPerMultiprocessor(k.fptr, radix_sort.THREADS, k.smem) * \
        get_runtime().sm_count
    monkeypatch.setattr(k, "blocks", 4 * resident)  # as if the occupancy query had overcounted
    h = np.random.default_rng(9).integers(0, 1000, 4 * resident * radix_sort.TILE + 1).astype(np.int32)
    r = radix_sort.argsort(cp, cp.asarray(h), 0, False)
    np.testing.assert_array_equal(cp.asnumpy(r), oracle(h, False))
    assert k.blocks <= resident
