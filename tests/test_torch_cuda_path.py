"""segfuse.torch's CUDA path on CPU tensors, on a CuPy stand-in: the allocation plans of
torch_ext/memory.py (a call records its buffers, later calls make the outputs before the launch and
take the rest from one arena of the call's), a call that leaves its plan, and outputs that stay
fresh (a storage each, shared with no input), with results against torch.

The CUDA path only hands pointers around, so with CPU tensors (host memory) and a stand-in whose
arrays are NumPy views of that memory, its allocations run for real: the "kernels" below compute
the prologue with NumPy on the buffers CuPy's allocator handed out."""

from __future__ import annotations

import contextlib
import ctypes
import sys
import threading
import types

import numpy as np
import pytest
import segfuse.torch as sft
import torch
from cupy_standin import fake_cupy
from torch_graphs import E, K, prologue_graph, torch_prologue


class _Mem:
    def __init__(self, ptr, size, free=None):
        self.ptr, self.size, self._free = ptr, size, free

    def __del__(self):
        if self._free is not None and self.ptr:
            self._free(self.ptr, 0)


class _MemPtr:
    def __init__(self, mem, offset):
        self.mem, self.ptr = mem, mem.ptr + offset


class _Array:
    def __init__(self, shape, dtype, memptr, strides=None):
        self.dtype = np.dtype(dtype)
        self.shape, self.itemsize = tuple(shape), self.dtype.itemsize
        contiguous = tuple(int(np.prod(self.shape[i + 1:])) * self.itemsize for i in range(len(self.shape)))
        self.strides = tuple(strides) if strides is not None else contiguous
        self.size = int(np.prod(self.shape))
        self.nbytes = self.size * self.itemsize
        self.data = memptr
        self.flags = types.SimpleNamespace(c_contiguous=self.strides == contiguous)

    def host(self) -> np.ndarray:
        if self.size == 0:
            return np.empty(self.shape, self.dtype)
        extent = sum((n - 1) * s for n, s in zip(self.shape, self.strides)) + self.itemsize
        flat = np.frombuffer((ctypes.c_char * extent).from_address(self.data.ptr), np.uint8)
        return np.lib.stride_tricks.as_strided(flat.view(self.dtype) if self.flags.c_contiguous else flat,
                                               self.shape, self.strides)


def _cupy_standin():
    tls = threading.local()
    fake = fake_cupy(object)

    class Allocator:
        def __init__(self, malloc, free):
            self._m, self._f = malloc, free

        def malloc(self, size):
            return _MemPtr(_Mem(self._m(size, 0), size, self._f), 0)

    def empty(shape, dtype):
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        mem = tls.allocator(nbytes) if nbytes else _MemPtr(_Mem(0, 0), 0)
        return _Array(shape, dtype, mem)

    memory = types.SimpleNamespace(PythonFunctionAllocator=Allocator,
                                   _get_thread_local_allocator=lambda: getattr(tls, "allocator", None),
                                   _set_thread_local_allocator=lambda a: setattr(tls, "allocator", a))
    fake.cuda.memory = memory
    fake.cuda.UnownedMemory = lambda ptr, size, owner, device: _Mem(ptr, size)
    fake.cuda.MemoryPointer = _MemPtr
    fake.ndarray = _Array
    fake.empty = empty
    return fake


