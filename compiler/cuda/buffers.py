"""The plan's buffers on the GPU: one device allocation per `Plan.buffers` entry (graph inputs
aside), and every tensor the plan puts in a buffer a view of that allocation at offset 0, so the
plan's reuse (a tensor taking a dead tensor's buffer) and its in-place scatters are what runs.

When the allocations are made (the host cost at decode sizes stays what it was):
- intermediate buffers up to `_REUSE_BYTES` are allocated once per prepared entry and thread state
  (stream): runs on one stream are ordered, nothing of them reaches the caller, and a CUDA graph
  captured on the thread finds the same pointers, so replays stay valid (the state keeps the
  allocations as long as the run context holding the graph). A run only puts their views in its env;
- larger intermediate buffers are allocated per run from CuPy's pool, on the run's stream, and go
  back to it in stream order once the plan frees their last tensor (the pool's cost is noise next
  to their kernels');
- output buffers are allocated per run, except a small one whose previous run's array nobody holds
  any more (the caller dropped that result): an output handed out never shares storage with a later
  run, and no intermediate is ever put in an output buffer (the planner reuses intermediates only);
- the external-stream path (compiler/cuda/external_stream.py) keeps nothing between calls (its
  state's `buffers` drops what is put there): every buffer is allocated per call, from the caller's
  allocator.
Allocations are 256-byte aligned or better (CuPy's pool hands out 512-byte blocks; the plan's
views start at offset 0), which the vector kernels need (32 bytes)."""

from __future__ import annotations

import math

import numpy as np

from .arrays import _FREE_REFS, _REUSE_BYTES, cp_dtype, getrefcount

ALIGN = 256  # bytes every buffer's allocation is aligned to, at least


class DeviceBuffers:
    """The plan's buffers of one prepared entry at its sizes: `specs` is what a run allocates, as
    (buffer id, nbytes, kind, members), members being (tensor, shape, dtype) views at offset 0."""

    def __init__(self, plan, types: dict, cp, token=None):
        self.cp = cp
        # this entry's buffers in each thread state (the prepared entry's token: purged with it)
        self.token = token if token is not None else object()
        specs = []
        for b in plan.buffers:
            if b.kind == "input":  # the caller's arrays (or the staged copy of an alias_of input)
                continue
            members = tuple((t, tuple(types[t].shape), np.dtype(cp_dtype(types[t].dtype))) for t in b.tensors
                            if t in types)
            if members:
                nbytes = max(math.prod(shape) * dt.itemsize for _, shape, dt in members)
                specs.append((b.id, nbytes, b.kind, members))
        self.specs = tuple(specs)
        self.cached = tuple(s for s in specs if s[2] != "output" and s[1] <= _REUSE_BYTES)
        self.per_run = tuple(s for s in specs if s[2] != "output" and s[1] > _REUSE_BYTES)
        # per output buffer, decided once: (its key in a state's buffers, small, shape, dtype, and
        # each member tensor with None when it is the buffer's array itself, else its view's shape
        # and dtype); fill() then only looks up and hands out (host time at decode sizes)
        self.outputs = tuple(
            ((self.token, s[0]), s[1] <= _REUSE_BYTES, shape, dt,
             tuple((t, None if (t == owner or (tshape == shape and tdt == dt)) else (tshape, tdt))
                   for t, tshape, tdt in s[3]))
            for s in specs if s[2] == "output" for owner, shape, dt in (_owner(s, plan),))
        self.key = (self.token, "intermediates")

    def __bool__(self) -> bool:
        return bool(self.specs)

    def fill(self, env: dict, ctx) -> None:
        """Put every buffer's views into a run's `env` (allocating what this run needs)."""
        st = ctx.state
        if self.cached:
            views = st.buffers.get(self.key)
            if views is None:
                views = {}
                with ctx.stream:
                    for spec in self.cached:
                        views.update(_views(self.cp.empty(max(spec[1], 1), np.uint8), spec[3]))
                st.buffers[self.key] = views  # (kept per thread: dropped by a state that keeps nothing)
            env.update(views)
        if self.per_run:
            with ctx.stream:
                for spec in self.per_run:
                    env.update(_views(self.cp.empty(spec[1], np.uint8), spec[3]))
        buffers = st.buffers
        for key, small, shape, dt, members in self.outputs:
            a = buffers.get(key) if small else None
            if a is None or getrefcount(a) > _FREE_REFS:
                with ctx.stream:
                    a = self.cp.empty(shape, dt)
                if small:
                    buffers[key] = a
            for t, view in members:
                env[t] = a if view is None else _view(a, *view)


def _owner(spec, plan):
    """(tensor, shape, dtype) an output buffer is allocated as: its graph output filling it (that
    array is what the caller gets), else its largest tensor (an output is a view of it)."""
    _, nbytes, _, members = spec
    outs = set(plan.outputs)
    full = [m for m in members if math.prod(m[1]) * m[2].itemsize == nbytes]
    return next((m for m in full if m[0] in outs), full[0])


def _view(base, shape, dt):
    """A contiguous view of `base`'s first bytes as an array of `shape` and `dt`."""
    n = math.prod(shape) * dt.itemsize
    return base.reshape(-1).view(np.uint8)[:n].view(dt).reshape(shape)


def _views(base, members) -> dict:
    return {t: _view(base, shape, dt) for t, shape, dt in members}


def store(env: dict, name: str, value) -> None:
    """A step's result that a routine made in memory of its own (a library sort, the host): into
    the tensor's plan buffer when it has one (a copy on the stream), else as it is."""
    dst = env.get(name)
    if dst is None or dst is value or dst.shape != value.shape or dst.dtype != value.dtype:
        env[name] = value
    else:
        dst[...] = value
