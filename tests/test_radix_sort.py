"""The radix argsort's generated kernels (compiler/cuda/radix_sort.py) on the CPU: every dtype's
source compiles to sm_90 with NVRTC, names are content hashes in the codegen's form, and the
dispatch predicate takes exactly whole 1-D rows. Results are checked on the GPU
(tests/gpu/test_radix_sort_gpu.py)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from segfuse.compiler.codegen import radix_sort as radix_text
from segfuse.compiler.cuda import nvrtc, radix_sort


@pytest.mark.skipif(not nvrtc.available(), reason="needs cuda-bindings (NVRTC)")
@pytest.mark.parametrize("dtype", radix_text.SUPPORTED)
def test_source_compiles_for_sm90(dtype):
    src, name = radix_text.source(dtype)
    cubin, _ = nvrtc.compile_cubin(src, nvrtc.default_options("sm_90"))
    assert cubin and name.encode() in cubin


def test_names_are_hashes_and_sources_differ_per_dtype():
    seen = {}
    for dt in radix_text.SUPPORTED:
        src, name = radix_text.source(dt)
        assert re.fullmatch(r"sf_k_[0-9a-f]{16}_0", name)
        assert f" {name}(" in src and "__global__" in src
        assert radix_text.source(dt) == (src, name)  # deterministic: the disk cache finds it again
        seen[name] = dt
    assert len(seen) == len(radix_text.SUPPORTED)


def test_supported_rows():
    s = radix_text.supported
    assert s(np.zeros(10, np.int64), 0)
    assert s(np.zeros((1, 10), np.float32), 1)  # a single row along the sort axis
    assert s(np.zeros((10, 1), np.uint8), 0)
    assert s(np.zeros(3, bool), 0)
    assert not s(np.zeros((2, 10), np.int64), 1)  # several rows: CuPy's segmented sort
    assert not s(np.zeros(0, np.int64), 0)
    assert not s(np.zeros(4, np.complex64), 0)


def test_shared_memory_fits_two_blocks_per_sm():
    # the grid barrier relies on every block being resident: two per H100/H200 SM (228 KiB)
    for kb in (4, 8):
        assert 2 * (radix_text.smem_bytes(kb) + 1024) <= 228 * 1024


def test_takes_matches_supported():
    for shape, dt, ax in (((10,), np.int64, 0), ((1, 10), np.float32, 1), ((2, 10), np.int64, 1),
                          ((0,), np.int32, 0), ((4,), np.complex64, 0), ((3,), "bfloat16", 0)):
        try:
            a = np.zeros(shape, dt)
        except TypeError:
            assert not radix_text.takes(shape, dt, ax)
            continue
        assert radix_text.takes(shape, dt, ax) == radix_text.supported(a, ax)


def test_kernel_takes_six_parameters_and_clears_its_counters():
    # the host's parameter block has six slots: x, n, desc, out, scratch, counters
    src, name = radix_text.source("int32")
    sig = src[src.index(f" {name}("):]
    sig = sig[:sig.index(")")]
    assert sig.count(",") == 5
    assert "atomicAdd(&bar[1], 1u) == gridDim.x - 1" in src  # the last block out clears the counters
    assert radix_text.CTR_BYTES == 8 * 256 * 4 + 2 * 8 + 2 * 4


class _Ptr:
    def __init__(self, ptr):
        self.ptr = ptr


class _Arr:
    """Enough of a CuPy array for radix_sort.argsort's host side."""

    _next = [1 << 20]

    def __init__(self, n, dtype, shape=None):
        self.dtype = np.dtype(dtype)
        self.size = n
        self.shape = shape or (n,)
        self.itemsize = self.dtype.itemsize
        self.strides = (self.itemsize,) * len(self.shape)
        self.data = _Ptr(_Arr._next[0])
        _Arr._next[0] += 1 << 24

    def reshape(self, *shape):
        a = _Arr(self.size, self.dtype, shape if shape != (-1,) else (self.size,))
        a.data = self.data
        return a