def _prologue_steps(cp, T, idt, extra):
    """The prologue as three "kernels" allocating like the real plan: a scratch buffer and an
    intermediate freed within the call, four outputs. `extra(ids)`: whether a call allocates one
    more buffer first (a data-dependent allocation: the call leaves its plan)."""
    def counts(env, ctx):
        ids = env["topk_ids"].host()
        if extra(ids):
            cp.empty(3, np.uint8)
        scratch = cp.empty(100, np.uint8)
        scratch.host()[:] = 7
        c = env["counts"] = cp.empty(E, idt)
        c.host()[:] = np.bincount(ids.ravel(), minlength=E)

    def offsets(env, ctx):
        o = env["offsets"] = cp.empty(E + 1, np.int64)  # (a cumsum of int32 is int64, as in torch)
        o.host()[0] = 0
        o.host()[1:] = np.cumsum(env["counts"].host())

    def perms(env, ctx):
        order = cp.empty(T * K, np.int64)
        order.host()[:] = np.argsort(env["topk_ids"].host().ravel(), kind="stable")
        ip = env["input_perm"] = cp.empty(T * K, np.int64)
        ip.host()[:] = order.host() // K
        op = env["output_perm"] = cp.empty(T * K, np.int64)
        op.host()[order.host()] = np.arange(T * K)

    return [types.SimpleNamespace(run=f) for f in (counts, offsets, perms)]


class _State:
    def __init__(self):
        self.stream = contextlib.nullcontext()
        self.stream.ptr = 0
        self.ctxs, self.params, self.err_ptr = {}, {}, 0


@pytest.fixture
def standin_cuda(monkeypatch):
    """A CUDA path (cuda_path.Cuda) on the CuPy stand-in: (Cuda, set of calls that allocate an
    extra buffer, capturing flag)."""
    from segfuse.compiler.cuda.arrays import cp_dtype
    from segfuse.compiler.cuda.external_stream import ErrorBlocks
    from segfuse.compiler.engine import Engine
    from segfuse.torch import cuda_path

    cp = _cupy_standin()
    extra, capturing = [lambda ids: False], [False]

    def prepare(plan, fusion, shapes, dtypes, strides):
        assert plan.segments  # the Engine's plan, handed to the backend
        T = shapes["topk_ids"][0]
        return types.SimpleNamespace(ctx_token=object(), steps=_prologue_steps(cp, T, dtypes["topk_ids"].np, lambda ids: extra[0](ids)),
                                     fallbacks=[])

    def launcher(prep):
        def launch(env, st, err_ptr, capturing=False):
            for step in prep.steps:
                step.run(env, None)

        return launch

    c = cuda_path.Cuda.__new__(cuda_path.Cuda)
    state = _State()
    c.engine = Engine("numpy")  # (its plan cache plans)
    c.ext = types.SimpleNamespace(prepare=prepare, launcher=launcher, host_steps=lambda prep: [],
                                  launches_only=lambda prep: False, array_dtype=cp_dtype)
    c.cp, c.errors = cp, ErrorBlocks(cp)
    c.states = types.SimpleNamespace(get=lambda ptr: state, refill=lambda: None)
    c._tls = threading.local()
    c.get_allocator, c.set_allocator = cp.cuda.memory._get_thread_local_allocator, cp.cuda.memory._set_thread_local_allocator
    monkeypatch.setattr(cuda_path, "_CUDA", [c])
    monkeypatch.setattr(cuda_path, "is_capturing", lambda: capturing[0])
    monkeypatch.setattr(cuda_path, "current_stream_ptr", lambda device: 0)
    return types.SimpleNamespace(c=c, extra=extra, capturing=capturing, state=state)


def _counting_empty(monkeypatch):
    from segfuse.torch import memory

    made = []
    real = memory._empty

    def empty(*a, **kw):
        t = real(*a, **kw)
        made.append(t.nbytes)
        return t

    monkeypatch.setattr(memory, "_empty", empty)
    return made


def _fresh(outs, ins):
    """Each output on a storage of its own, at its start, shared with no input or other output."""
    storages = [o.untyped_storage().data_ptr() for o in outs]
    assert len(set(storages)) == len(outs)
    assert all(o.untyped_storage().data_ptr() == o.data_ptr() for o in outs)
    assert not set(storages) & {x.untyped_storage().data_ptr() for x in ins}


