"""Launching our multi-block radix argsort (its text: compiler/codegen/radix_sort.py) from the host.

Launch: cooperative (cuLaunchCooperativeKernel), so a grid that cannot be resident all at once
(MPS, other work on the SMs) fails at launch, and is retried smaller, instead of hanging at a
barrier. Host cost per call is kept to the output allocation and one driver call: a parameter
block per stream (or per runtime thread state) whose slots are rewritten in place, scratch from the
runtime thread's scratch buffer, and counters (histograms, key range, barrier) that the last block
to finish zeroes again for the next launch, so they need no memset.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from ..codegen.radix_sort import (
    CTR_BYTES,
    MAX_BLOCKS_PER_SM,
    THREADS,
    TILE,
    Epilogue,
    key_bytes,
    scratch_bytes,
    smem_bytes,
    source,
)
from .device import get_device


class _Kernel:
    __slots__ = ("fptr", "smem", "blocks", "key_bytes")

    def __init__(self, fptr, smem, blocks, key_bytes):
        self.fptr, self.smem, self.blocks, self.key_bytes = fptr, smem, blocks, key_bytes


class _Launch:
    """A kernel parameter block (uint64 slots + pointers to them, as cuLaunchKernel takes) and the
    counters, for one stream: only the slots that change are written per call. The counters start
    zeroed and every launch leaves them zeroed, so launches in one stream's order share them."""

    __slots__ = ("vals", "ptrs", "addr", "ctr")

    def __init__(self, cp, stream):
        self.vals = (ctypes.c_uint64 * 6)()
        base = ctypes.addressof(self.vals)
        self.ptrs = (ctypes.c_void_p * 6)(*[base + 8 * i for i in range(6)])
        self.addr = ctypes.addressof(self.ptrs)
        with stream:  # zeroed in this stream's order, freed (if ever) back to its pool
            self.ctr = cp.zeros(CTR_BYTES, dtype=np.uint8)
        self.vals[5] = self.ctr.data.ptr


_LOCK = threading.Lock()
_KERNELS: dict = {}  # np.dtype -> _Kernel
_TLS = threading.local()  # .by_stream: stream pointer -> _Launch, for callers without a run state
_STATE_KEY = "segfuse.radix_sort"  # this module's _Launch in a runtime thread state's `params`
_MAX_STREAMS = 64
_COOP_TOO_LARGE = 720  # CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE
_DRIVER = []


def _driver():
    if not _DRIVER:
        from cupy.cuda import driver

        _DRIVER.append((driver.launchCooperativeKernel, driver))
    return _DRIVER[0]


def _kernel(dtype, epilogue: Epilogue | None = None):
    dt = np.dtype(dtype)
    key = dt if epilogue is None else (dt, epilogue)
    hit = _KERNELS.get(key)
    if hit is not None:
        return hit
    device = get_device()  # (the process's GPU and its shared kernel cache)
    src, kname = source(dt, epilogue)
    fn = device.cache.get(src).get_function(kname)
    kbytes = key_bytes(dt)
    smem = smem_bytes(kbytes)
    fn.max_dynamic_shared_size_bytes = smem
    fptr = getattr(fn, "kernel", fn).ptr
    occ = MAX_BLOCKS_PER_SM
    try:  # blocks that fit on one SM at once (the grid barrier needs every block resident)
        occ = _driver()[1].occupancyMaxActiveBlocksPerMultiprocessor(fptr, THREADS, smem)
    except Exception:
        pass
    blocks = device.sm_count * max(1, min(int(occ), MAX_BLOCKS_PER_SM))
    hit = _Kernel(fptr, smem, blocks, kbytes)
    with _LOCK:
        _KERNELS.setdefault(key, hit)
    return _KERNELS[key]


def prepare(dtype, epilogue: Epilogue | None = None) -> None:
    """Compile and load a kernel ahead of its first call (the runtime prepares steps once)."""
    _kernel(dtype, epilogue)


