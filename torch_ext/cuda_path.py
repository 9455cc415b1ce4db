"""CUDA tensors: a fusion run on `torch.cuda.current_stream()`, capturable in `torch.cuda.graph`.

- No copies: the kernels read the callers' tensors (CuPy views through DLPack) and write buffers
  that become the returned tensors; an `alias_of` input is updated in place (a non-contiguous one
  through a contiguous stand-in copied back, all in stream order).
- Every buffer of a call (outputs, intermediates, scratch) is a torch tensor from torch's caching
  allocator on the current stream: CuPy's allocator points at it for the duration of the call
  (`TorchMemory`), and an output is returned on its own storage. Under a capture the allocations
  therefore come from the graph's private pool, and replays find them there.
- No host synchronization: failures go to the op's error block (compiler/cuda/external_stream.py),
  reported by a later call or `segfuse.torch.check()`.
- A call during a capture must find its input signature prepared (kernels compiled and loaded,
  lazily made routines compiled): run the op, or `warmup`, once before capturing.
"""

from __future__ import annotations

import threading

import torch
from segfuse.compiler.cuda import external_stream as ext
from segfuse.compiler.cuda.runtime import get_runtime

from .convert import segfuse_dtype, torch_dtype

_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def current_stream_ptr(device: int) -> int:
    if _raw_stream is not None:
        return _raw_stream(device)
    return torch.cuda.current_stream(device).cuda_stream