@pytest.mark.parametrize("idt", ["int64", "int32"])
def test_cuda_path_plans_allocations_on_a_standin(standin_cuda, monkeypatch, idt):
    from segfuse.torch.cuda_path import CudaRunner
    from segfuse.torch.memory import ALIGN, ARENA_SLOT

    op = sft.fusion(prologue_graph(idt))
    runner = CudaRunner(op)
    made = _counting_empty(monkeypatch)
    gen = torch.Generator().manual_seed(5)
    counts_per_call = []
    for _ in range(5):
        ids = torch.randint(0, E, (9, K), dtype=getattr(torch, idt), generator=gen)
        before = len(made)
        outs = runner.run((ids,))
        counts_per_call.append(len(made) - before)
        _equal(outs, torch_prologue(ids))
        _fresh(outs, [ids])
    (sig,) = runner.sigs.values()
    plan = sig.plan
    # the record: scratch and order in the arena (distinct, aligned slices), the outputs planned
    assert [s for s in plan.slots] == [ARENA_SLOT, 0, 1, ARENA_SLOT, 2, 3]
    arena = [o for o, s in zip(plan.offsets, plan.slots) if s == ARENA_SLOT]
    assert arena == [0, ALIGN] and plan.arena_bytes == ALIGN + -(-9 * K * 8 // ALIGN) * ALIGN
    # recording: a tensor per buffer and one per output on it; then the outputs and the arena
    assert counts_per_call == [6 + 4, 5, 5, 5, 5]
    standin_cuda.capturing[0] = True  # (the same under a capture: from the graph's pool)
    before = len(made)
    outs = runner.run((ids,))
    assert len(made) - before == 5
    _equal(outs, torch_prologue(ids))


def test_cuda_path_call_leaving_its_plan_on_a_standin(standin_cuda, monkeypatch):
    from segfuse.torch.cuda_path import CudaRunner

    op = sft.fusion(prologue_graph())
    runner = CudaRunner(op)
    gen = torch.Generator().manual_seed(6)
    flags = [False, False, True, False, False, True, True, True, True, True]
    for call, flag in enumerate(flags):
        ids = torch.randint(1, E, (4, K), generator=gen)
        if flag:
            ids[0, 0] = 0  # this call allocates a buffer more than the plan has
        standin_cuda.extra[0] = lambda h: h[0, 0] == 0
        outs = runner.run((ids,))
        _equal(outs, torch_prologue(ids))
        _fresh(outs, [ids])
        (sig,) = runner.sigs.values()
        if call == 2:  # left the plan: the next call records again
            assert sig.plan is None and sig.records == 1
    assert sig.records == 3  # recorded at calls 0, 3 and 6 (later calls follow the plan of call 6)
    assert sig.plan is not None and sig.plan.n == 7


def _equal(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        assert torch.equal(g, w), (g, w)


class _CachingEmpty:
    """torch's caching allocator as calls repeated on one stream see it: memory of a tensor nobody
    holds any more is handed out again for the same request (here: that very tensor)."""

    def __init__(self, real):
        self.real, self.pool = real, {}

    def __call__(self, shape, dtype=None, device=None):
        if shape == 0:  # (a tensor the commit sets onto another storage)
            return self.real(shape, dtype=dtype, device=device)
        key = ((shape,) if isinstance(shape, int) else tuple(shape), dtype)
        for t in self.pool.setdefault(key, []):
            if sys.getrefcount(t) <= 3:  # the pool's list, the loop's name, getrefcount's argument
                return t
        t = self.real(shape, dtype=dtype, device=device)
        self.pool[key].append(t)
        return t


class _Graph:
    """A "CUDA graph" of a call of the stand-in prologue: replaying it computes the prologue from
    the memory its input pointer reaches into the memory of its output pointers."""

    def __init__(self, in_ptr, T, dtype, out_ptrs):
        self.in_ptr, self.T, self.dtype, self.out_ptrs, self.replays = in_ptr, T, np.dtype(dtype), out_ptrs, 0

    def replay(self):
        self.replays += 1
        n = self.T * K
        ids = np.frombuffer((ctypes.c_char * (n * self.dtype.itemsize)).from_address(self.in_ptr), self.dtype)
        for ptr, want in zip(self.out_ptrs, torch_prologue(torch.from_numpy(ids.reshape(self.T, K).copy()))):
            src = want.contiguous().numpy()
            ctypes.memmove(ptr, src.ctypes.data, src.nbytes)


def test_a_call_at_an_earlier_calls_pointers_replays_its_graph_on_a_standin(standin_cuda, monkeypatch):
    """A graph the launcher returned (the first call whose parameters repeat an earlier one's) is
    replayed, with nothing bound, by a later call whose input, outputs and arena are all where that
    call had them; the outputs are still the call's own fresh tensors. Other pointers, or a call
    under the caller's capture, launch again."""
    from segfuse.torch import memory
    from segfuse.torch.cuda_path import CudaRunner

    monkeypatch.setattr(memory, "_empty", _CachingEmpty(memory._empty))
    graphs = []

    def launcher(prep):
        seen = set()

        def launch(env, st, err_ptr, capturing=False):
            for step in prep.steps:
                step.run(env, None)
            key = tuple(env[n].data.ptr for n in ("topk_ids", "counts", "offsets", "input_perm", "output_perm"))
            if capturing or key not in seen:
                seen.add(key)
                return None
            x = env["topk_ids"]
            graphs.append(_Graph(key[0], x.shape[0], x.dtype, key[1:]))
            return graphs[-1]

        return launch

    standin_cuda.c.ext.launcher = launcher
    standin_cuda.c.ext.replay = lambda graph, st: graph.replay()
    op = sft.fusion(prologue_graph())
    runner = CudaRunner(op)
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(0, E, (6, K), generator=gen)
    for _ in range(6):  # one input tensor, new ids each call; each call's outputs dropped
        ids.copy_(torch.randint(0, E, (6, K), generator=gen))
        outs = runner.run((ids,))
        _equal(outs, torch_prologue(ids))
        _fresh(outs, [ids])
        del outs
    # call 0 records the allocations, call 1 follows them (its outputs made ahead of the launch),
    # call 2 repeats call 1's pointers: its graph; calls 3-5 replay it
    assert len(graphs) == 1 and graphs[0].replays == 3
    other = ids.clone()  # the same ids at another address: launched, not replayed
    _equal(runner.run((other,)), torch_prologue(other))
    assert graphs[0].replays == 3
    standin_cuda.capturing[0] = True
    _equal(runner.run((ids,)), torch_prologue(ids))
    assert graphs[0].replays == 3
    standin_cuda.capturing[0] = False
    _equal(runner.run((ids,)), torch_prologue(ids))
    assert graphs[0].replays == 4


_HOLDS = {
    "the tensor": lambda t: t,
    "a view": lambda t: t[1:],
    "a detached alias": lambda t: t.detach(),
    "its storage": lambda t: t.untyped_storage(),
    "a DLPack capsule": lambda t: torch.utils.dlpack.to_dlpack(t),
}


@pytest.mark.parametrize("hold", sorted(_HOLDS))
def test_direct_eager_calls_take_back_only_the_outputs_their_caller_let_go_of_on_a_standin(
        standin_cuda, monkeypatch, hold):
    """A direct eager call keeps its outputs and arena: the next call on the stream takes the arena
    and each output nothing refers to any more (no allocation), and makes anew each output the caller
    still holds in any form (the tensor, a view, a detached alias, its storage, a DLPack capsule) or
    changed in place, so what the caller holds keeps the earlier call's results."""
    from segfuse.torch.cuda_path import CudaRunner

    op = sft.fusion(prologue_graph())
    runner = CudaRunner(op)
    made = _counting_empty(monkeypatch)
    gen = torch.Generator().manual_seed(8)

    def call():
        ids = torch.randint(0, E, (5, K), generator=gen)
        before = len(made)
        outs = runner.run((ids,), keep=True)
        _equal(outs, torch_prologue(ids))
        _fresh(outs, [ids])
        return ids, outs, len(made) - before

    for _ in range(3):  # records, then follows the plan (outputs and arena made), then takes them
        _, outs, n = call()
        del outs
    assert n == 0
    ids, outs, n = call()
    assert n == 0
    held = _HOLDS[hold](outs[2])
    want = torch_prologue(ids)[2].clone()
    del outs
    ids2, outs2, n = call()
    assert n == 1  # the held output made anew, the three others and the arena taken
    got = held if isinstance(held, torch.Tensor) and hold != "a view" else None
    if hold == "a view":
        assert torch.equal(held, want[1:])
    elif hold == "its storage":
        assert torch.equal(torch.tensor([], dtype=want.dtype).set_(held, 0, want.shape), want)
    elif hold == "a DLPack capsule":
        assert torch.equal(torch.utils.dlpack.from_dlpack(held), want)
    else:
        assert torch.equal(got, want)
    del held, got, outs2
    outs3 = call()[1]
    outs3[0].add_(1)  # changed in place, then let go of
    del outs3
    _, outs4, n = call()
    assert n == 1


def test_only_direct_eager_calls_keep_memory_on_a_standin(standin_cuda, monkeypatch):
    """Calls through the dispatcher or under a capture keep nothing: each makes its outputs and
    arena (a block kept past a call would be one a CUDA graph pool's owner does not know of)."""
    from segfuse.torch.cuda_path import CudaRunner

    op = sft.fusion(prologue_graph())
    runner = CudaRunner(op)
    made = _counting_empty(monkeypatch)
    ids = torch.randint(0, E, (5, K), generator=torch.Generator().manual_seed(9))
    for _ in range(3):
        runner.run((ids,))
    assert not runner.kept
    before = len(made)
    runner.run((ids,))
    assert len(made) - before == 5
    runner.run((ids,), keep=True)
    standin_cuda.capturing[0] = True
    before = len(made)
    _equal(runner.run((ids,), keep=True), torch_prologue(ids))
    assert len(made) - before == 5


def test_out_tensors_are_written_by_the_kernels_without_a_copy_on_a_standin(standin_cuda, monkeypatch):
    """A call's `into` tensors that are what the plan makes (device, shape, dtype, contiguous) and
    overlap nothing are the outputs themselves: the kernels write them, nothing is allocated for
    them, and they come back in the outputs' places. One that does not fit (another dtype, not
    contiguous, overlapping an input) gets a fresh output, as without `into`."""
    from segfuse.torch.cuda_path import CudaRunner

    op = sft.fusion(prologue_graph())
    runner = CudaRunner(op)
    made = _counting_empty(monkeypatch)
    gen = torch.Generator().manual_seed(10)
    T = 6
    for _ in range(2):  # records, then follows its plan
        runner.run((torch.randint(0, E, (T, K), generator=gen),))
    counts = torch.full((E,), -1, dtype=torch.int64)
    perm = torch.full((T * K,), -1, dtype=torch.int64)
    ids = torch.randint(0, E, (T, K), generator=gen)
    before = len(made)
    outs = runner.run((ids,), into=[counts, None, None, perm])
    assert len(made) - before == 3  # the arena and the two outputs not given
    assert outs[0] is counts and outs[3] is perm
    _equal(outs, torch_prologue(ids))
    ids2 = torch.randint(0, E, (T, K), generator=gen)
    wrong = [torch.empty(E, dtype=torch.int32), None, torch.empty(2 * T * K, dtype=torch.int64)[::2], None]
    outs = runner.run((ids2,), into=wrong)
    assert all(o is not w for o, w in zip(outs, wrong))
    _equal(outs, torch_prologue(ids2))
    flat = ids2.view(-1)  # (an input's own memory, of an output's dtype and size)
    outs = runner.run((ids2,), into=[None, None, flat, None])
    assert outs[2] is not flat
    _equal(outs, torch_prologue(ids2))