class _EpiBlock:
    """The parameter block of a fused kernel on one stream: the plain kernel's six slots, the error
    word, then one slot per epilogue tensor. `err` is a private error word for callers without a
    runtime thread state."""

    __slots__ = ("vals", "ptrs", "addr", "err")

    def __init__(self, n_slots: int):
        self.vals = (ctypes.c_uint64 * n_slots)()
        base = ctypes.addressof(self.vals)
        self.ptrs = (ctypes.c_void_p * n_slots)(*[base + 8 * i for i in range(n_slots)])
        self.addr = ctypes.addressof(self.ptrs)
        self.err = None


def _launch(k: _Kernel, grid: int, stream_ptr: int, addr: int) -> None:
    """A cooperative launch: the driver starts the grid only if every block is resident at once
    (what the grid barriers need), and fails otherwise instead of letting the barriers hang. When it
    fails for size (MPS or green contexts leaving fewer SMs than the occupancy query saw), fewer
    blocks are tried: any grid size sorts correctly, the scratch only shrinks."""
    coop, driver = _driver()
    while True:
        try:
            coop(k.fptr, grid, 1, 1, THREADS, 1, 1, k.smem, stream_ptr, addr)
            return
        except driver.CUDADriverError as e:
            if getattr(e, "status", None) != _COOP_TOO_LARGE or grid <= 1:
                raise
            grid = max(1, grid // 2)
            k.blocks = min(k.blocks, grid)


def _stream_launch(cp, stream) -> _Launch:
    by = getattr(_TLS, "by_stream", None)
    if by is None:
        by = _TLS.by_stream = {}
    sp = stream.ptr
    ls = by.get(sp)
    if ls is None:
        if len(by) >= _MAX_STREAMS:  # forget old streams: each buffer goes back to its own stream's pool
            by.clear()
        ls = by[sp] = _Launch(cp, stream)
    return ls


def argsort(cp, x, axis, descending, state=None, epilogue: Epilogue | None = None, outputs=()):
    """Stable argsort (like torch.sort(stable=True)) of a row: int64 indices, x's shape.
    The caller checks `supported(x, axis)`. `state`: the runtime's per-thread state (its stream is
    the current one); then the scratch is the thread's scratch buffer and the parameter block lives
    in the state. Without it: the current stream, and scratch from CuPy's pool.
    Per call the host allocates only the output and writes five parameter slots.

    With an `epilogue` the fused variant runs instead: `outputs` are the arrays behind its
    parameters e0.. (allocated by the caller), the kernel writes only them, and the result is None."""
    shape = x.shape
    n = x.size
    if n == 1 and epilogue is None:
        return cp.zeros(shape, dtype=np.int64)
    if len(shape) != 1 or x.strides[0] != x.itemsize:
        x = cp.ascontiguousarray(x.reshape(-1))
    # the launch state first: creating it (cp.zeros, a runtime-API call) makes this thread's CUDA
    # context current, which the driver-API calls below (module load, occupancy, launch) need
    if state is not None:
        stream = state.stream
        ls = state.params.get(_STATE_KEY)
        if ls is None:
            ls = state.params[_STATE_KEY] = _Launch(cp, stream)
    else:
        stream = cp.cuda.get_current_stream()
        ls = _stream_launch(cp, stream)
    if epilogue is None:
        k = _KERNELS.get(x.dtype) or _kernel(x.dtype)
    else:
        k = _KERNELS.get((x.dtype, epilogue)) or _kernel(x.dtype, epilogue)
    grid = min(k.blocks, -(-n // TILE))
    nbytes = scratch_bytes(n, k.key_bytes, grid)
    if state is not None:
        scratch = state.scratch_for(nbytes)  # stream-ordered reuse across steps and calls
    else:
        scratch = cp.empty(nbytes, dtype=np.uint8)  # back to the pool after the launch, in stream order
    if epilogue is not None:
        return _fused(cp, k, grid, x, n, descending, scratch, ls, stream, state, outputs)
    out = cp.empty(n, dtype=np.int64)
    vals = ls.vals
    vals[0] = x.data.ptr
    vals[1] = n
    vals[2] = 1 if descending else 0
    vals[3] = out.data.ptr
    vals[4] = scratch.data.ptr
    _launch(k, grid, stream.ptr, ls.addr)
    return out if len(shape) == 1 else out.reshape(shape)


class FusedStep:
    """A fused kernel's launch as a plan step's `bind` and `fire` (the shape of a kernel step,
    compiler/cuda/param_blocks.py), so that the fast paths bind it with the plan's kernels and
    capture its launch into their CUDA graphs: `bind` writes this step's parameter block in the
    run's state (the key's, the outputs', the scratch's and the counters' pointers; the error
    word zeroed, so the block's bytes identify the launch), `fire` sets the error word and
    launches. The key is a contiguous row of `n` elements (prepare checks its layout), so
    binding launches nothing."""

    __slots__ = ("cp", "kernel", "n", "descending", "n_slots", "token")

    def __init__(self, cp, dtype, epilogue: Epilogue, n: int, descending: bool, n_outputs: int, token):
        self.cp = cp
        self.kernel = _kernel(dtype, epilogue)
        self.n, self.descending = n, descending
        self.n_slots = 7 + n_outputs
        self.token = token  # this step's block in each state (the prepared entry's: purged with it)

    def bind(self, x, outputs, state) -> list:
        """[slots, slot pointers, their address, grid]: the launch of the row `x` into `outputs`."""
        blk = state.params.get(self.token)
        if blk is None:
            b = _EpiBlock(self.n_slots)
            blk = state.params[self.token] = [b.vals, b.ptrs, b.addr, 0]
        ls = state.params.get(_STATE_KEY)
        if ls is None:
            ls = state.params[_STATE_KEY] = _Launch(self.cp, state.stream)
        k, n = self.kernel, self.n
        grid = blk[3] = min(k.blocks, -(-n // TILE))
        vals = blk[0]
        vals[0] = x.data.ptr
        vals[1] = n
        vals[2] = 1 if self.descending else 0
        vals[3] = 0
        vals[4] = state.scratch_for(scratch_bytes(n, k.key_bytes, grid)).data.ptr
        vals[5] = ls.ctr.data.ptr
        vals[6] = 0
        for i, a in enumerate(outputs):
            vals[7 + i] = a.data.ptr
        return blk

    def fire(self, rec, err_ptr: int, stream_ptr: int) -> None:
        rec[0][6] = err_ptr
        _launch(self.kernel, rec[3], stream_ptr, rec[2])


def _fused(cp, k, grid, x, n, descending, scratch, ls, stream, state, outputs):
    """Launch a fused kernel: its parameter block lives beside the plain one (per thread state or
    per stream) and shares that stream's counters, which every launch leaves zeroed."""
    if state is not None:
        holder, key = state.params, (_STATE_KEY, k.fptr)
    else:
        holder = getattr(_TLS, "fused", None)
        if holder is None or len(holder) >= _MAX_STREAMS:
            holder = _TLS.fused = {}
        key = (stream.ptr, k.fptr)
    blk = holder.get(key)
    if blk is None:
        blk = holder[key] = _EpiBlock(7 + len(outputs))
        if state is None:
            with stream:
                blk.err = cp.zeros(5, dtype=np.int64)
    blk.vals[5] = ls.ctr.data.ptr  # (a stream's counters may be new when its _Launch was)
    blk.vals[6] = state.err_ptr if state is not None else blk.err.data.ptr
    vals = blk.vals
    vals[0] = x.data.ptr
    vals[1] = n
    vals[2] = 1 if descending else 0
    vals[3] = 0
    vals[4] = scratch.data.ptr
    for i, a in enumerate(outputs):
        vals[7 + i] = a.data.ptr
    _launch(k, grid, stream.ptr, blk.addr)
    return None
