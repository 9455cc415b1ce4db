"""CuPy's allocator during a CUDA call of a segfuse.torch op: every buffer is memory of torch's
caching allocator on torch's current stream (under a capture: in the graph's private pool).

A prepared plan makes the same allocations, in the same order, every time one input signature
runs (each is checked against the record as it comes), so the first call of a signature records
them (`Recording`) and later calls follow that record (`AllocPlan`) instead of making a torch
tensor per buffer:

- each output the call returns gets a tensor of its own shape and dtype, made before the launch,
  and the kernel that allocates its buffer gets that tensor's memory: the output IS that tensor
  (no tensor made on a storage afterwards);
- every buffer freed before the call ends (intermediates, scratch) is a slice of one arena, one
  allocation per call, freed in stream order when the call ends (but after direct eager calls,
  below). Slices never overlap: no lifetime packing;
- anything else (a buffer something keeps past the call) gets a tensor of its own, as while
  recording.

A call that leaves the record (another size, another count) allocates one tensor per buffer from
there on, its outputs are found as while recording, and the next call records again (a few times,
then the signature keeps allocating buffer by buffer). Memory handed out stays referenced by the
tensor that owns it (`live`) until CuPy frees it, so nothing is reused while a buffer lives.

Direct eager calls (not under a capture, not through the dispatcher) keep what their last call of
a signature made on one stream (`Kept`: the outputs and the arena, KEEP_BYTES at most). The next
such call on that stream takes the arena again and each output its caller has let go of entirely,
instead of making them: the Engine reuses its buffers the same way, and torch.compile's CUDA graphs
their outputs. Making and freeing a tensor through the caching allocator is most of an eager call's
host time. Nothing is kept from calls under a capture or through the dispatcher (torch.compile's
CUDA graph trees check that a pool holds no block they do not know of).
"""

from __future__ import annotations

import sys

import torch

ALIGN = 512  # bytes: the caching allocator's block granularity (vector loads need 32)
RECORDS = 3  # recordings of a signature before it gives up on a plan
ARENA_SLOT = -1  # plan slot kinds besides output positions (>= 0)
OWN_SLOT = -2
KEEP_BYTES = 4 << 20  # outputs and arena a signature keeps between direct eager calls, at most

_empty = torch.empty
_u8 = torch.uint8
_refs = sys.getrefcount
_storage_uses = getattr(torch._C, "_storage_Use_Count", None)
_tensor_uses = getattr(torch.Tensor, "_use_count", None)
CAN_KEEP = _storage_uses is not None and _tensor_uses is not None


class AllocPlan:
    """One signature's allocations: per buffer its size and slot (an output position, ARENA_SLOT
    with its offset, or OWN_SLOT), the arena's size, and each planned output's shape and dtype."""

    __slots__ = ("sizes", "slots", "offsets", "n", "arena_bytes", "outs", "complete", "fixed")

    def __init__(self, sizes, slots, offsets, arena_bytes, outs):
        self.sizes, self.slots, self.offsets = tuple(sizes), tuple(slots), tuple(offsets)
        self.n, self.arena_bytes, self.outs = len(self.sizes), arena_bytes, tuple(outs)
        self.complete = all(o is not None for o in self.outs)  # every returned output planned
        # every buffer is a planned output or in the arena: what a call following the plan hands
        # out is fixed by those tensors' pointers alone
        self.fixed = self.complete and OWN_SLOT not in self.slots


