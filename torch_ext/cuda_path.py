"""CUDA tensors: a fusion run on `torch.cuda.current_stream()`, capturable in `torch.cuda.graph`.

- No copies: the kernels read the callers' tensors (CuPy views made from `data_ptr()`, shape and
  strides; no DLPack) and write buffers that become the returned tensors; an `alias_of` input is
  updated in place (a non-contiguous one through a contiguous stand-in copied back, all in stream
  order).
- Every buffer of a call (outputs, intermediates, scratch) is memory of torch's caching allocator
  on the current stream (torch_ext/memory.py): CuPy's allocator points at it for the duration of
  the call, each returned output is a tensor of its own, and from a signature's second call on the
  outputs are made before the launch and the rest is one arena. No memory is kept between calls.
  Under a capture the allocations come from the graph's private pool, and replays find them there.
- Repeated calls (outside a capture) of a kernels-only plan replay a CUDA graph of its launches:
  the caching allocator hands a call repeated on one stream the same memory again, so its
  parameter blocks repeat, and a call whose inputs, outputs and arena are all where an earlier
  call's were replays that call's graph without binding anything (`Signature.memo`).
- A direct eager call keeps its outputs and arena for the next call of its signature on the same
  stream, which takes each output its caller let go of (memory.py, `Kept`): both calls' pointers
  are then the same, and the second replays the first's graph.
- No host synchronization: failures go to the op's error block (the CUDA backend's external-stream
  runner, `Engine("cupy").device_backend.external_streams()`), reported by a later call or
  `segfuse.torch.check()`.
- Plans come from the Engine's plan cache; the backend prepares and launches them.
- A call during a capture must find its input signature prepared (kernels compiled and loaded,
  lazily made routines compiled): run the op, or `warmup`, once before capturing.
"""

from __future__ import annotations

import threading

import torch
from segfuse.compiler.engine import Engine

from .convert import segfuse_dtype, torch_dtype
from .memory import RECORDS, CallMemory, Kept

MEMOS = 8  # calls' pointer sets remembered per signature with the CUDA graph of their launches
KEPT = 8  # signatures per op keeping their last direct eager call's memory (see memory.Kept)
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)


def current_stream_ptr(device: int) -> int:
    if _raw_stream is not None:
        return _raw_stream(device)
    return torch.cuda.current_stream(device).cuda_stream


def is_capturing() -> bool:
    if _capturing is not None:
        return _capturing()
    return torch.cuda.is_current_stream_capturing()


class Cuda:
    """The process's CUDA side of segfuse.torch: the CUDA Engine (its plan cache), its backend's
    runner on external streams (prepared plans, error blocks, stream states) and each thread's
    torch-backed CuPy allocator."""

    def __init__(self):
        self.engine = Engine("cupy")
        ext = self.ext = self.engine.device_backend.external_streams()
        cp = self.cp = ext.cp
        self.errors = ext.errors
        self.states = ext.states
        self._tls = threading.local()
        mem = cp.cuda.memory
        get, put = getattr(mem, "_get_thread_local_allocator", None), getattr(mem, "_set_thread_local_allocator", None)
        if get is None or put is None:  # (CuPy's own context manager does exactly this, a little slower)
            get, put = _allocator_via_context(cp)
        self.get_allocator, self.set_allocator = get, put

    def prepare(self, fusion, shapes: dict, dtypes: dict, strides: dict):
        """The backend's prepared entry of the Engine's plan for inputs of these shapes, dtypes
        and (element) strides."""
        plan = self.engine.plan(fusion, shapes, dtypes)
        return self.ext.prepare(plan, fusion, shapes, dtypes, strides)

    def memory(self) -> CallMemory:
        """This thread's allocator for CuPy."""
        m = getattr(self._tls, "m", None)
        if m is None:
            m = self._tls.m = CallMemory(self.cp)
        return m

    def report(self) -> None:
        """Raise the first failure any op's block holds (synchronizing the device first when one
        does: the failing kernel may still be writing it)."""
        if self.errors.dirty():
            torch.cuda.synchronize()
            self.errors.raise_failures()


def _allocator_via_context(cp):
    ctx: list = []

    def get():
        return None

    def put(allocator):
        if allocator is not None:
            cm = cp.cuda.using_allocator(allocator)
            cm.__enter__()
            ctx.append(cm)
        else:
            ctx.pop().__exit__(None, None, None)

    return get, put


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


