"""A CuPy stand-in that runs the CUDA runtime's real preparation, binding and run paths on the
host: arrays are NumPy arrays in host memory (their `.data.ptr` is their address), and a kernel
"launch" reads the parameter block the runtime wrote (the tensor pointers) and evaluates the
launched segment's ops with the registry's NumPy references on the memory those pointers reach,
reading every operand before writing a result. So which memory a run hands to each kernel (the
plan's buffers, in-place aliases, views) decides the results, as on the GPU; races inside one
kernel cannot show here (the GPU suite covers those). Streams run launches at once, or record
them while capturing a "CUDA graph" that replays them. Every allocation is recorded.

Limits: no library sorts (the multi-block radix sort); bfloat16 travels as uint16 bits, as on
the GPU (inputs are handed over as those bits)."""

from __future__ import annotations

import ctypes
import itertools
import threading
import types
from collections import OrderedDict

import numpy as np
from cupy_standin import Array, Graph, fake_cupy
from segfuse.compiler.cuda import prepare as prepare_mod
from segfuse.compiler.cuda import runtime as rtmod
from segfuse.compiler.cuda.arrays import contiguous_strides

_ptrs = itertools.count(0x5000)


class Stream:
    def __init__(self, non_blocking=False):
        self.ptr = next(_ptrs)
        self.non_blocking = non_blocking
        self.recording = None
        STREAMS[self.ptr] = self

    def synchronize(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def begin_capture(self):
        self.recording = []

    def end_capture(self):
        work, self.recording = self.recording, None
        return Graph(work)


STREAMS: dict = {}


def _enqueue(sp, work) -> None:
    """Run `work` now, or record it while stream `sp` captures a "CUDA graph"."""
    stream = STREAMS[sp]
    if stream.recording is not None:
        stream.recording.append(work)
    else:
        work()


def _wrap(x):
    return x.view(Array) if type(x) is np.ndarray else x


class _NumpyNamespace(types.SimpleNamespace):
    """CuPy's array functions: NumPy's, returning `Array`s."""

    def __getattr__(self, name):
        f = getattr(np, name)
        if callable(f) and not isinstance(f, type):
            return lambda *a, **k: _wrap(f(*a, **k))
        return f


class StandinGPU:
    """The stand-in CuPy (`cp`), its kernel cache (`cache`) and the record of allocations."""

    def __init__(self, emulate: bool = False):
        """`emulate`: launches run the generated kernel itself on the CPU (tests/cuda_emulator.py)
        instead of evaluating the segment with NumPy."""
        self.emulate = emulate
        base = fake_cupy(Stream)
        self.allocations: list = []  # (nbytes, array) of every `empty`
        self.launches = 0
        self.kernels: dict = {}  # function pointer -> (generated record, launch index)
        self.generated: dict = {}  # kernel source -> (fusion, segment, types, strides, aliased, module)
        cp = _NumpyNamespace(**vars(base))
        cp.cuda.driver = types.SimpleNamespace(launchKernel=self._launch)
        cp.empty = self._empty
        cp.asarray = lambda a, dtype=None: _wrap(np.array(a, dtype=dtype))
        cp.ascontiguousarray = lambda a: _wrap(np.ascontiguousarray(a))
        cp.asnumpy = lambda a, stream=None: np.array(a)
        self.cp = cp
        self.cache = types.SimpleNamespace(get=self._module, stats=types.SimpleNamespace(compile_s=0.0))

    def _empty(self, shape, dtype=np.float64):
        a = np.empty(shape, dtype).view(Array)
        self.allocations.append((a.nbytes, a.base))  # (the memory: what views of it reach)
        return a

    # ---- kernels -------------------------------------------------------------------------
    def _module(self, source, codegen=None):
        rec = self.generated[source]
        gpu = self

        class Function:
            def __init__(self, i):
                self.kernel = types.SimpleNamespace(ptr=next(_ptrs))
                gpu.kernels[self.kernel.ptr] = (rec, i)

        names = [ln.kernel for ln in rec[5].launches]
        return types.SimpleNamespace(get_function=lambda name: Function(names.index(name)))

    def _launch(self, fptr, gx, gy, gz, bx, by, bz, smem, sp, addr, extra):
        rec, i = self.kernels[fptr]
        launches = rec[5].launches
        self.launches += 1
        if self.emulate:  # this very launch, as the GPU would run it
            import cuda_emulator

            n = len(rec[5].params)
            slots = (ctypes.c_void_p * (n + 3)).from_address(addr)
            words = [ctypes.c_uint64.from_address(slots[k]).value for k in range(n + 3)]
            mod, ln = cuda_emulator.compile_source(rec[5].source), launches[i]
            _enqueue(sp, lambda: mod.launch(ln.kernel, gx, bx, smem, words, wave=max(1, 2048 // bx)))
            return
        # the module's segment runs once per launch sequence: at its first launch (a vector
        # variant, or its scalar twin when the vector one is skipped)
        if not (i == 0 or (i == 1 and launches[0].vector_of is not None)):
            return
        n = len(rec[5].params)
        slots = (ctypes.c_void_p * (n + 3)).from_address(addr)
        ptrs = [ctypes.c_uint64.from_address(slots[k]).value for k in range(n)]
        _enqueue(sp, lambda: _evaluate(rec, ptrs))

    def install_radix(self, monkeypatch):
        """With `emulate`: the library radix sort (compiler/cuda/radix_sort.py, plain and fused) on
        the emulator too: its modules from here, its cooperative launch with every block at once,
        an occupancy of 2 blocks on each of 4 SMs (grids of up to 8 blocks, as at T = 4096)."""
        import cuda_emulator
        from segfuse.compiler.cuda import radix_sort

        kernels = {}

        class Function:
            def __init__(self, src, name):
                self.ptr, self.max_dynamic_shared_size_bytes = next(_ptrs), 0
                sig = src[src.index(f" {name}("):]
                kernels[self.ptr] = (src, name, sig[:sig.index(")")].count(",") + 1)

        def coop(fptr, gx, gy, gz, bx, by, bz, smem, sp, addr):
            src, name, n = kernels[fptr]
            slots = (ctypes.c_void_p * n).from_address(addr)
            words = [ctypes.c_uint64.from_address(slots[k]).value for k in range(n)]
            _enqueue(sp, lambda: cuda_emulator.compile_source(src).launch(name, gx, bx, smem, words))

        cache = types.SimpleNamespace(get=lambda src: types.SimpleNamespace(get_function=lambda n: Function(src, n)))
        driver = types.SimpleNamespace(CUDADriverError=RuntimeError,
                                       occupancyMaxActiveBlocksPerMultiprocessor=lambda f, t, s: 2)
        monkeypatch.setattr(radix_sort, "_DRIVER", [(coop, driver)])
        monkeypatch.setattr(radix_sort, "get_device", lambda: types.SimpleNamespace(cache=cache, sm_count=4))
        monkeypatch.setattr(radix_sort, "_KERNELS", {})

    def runtime(self):
        """A CupyRuntime on this stand-in, its kernels recorded as the preparation generates them."""
        rt = rtmod.CupyRuntime.__new__(rtmod.CupyRuntime)
        rt.cp, rt.sm_count, rt.arch, rt.cache = self.cp, 132, (9, 0), self.cache
        rt.use_graphs, rt.graph_fallback_reason, rt.graph_captures = True, "", 0
        rt._prepared, rt._plock, rt._tls = OrderedDict(), threading.Lock(), threading.local()
        return rt

    def record_generate(self, monkeypatch):
        real = prepare_mod.generate

        def generate(fusion, seg, types_, strides=None, aliased=frozenset(), **kw):
            mod = real(fusion, seg, types_, strides, aliased=aliased, **kw)
            self.generated[mod.source] = (fusion, seg, dict(types_), dict(strides or {}), set(aliased), mod)
            return mod

        monkeypatch.setattr(prepare_mod, "generate", generate)


def _at(ptr, t, strides=None) -> np.ndarray:
    """The array of type `t` (element `strides`, else contiguous) whose first element is at `ptr`."""
    dt = np.dtype(t.dtype.np)  # (bfloat16: the device's uint16 bits, seen as bfloat16)
    shape = tuple(t.shape)
    if not ptr or 0 in shape:
        return np.zeros(shape, dt)
    st = tuple(s * dt.itemsize for s in (strides or contiguous_strides(shape)))
    first = np.frombuffer((ctypes.c_char * dt.itemsize).from_address(ptr), dt)
    return np.lib.stride_tricks.as_strided(first, shape, st)


def _evaluate(rec, ptrs):
    """The segment's ops on the memory behind the launch's pointers (see the module doc)."""
    fusion, seg, types_, strides, aliased, mod = rec
    at = {p: _at(ptr, types_[p], strides.get(p)) for p, ptr in zip(mod.params, ptrs)}
    values = {p: np.array(at[p]) for p in seg.inputs if p in at}  # every operand read first
    alias = {a.tensor: a.buffer for a in seg.aliases}
    for a in seg.aliases:  # a result written in place starts from its self's array
        if a.tensor in aliased and a.buffer not in values and a.tensor in at:
            values[a.buffer] = np.array(at[a.tensor])

    def copies(k):
        for c in seg.copies:
            if c.at == k:
                values[c.dst] = np.array(values[c.src])

    for k, pos in enumerate(seg.nodes):
        copies(k)
        node = fusion.nodes[pos]
        operands = list(node.inputs)
        if node.outputs[0] in alias:
            operands[0] = alias[node.outputs[0]]
        args = [values[x] if isinstance(x, str) else x.value for x in operands]
        outs = node.op.ref(args, node.attrs, [types_[o] for o in node.outputs])
        for o, v in zip(node.outputs, outs):
            values[o] = np.asarray(v)
    copies(len(seg.nodes))
    for o in seg.outputs:
        if o in at and at[o].size:
            np.copyto(at[o], values[o], casting="unsafe")