class TorchMemory:
    """CuPy's allocator during a call: each allocation is a torch uint8 tensor, made by torch's
    caching allocator on torch's current stream (under a capture: in the graph's private pool), kept
    alive while CuPy holds the memory. An output becomes a tensor on that very storage (`tensor`):
    a real caching-allocator storage, with no copy."""

    def __init__(self, cp):
        self.live: dict = {}  # base pointer -> the uint8 tensor behind it
        self.malloc = cp.cuda.memory.PythonFunctionAllocator(self._malloc, self._free).malloc

    def _malloc(self, size: int, device: int) -> int:
        t = torch.empty(max(size, 1), dtype=torch.uint8, device=torch.device("cuda", device))
        ptr = t.data_ptr()
        self.live[ptr] = t
        return ptr

    def _free(self, ptr: int, device: int) -> None:
        self.live.pop(ptr, None)  # (the storage lives on in the tensors made on it)

    def tensor(self, a, dtype: torch.dtype) -> torch.Tensor | None:
        """A tensor of `dtype` on the storage behind CuPy array `a` (its shape and strides), or None
        when that memory is not one of ours."""
        base = self.live.get(a.data.mem.ptr)
        if base is None:
            return None
        size = a.itemsize
        t = torch.empty(0, dtype=dtype, device=base.device)
        return t.set_(base.untyped_storage(), (a.data.ptr - base.data_ptr()) // size, a.shape,
                      tuple(s // size for s in a.strides))


class Cuda:
    """The process's CUDA side of segfuse.torch: the runtime (kernel cache, prepared plans), error
    blocks, stream states and the torch-backed CuPy allocator."""

    def __init__(self):
        self.rt = get_runtime()
        cp = self.cp = self.rt.cp
        self.errors = ext.ErrorBlocks(cp)
        self.states = ext.StreamStates(cp)
        self.states.refill()
        self.memory = TorchMemory(cp)
        self.using_allocator = cp.cuda.using_allocator

    def report(self) -> None:
        """Raise the first failure any op's block holds (synchronizing the device first when one
        does: the failing kernel may still be writing it)."""
        if self.errors.dirty():
            torch.cuda.synchronize()
            self.errors.raise_failures()


_CUDA: list = []
_LOCK = threading.Lock()


def cuda(capturing: bool = False) -> Cuda:
    if not _CUDA:
        if capturing:
            raise RuntimeError("segfuse.torch: the first CUDA call of the process is inside a CUDA graph "
                               "capture; run the op (or op.warmup) once before capturing")
        with _LOCK:
            if not _CUDA:
                _CUDA.append(Cuda())
    return _CUDA[0]


def _span(ptr: int, shape, strides, itemsize: int) -> tuple[int, int]:
    """[start, end) bytes a tensor of these shape and strides (elements) covers."""
    if any(s == 0 for s in shape):
        return ptr, ptr
    last = sum((n - 1) * st for n, st in zip(shape, strides))
    return ptr, ptr + (last + 1) * itemsize


class CudaRunner:
    """One op's CUDA path: its prepared signatures and its error block."""

    def __init__(self, owner):
        self.owner = owner  # (the error block names owner.fusion)
        self.fusion = owner.fusion
        self.err_ptr = None
        self.preps: dict = {}
        self.alias_pos = {o.alias_of: self.fusion.input_names.index(o.alias_of)
                          for o in self.fusion.outputs if o.alias_of is not None}
        self.dtypes = {o.name: torch_dtype(self.fusion.types[o.name].dtype) for o in self.fusion.outputs}

    def _prepare(self, c: Cuda, key, tensors):
        names = self.fusion.input_names
        shapes = {n: tuple(t.shape) for n, t in zip(names, tensors)}
        dtypes = {n: segfuse_dtype(t, f"inputs.{n}") for n, t in zip(names, tensors)}
        strides = {n: tuple(t.stride()) for n, t in zip(names, tensors)}
        prep = c.rt.prepare(self.fusion, shapes, dtypes, strides)
        self.preps[key] = prep
        return prep

    def run(self, tensors: list) -> list:
        """The graph's outputs that are not `alias_of` an input, as fresh tensors, in the graph's
        order; `alias_of` inputs are updated in place. Launched on the current stream."""
        capturing = torch.cuda.is_current_stream_capturing()
        c = cuda(capturing)
        if not capturing:
            c.report()  # an earlier call's failure, once visible (no synchronization otherwise)
        if self.err_ptr is None:
            if capturing:
                raise RuntimeError(f"segfuse.torch: '{self.fusion.name}' runs for the first time inside a CUDA "
                                   "graph capture; run it (or op.warmup) once before capturing")
            self.err_ptr = c.errors.claim(self.owner)
        staged = {}
        for i in self.alias_pos.values():
            if not tensors[i].is_contiguous():
                staged[i] = tensors[i]
        if staged:
            tensors = [t.contiguous() if i in staged else t for i, t in enumerate(tensors)]
        key = tuple((t.shape, t.stride(), t.dtype) for t in tensors)
        prep = self.preps.get(key)
        if prep is None:
            if capturing:
                raise RuntimeError(f"segfuse.torch: '{self.fusion.name}' was not run at input shapes "
                                   f"{[list(t.shape) for t in tensors]} before this CUDA graph capture: "
                                   "run it (or op.warmup) once at these shapes first")
            prep = self._prepare(c, key, tensors)
        if capturing and ext.host_steps(prep):
            raise RuntimeError(f"segfuse.torch: '{self.fusion.name}' has steps that run on the host "
                               f"({'; '.join(ext.host_steps(prep))}); they cannot be captured in a CUDA graph")
        device = tensors[0].device.index
        st = c.states.get(current_stream_ptr(device))
        if not capturing:
            c.states.refill()
        cp = c.cp
        with st.stream, c.using_allocator(c.memory.malloc):
            env = {n: to_cupy(cp, t) for n, t in zip(self.fusion.input_names, tensors)}
            ext.launch(c.rt, prep, env, st, self.err_ptr)
            return self._commit(c, env, tensors, staged)

    def _commit(self, c, env, tensors, staged) -> list:
        taken = [_span(t.data_ptr(), t.shape, t.stride(), t.element_size()) for t in tensors]
        outs = []
        for o in self.fusion.outputs:
            v = env[o.name]
            dt = self.dtypes[o.name]
            if o.alias_of is not None:
                i = self.alias_pos[o.alias_of]
                dst = tensors[i]
                if v.data.ptr != dst.data_ptr():
                    dst.copy_(to_torch(c, v, dt))
                if i in staged:
                    staged[i].copy_(dst)
                continue
            span = _span(v.data.ptr, v.shape, tuple(s // max(v.itemsize, 1) for s in v.strides), v.itemsize)
            t = to_torch(c, v, dt)
            if span[0] != span[1] and any(a < span[1] and span[0] < b for a, b in taken):
                t = t.clone()  # an input's (or an earlier output's) memory: outputs are fresh
                span = _span(t.data_ptr(), t.shape, t.stride(), t.element_size())
            taken.append(span)
            outs.append(t)
        return outs


def to_cupy(cp, t: torch.Tensor):
    """A CuPy view of a CUDA tensor (DLPack; bfloat16 as uint16 bits, bool as bytes)."""
    t = t.detach()
    if t.dtype is torch.bfloat16:
        return cp.from_dlpack(t.view(torch.int16)).view(cp.uint16)
    if t.dtype is torch.bool:
        return cp.from_dlpack(t.view(torch.uint8)).view(cp.bool_)
    return cp.from_dlpack(t)


def to_torch(c: Cuda, a, dtype: torch.dtype) -> torch.Tensor:
    """A torch tensor of `dtype` on CuPy array `a`'s memory: the storage torch allocated for it, else
    (memory from elsewhere) through DLPack. bfloat16 arrays are uint16 bits, bool ones bytes."""
    t = c.memory.tensor(a, dtype)
    if t is not None:
        return t
    if dtype is torch.bfloat16:
        return torch.from_dlpack(a.view(c.cp.int16)).view(torch.bfloat16)
    if dtype is torch.bool:
        return torch.from_dlpack(a.view(c.cp.uint8)).view(torch.bool)
    return torch.from_dlpack(a)