class _Stream:
    ptr = 0x5157

    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


class _FakeCp:
    class cuda:
        _stream = _Stream()

        @staticmethod
        def get_current_stream():
            return _FakeCp.cuda._stream

    @staticmethod
    def empty(n, dtype):
        return _Arr(n, dtype)

    zeros = empty

    @staticmethod
    def ascontiguousarray(a):
        return a


def test_host_side_fills_the_parameter_block_and_shrinks_a_grid_the_device_refuses(monkeypatch):
    import ctypes

    class DriverError(Exception):
        def __init__(self, status):
            self.status = status

    class Driver:
        CUDADriverError = DriverError

    limit = 50  # co-resident blocks on the pretend device (the occupancy query said more)
    launches = []

    def coop(fptr, gx, gy, gz, bx, by, bz, smem, stream, addr):
        if gx > limit:
            raise DriverError(720)
        ptrs = (ctypes.c_void_p * 6).from_address(addr)
        launches.append((fptr, gx, bx, smem, stream, [ctypes.c_uint64.from_address(p).value for p in ptrs]))

    monkeypatch.setattr(radix_sort, "_DRIVER", [(coop, Driver)])
    k = radix_sort._Kernel(0xF00, radix_text.smem_bytes(4), 264, 4)
    monkeypatch.setitem(radix_sort._KERNELS, np.dtype(np.int32), k)
    monkeypatch.setattr(radix_sort, "_TLS", __import__("threading").local())
    n = 300 * radix_sort.TILE
    x = _Arr(n, np.int32)
    out = radix_sort.argsort(_FakeCp, x, 0, True)
    assert out.dtype == np.int64 and out.shape == (n,)
    (fptr, gx, bx, smem, stream, vals), = launches
    assert (fptr, bx, smem, stream) == (0xF00, radix_sort.THREADS, k.smem, _Stream.ptr)
    assert 0 < gx <= limit and k.blocks == gx  # halved until the driver took it, and remembered
    ctr = radix_sort._TLS.by_stream[_Stream.ptr].ctr
    assert vals[:4] == [x.data.ptr, n, 1, out.data.ptr] and vals[5] == ctr.data.ptr
    # the next call on this stream reuses the block and counters; only the changed slots move
    y = _Arr(n, np.int32)
    out2 = radix_sort.argsort(_FakeCp, y, 0, False)
    assert launches[1][1] == gx and launches[1][5][:4] == [y.data.ptr, n, 0, out2.data.ptr]
    assert launches[1][5][5] == ctr.data.ptr

    # other errors propagate at once
    def broken(*a):
        raise DriverError(999)

    monkeypatch.setattr(radix_sort, "_DRIVER", [(broken, Driver)])
    with pytest.raises(DriverError):
        radix_sort.argsort(_FakeCp, x, 0, True)


def test_runtime_state_holds_the_parameter_block_and_lends_the_scratch(monkeypatch):
    class Driver:
        class CUDADriverError(Exception):
            pass

    seen = []
    monkeypatch.setattr(radix_sort, "_DRIVER", [(lambda *a: seen.append(a), Driver)])
    monkeypatch.setitem(radix_sort._KERNELS, np.dtype(np.int64), radix_sort._Kernel(1, 2, 264, 8))

    class State:
        stream = _Stream()
        params: dict = {}
        asked = []

        def scratch_for(self, nbytes):
            self.asked.append(nbytes)
            return _Arr(nbytes, np.uint8)

    st = State()
    n = 100000
    radix_sort.argsort(_FakeCp, _Arr(n, np.int64, (1, n)), 1, False, st)
    grid = -(-n // radix_sort.TILE)
    assert st.asked == [radix_text.scratch_bytes(n, 8, grid)] and seen[0][1] == grid
    assert radix_sort._STATE_KEY in st.params