class InputView:
    """How one input of a signature becomes a CuPy array: dtype (bfloat16 as uint16 bits, bool as
    bytes), shape, byte strides and the bytes it spans; the last view made is kept for its pointer."""

    __slots__ = ("cp", "dtype", "shape", "strides", "nbytes", "device", "last")

    def __init__(self, c: Cuda, t: torch.Tensor, where: str):
        self.cp = c.cp
        self.dtype = c.ext.array_dtype(segfuse_dtype(t, where))
        size = t.element_size()
        self.shape, self.strides = tuple(t.shape), tuple(s * size for s in t.stride())
        self.nbytes = _span(0, self.shape, tuple(t.stride()), size)[1]
        self.device = t.get_device()
        self.last = (None, None)  # (pointer, view), replaced as one (threads share signatures)

    def __call__(self, t: torch.Tensor):
        ptr = t.data_ptr()
        last = self.last
        if last[0] == ptr:
            return last[1]
        cuda = self.cp.cuda
        # no owner: a view is used only during a call, while the caller holds `t`
        mem = cuda.MemoryPointer(cuda.UnownedMemory(ptr, self.nbytes, None, self.device), 0)
        v = self.cp.ndarray(self.shape, self.dtype, mem, self.strides)
        self.last = (ptr, v)
        return v


def to_cupy(sig, tensors) -> dict:
    """The inputs of a call as CuPy views, by input name."""
    return {n: make(t) for n, make, t in zip(sig.names, sig.views, tensors)}


class Signature:
    """One input signature of an op: its prepared plan, how its inputs become CuPy arrays, and
    its allocation plan (memory.py) once a call recorded one; what every call of it would
    otherwise work out again is decided here, once."""

    __slots__ = ("prep", "names", "views", "device", "index", "plan", "records", "host_steps", "in_stream", "launch",
                 "memo")

    def __init__(self, c: Cuda, prep, names, tensors):
        self.prep = prep
        self.names = tuple(names)
        self.views = tuple(InputView(c, t, f"inputs.{n}") for n, t in zip(names, tensors))
        self.device = tensors[0].device
        self.index = self.device.index
        self.plan = None
        self.records = 0
        self.host_steps = c.ext.host_steps(prep)
        # CuPy routines and host steps use CuPy's current stream: those calls run in the stream's
        # context; kernels and views allocate and launch on the stream they are given
        self.in_stream = not c.ext.launches_only(prep)
        self.launch = c.ext.launcher(prep)  # (kernels-only plans replay CUDA graphs of their launches)
        # every pointer of a call -> (stream state, the CUDA graph of its launches): a later call on
        # the same state whose pointers are all the same replays the graph as it is (see `run`)
        self.memo: dict = {}


def _key(tensors) -> tuple:
    """A call's signature: each input's shape, strides, dtype and device index."""
    return tuple([(t.shape, t.stride(), t.dtype, t.get_device()) for t in tensors])