class Recording:
    """The allocations of one call as they happen: [size, pointer, freed] each, and which record
    each live pointer is."""

    __slots__ = ("rows", "at", "outputs")

    def __init__(self):
        self.rows: list = []
        self.at: dict = {}
        # record index -> (output position, shape, torch dtype) of each returned output that is a
        # whole buffer of its own (found at the commit)
        self.outputs: dict = {}

    def plan(self, n_outputs: int) -> AllocPlan | None:
        """The plan of this call, once it ended (every buffer it freed, freed), for its
        `n_outputs` returned outputs. None when there is nothing to plan."""
        outputs = self.outputs
        sizes, slots, offsets, total = [], [], [], 0
        for i, (size, _ptr, freed) in enumerate(self.rows):
            sizes.append(size)
            out = outputs.get(i)
            if out is not None:
                slots.append(out[0])
                offsets.append(0)
            elif freed:
                slots.append(ARENA_SLOT)
                offsets.append(total)
                total += -(-size // ALIGN) * ALIGN
            else:
                slots.append(OWN_SLOT)
                offsets.append(0)
        if not sizes:
            return None
        outs = [None] * n_outputs
        for k, shape, dtype in outputs.values():
            outs[k] = (shape, dtype)
        return AllocPlan(sizes, slots, offsets, total, outs)


def _holds(outs: tuple, storages: tuple) -> list:
    """Per output what refers to it: Python references to the tensor and to its storage object,
    references to its TensorImpl (views hold their base's) and to its storage (detached tensors,
    `set_` onto it), its version (in-place changes, metadata ones included) and requires_grad."""
    return [(_refs(t), _refs(s), _tensor_uses(t), _storage_uses(s._cdata), t._version, t.requires_grad)
            for t, s in zip(outs, storages)]


def _alone() -> tuple:
    """What `_holds` says of a fresh tensor that only the tuples passed to it hold."""
    t = torch.empty(1)
    pair = ((t,), (t.untyped_storage(),))
    del t
    return _holds(*pair)[0]


ALONE = _alone() if CAN_KEEP else None


class Kept:
    """What one signature's last direct eager call made on one stream state `st` following `plan`:
    its outputs (with their storage objects) and its arena. Stream order makes them safe to take
    again on that stream: the last call's kernels and everything its caller queued after them come
    first."""

    __slots__ = ("st", "plan", "outs", "storages", "arena")

    def __init__(self, st, plan: AllocPlan, outs: list, arena):
        self.st, self.plan, self.outs, self.arena = st, plan, tuple(outs), arena
        self.storages = tuple(t.untyped_storage() for t in self.outs)

    def free(self) -> list:
        """Each output that nothing but this refers to and that is as it was made, else None."""
        return [t if h == ALONE else None for t, h in zip(self.outs, _holds(self.outs, self.storages))]

    @staticmethod
    def worth(outs: list, arena) -> bool:
        return CAN_KEEP and sum(t.nbytes for t in outs) + (arena.nbytes if arena is not None else 0) <= KEEP_BYTES


class CallMemory:
    """One thread's allocator for CuPy during its calls (`malloc`, for `using_allocator`). `begin`
    sets up a call (a plan to follow, or a recording to make), `end` ends it."""

    def __init__(self, cp):
        self.live: dict = {}  # pointer handed out -> the tensor owning that memory
        self.malloc = cp.cuda.memory.PythonFunctionAllocator(self._malloc, self._free).malloc
        self.device = None
        self.plan: AllocPlan | None = None
        self.rec: Recording | None = None
        self.i = 0
        self.strayed = False
        self.arena = None
        self.base = 0
        self.pre: list = []
        self.pre_ptrs: list = []

    def begin(self, device, plan: AllocPlan | None, record: bool, kept: Kept | None = None,
              into: list | None = None) -> None:
        """A call on `device` (a torch.device) follows `plan` (its outputs and its arena made now,
        or taken from `kept`, an earlier call's under this plan; an output `into` has a tensor for
        is that tensor), or records (`record`), or neither."""
        self.device = device
        self.i = 0
        self.strayed = False
        self.rec = Recording() if record else None
        self.plan = plan
        if plan is None:
            return
        if kept is not None:
            arena = self.arena = kept.arena
            have = kept.free()
        else:
            arena = self.arena = _empty(plan.arena_bytes, dtype=_u8, device=device) if plan.arena_bytes else None
            have = [None] * len(plan.outs)
        if into is not None:
            have = [t if t is not None else h for t, h in zip(into, have)]
        pre = self.pre = [t if t is not None or o is None else _empty(o[0], dtype=o[1], device=device)
                          for t, o in zip(have, plan.outs)]
        self.base = arena.data_ptr() if arena is not None else 0
        self.pre_ptrs = [0 if t is None else t.data_ptr() for t in pre]

    def followed(self) -> bool:
        """Whether the call so far made exactly the plan's allocations (asked before `end`)."""
        return self.plan is not None and not self.strayed and self.i == self.plan.n

    def end(self) -> None:
        self.plan = self.rec = self.arena = None
        self.pre = self.pre_ptrs = []

    def _malloc(self, size: int, device: int) -> int:
        plan = self.plan
        if plan is not None:
            i = self.i
            self.i = i + 1
            if i < plan.n and plan.sizes[i] == size:
                slot = plan.slots[i]
                if slot >= 0:
                    ptr = self.pre_ptrs[slot]
                    self.live[ptr] = self.pre[slot]
                    return ptr
                if slot == ARENA_SLOT:
                    ptr = self.base + plan.offsets[i]
                    self.live[ptr] = self.arena
                    return ptr
            else:
                self.strayed = True  # from here on one tensor per buffer (the plan's stay live)
                self.plan = None
        t = _empty(max(size, 1), dtype=_u8, device=self.device)
        ptr = t.data_ptr()
        self.live[ptr] = t
        rec = self.rec
        if rec is not None:
            rec.at[ptr] = len(rec.rows)
            rec.rows.append([size, ptr, False])
        return ptr

    def _free(self, ptr: int, device: int) -> None:
        self.live.pop(ptr, None)  # (the memory lives on in tensors made on it)
        rec = self.rec
        if rec is not None:
            i = rec.at.pop(ptr, None)
            if i is not None:
                rec.rows[i][2] = True

    def owner(self, a):
        """The tensor owning the memory of CuPy array `a`, or None when it is not ours."""
        return self.live.get(a.data.mem.ptr)

    def tensor(self, a, dtype: torch.dtype) -> torch.Tensor | None:
        """A tensor of `dtype` on the memory behind CuPy array `a` (its shape and strides): on its
        owner's storage, cloned when that owner is the call's arena (shared by other buffers);
        None when that memory is not ours."""
        base = self.live.get(a.data.mem.ptr)
        if base is None:
            return None
        size = a.itemsize
        t = _empty(0, dtype=dtype, device=base.device)
        t = t.set_(base.untyped_storage(), (a.data.ptr - base.data_ptr()) // size, a.shape,
                   tuple(s // size for s in a.strides))
        return t.clone() if base is self.arena and base is not None else t