class CudaRunner:
    """One op's CUDA path: its prepared signatures and its error block."""

    def __init__(self, owner):
        self.owner = owner  # (the error block names owner.fusion)
        self.fusion = owner.fusion
        self.err_ptr = None
        self.sigs: dict = {}
        self.kept: dict = {}  # signature key -> Kept, for KEPT signatures at most
        self.alias_pos = {o.alias_of: self.fusion.input_names.index(o.alias_of)
                          for o in self.fusion.outputs if o.alias_of is not None}
        self.staged_pos = tuple(self.alias_pos.values())
        self.dtypes = {o.name: torch_dtype(self.fusion.types[o.name].dtype) for o in self.fusion.outputs}
        # the returned outputs, in the graph's order: (name, torch dtype)
        self.returned = tuple((o.name, self.dtypes[o.name]) for o in self.fusion.outputs if o.alias_of is None)

    def _signature(self, c: Cuda, key, tensors) -> Signature:
        index = tensors[0].get_device()  # (a CUDA device: the op dispatched on the first input)
        if any(t.get_device() != index for t in tensors):  # (a CPU tensor's is -1)
            self.owner._mixed(tensors)  # (each input's device is part of a signature's key)
        names = self.fusion.input_names
        shapes = {n: tuple(t.shape) for n, t in zip(names, tensors)}
        dtypes = {n: segfuse_dtype(t, f"inputs.{n}") for n, t in zip(names, tensors)}
        strides = {n: tuple(t.stride()) for n, t in zip(names, tensors)}
        prep = c.prepare(self.fusion, shapes, dtypes, strides)
        sig = self.sigs[key] = Signature(c, prep, names, tensors)
        return sig

    def run(self, tensors, keep: bool = False, into: list | None = None) -> list:
        """The graph's outputs that are not `alias_of` an input, as fresh tensors, in the graph's
        order; `alias_of` inputs are updated in place. Launched on the current stream. The
        inputs are CUDA tensors on one device (a call with others fails naming them). `keep`: a
        direct eager call, which may take and keep memory between calls (memory.Kept). `into`:
        per returned output a caller's tensor to write it into, or None; the kernels write into
        each one that is what the plan makes (device, shape, dtype, contiguous) and overlaps no
        input or other such tensor, and it is returned in the output's place."""
        capturing = is_capturing()
        c = _CUDA[0] if _CUDA else cuda(capturing)
        if not capturing:
            c.report()  # an earlier call's failure, once visible (no synchronization otherwise)
        if self.err_ptr is None:
            if capturing:
                raise RuntimeError(f"segfuse.torch: '{self.fusion.name}' runs for the first time inside a CUDA "
                                   "graph capture; run it (or op.warmup) once before capturing")
            self.err_ptr = c.errors.claim(self.owner)
        staged = None
        for i in self.staged_pos:
            if not tensors[i].is_contiguous():
                staged = staged or {}
                staged[i] = tensors[i]
        if staged:
            tensors = [t.contiguous() if i in staged else t for i, t in enumerate(tensors)]
        key = _key(tensors)
        sig = self.sigs.get(key)
        if sig is None:
            if capturing:
                raise RuntimeError(f"segfuse.torch: '{self.fusion.name}' was not run at input shapes "
                                   f"{[list(t.shape) for t in tensors]} before this CUDA graph capture: "
                                   "run it (or op.warmup) once at these shapes first")
            sig = self._signature(c, key, tensors)
        if capturing and sig.host_steps:
            raise RuntimeError(f"segfuse.torch: '{self.fusion.name}' has steps that run on the host "
                               f"({'; '.join(sig.host_steps)}); they cannot be captured in a CUDA graph")
        device = sig.device
        st = c.states.get(current_stream_ptr(sig.index))
        if not capturing:
            c.states.refill()
        mem = c.memory()
        plan = sig.plan
        if into is not None:
            into = _writable(into, plan, sig.device, tensors)
            keep = keep and into is None  # (a caller's tensor is never kept)
        keep = keep and not capturing and plan is not None and plan.fixed and not staged and not self.alias_pos
        kept = self.kept.get(key) if keep else None
        if kept is not None and (kept.st is not st or kept.plan is not plan):
            kept = None
        mem.begin(device, plan, plan is None and sig.records < RECORDS, kept, into)
        if sig.memo and not capturing and plan is not None:
            # the outputs and the arena are made: when they and the inputs are where an earlier
            # call had them, binding would write that call's parameter bytes, so its graph runs
            hit = sig.memo.get((*[t.data_ptr() for t in tensors], *mem.pre_ptrs, mem.base))
            if hit is not None and hit[0] is st:
                try:
                    c.ext.replay(hit[1], st)
                    outs, arena = mem.pre, mem.arena
                finally:
                    mem.end()
                if keep:
                    self._keep(key, kept, st, plan, outs, arena)
                return outs
        prev = c.get_allocator()
        made = False
        c.set_allocator(mem.malloc)
        try:
            env = to_cupy(sig, tensors)
            if sig.in_stream:
                with st.stream:
                    graph = sig.launch(env, st, self.err_ptr, capturing)
                    outs, followed = self._commit(mem, env, tensors, staged)
            else:
                graph = sig.launch(env, st, self.err_ptr, capturing)
                outs, followed = self._commit(mem, env, tensors, staged)
            env.clear()  # (every buffer of the call is freed now, but the outputs' memory)
            made = outs is mem.pre  # (every output is the tensor made, or taken, for it)
            if graph is not None and made and mem.plan.fixed and not staged and not self.alias_pos:
                # every output is the tensor made for it and every other buffer a slice of the arena
                memo = sig.memo
                if len(memo) >= MEMOS:
                    try:
                        memo.pop(next(iter(memo)), None)  # (the oldest)
                    except (RuntimeError, StopIteration):  # (another thread changed it meanwhile)
                        pass
                memo[(*[t.data_ptr() for t in tensors], *mem.pre_ptrs, mem.base)] = (st, graph)
        finally:
            c.set_allocator(prev)
            rec = mem.rec
            arena = mem.arena
            mem.end()
        if rec is not None:
            sig.records += 1
            sig.plan = rec.plan(len(self.returned))
            sig.memo = {}
        elif plan is not None and not followed:
            sig.plan = None  # the call left its plan: the next one records again (RECORDS at most)
            sig.memo = {}
            self.kept.pop(key, None)
        elif keep and made:
            self._keep(key, kept, st, plan, outs, arena)
        return outs

    def _keep(self, key, kept, st, plan, outs: list, arena) -> None:
        """Keep this call's outputs and arena for the signature's next direct eager call on `st`."""
        if kept is not None and kept.arena is arena and all(a is b for a, b in zip(kept.outs, outs)):
            return  # (the call took everything it kept)
        kept = self.kept
        if not Kept.worth(outs, arena):
            kept.pop(key, None)
            return
        if key not in kept and len(kept) >= KEPT:
            try:
                kept.pop(next(iter(kept)), None)  # (the oldest)
            except (RuntimeError, StopIteration):  # (another thread changed it meanwhile)
                pass
        kept[key] = Kept(st, plan, outs, arena)

    def _commit(self, mem: CallMemory, env, tensors, staged) -> tuple[list, bool]:
        """(the returned outputs, whether the call followed its allocation plan). alias_of
        inputs are written (where the plan did not write them in place) first."""
        for name, i in self.alias_pos.items():
            dst = tensors[i]
            v = env[name]
            if v.data.ptr != dst.data_ptr():
                dst.copy_(to_torch(mem, v, self.dtypes[name]))
            if staged and i in staged:
                staged[i].copy_(dst)
        pre, ptrs = mem.pre, mem.pre_ptrs
        followed = mem.followed()
        if followed and mem.plan.complete:
            # every output is the tensor made for it (the plan was followed to the end)
            for (name, _dt), p in zip(self.returned, ptrs):
                if env[name].data.ptr != p:
                    break
            else:
                return pre, True
        return self._commit_general(mem, env, tensors, followed), followed

    def _commit_general(self, mem: CallMemory, env, tensors, followed: bool) -> list:
        """Each returned output as a tensor on its memory (cloned where it overlaps an input's or
        an earlier output's): the tensor made for it where it is that whole tensor. While
        recording, which buffer each whole one is (`Recording.outputs`)."""
        taken = [_span(t.data_ptr(), t.shape, t.stride(), t.element_size()) for t in tensors]
        rec = mem.rec
        pre, ptrs = mem.pre, mem.pre_ptrs
        outs = []
        for k, (name, dt) in enumerate(self.returned):
            v = env[name]
            span = _span(v.data.ptr, v.shape, tuple(s // max(v.itemsize, 1) for s in v.strides), v.itemsize)
            t = pre[k] if k < len(pre) else None
            if t is None or v.data.ptr != ptrs[k] or not (followed or (
                    v.flags.c_contiguous and tuple(v.shape) == tuple(t.shape) and v.nbytes == t.nbytes)):
                t = to_torch(mem, v, dt)
            if span[0] != span[1] and any(a < span[1] and span[0] < b for a, b in taken):
                t = t.clone()  # an input's (or an earlier output's) memory: outputs are fresh
                span = _span(t.data_ptr(), t.shape, t.stride(), t.element_size())
            elif rec is not None and v.nbytes and v.data.ptr == v.data.mem.ptr and v.flags.c_contiguous:
                i = rec.at.get(v.data.ptr)
                if i is not None and rec.rows[i][0] == v.nbytes:
                    rec.outputs[i] = (k, tuple(v.shape), dt)
            taken.append(span)
            outs.append(t)
        return outs


def _writable(into: list, plan, device, tensors) -> list | None:
    """The tensors of `into` the kernels can write as the plan's outputs (the others None), or
    None when there is none."""
    if plan is None or not plan.complete:
        return None
    taken = [_span(t.data_ptr(), t.shape, t.stride(), t.element_size()) for t in tensors]
    res = [None] * len(into)
    for k, (t, o) in enumerate(zip(into, plan.outs)):
        if t is None or t.device != device or t.dtype != o[1] or tuple(t.shape) != o[0] or not t.is_contiguous():
            continue
        span = _span(t.data_ptr(), t.shape, t.stride(), t.element_size())
        if span[0] == span[1] or any(a < span[1] and span[0] < b for a, b in taken):
            continue  # (an empty one needs no kernel; an overlapping one is copied into after the run)
        taken.append(span)
        res[k] = t
    return res if any(t is not None for t in res) else None


def to_torch(mem: CallMemory, a, dtype: torch.dtype) -> torch.Tensor:
    """A torch tensor of `dtype` on CuPy array `a`'s memory: the storage torch allocated for it, else
    (memory from elsewhere) through DLPack. bfloat16 arrays are uint16 bits, bool ones bytes."""
    t = mem.tensor(a, dtype)
    if t is not None:
        return t
    if dtype is torch.bfloat16:
        return torch.from_dlpack(a.view("int16")).view(torch.bfloat16)
    if dtype is torch.bool:
        return torch.from_dlpack(a.view("uint8")).view(torch.bool)
    return torch.from_dlpack(a)
