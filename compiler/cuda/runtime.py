"""The CuPy backend: executes a Plan on the GPU.

It executes plans it is handed (the Engine's, from its plan cache); it never plans. Per (fusion,
plan, input shapes/dtypes/strides) the runtime prepares once: generated modules,
loaded kernels, launch geometry (compiler/cuda/prepare.py). A run then puts the plan's buffers in
its env (one device allocation per plan buffer, compiler/cuda/buffers.py), launches the kernels
on the calling thread's own stream (compiler/cuda/thread_state.py),
checks the device error word once at the end and commits outputs (and in-place `alias_of` updates)
only if the whole run succeeded. `prepared_call` is the per-signature fast path
(compiler/cuda/fast_path.py, CUDA graphs in compiler/cuda/graphs.py).

Segments the codegen does not cover fall back to CuPy routines (sorts, scans) or, last resort,
to the NumPy reference implementation on the host, so every plan runs.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict

import numpy as np

from ..codegen.options import DEFAULT_OPTIONS, CodegenOptions
from .arrays import commit_outputs, contiguous_strides, signature, to_device
from .device import get_device
from .fast_path import make_call
from .prepare import Prepared, prepare_plan
from .thread_state import RunCtx, ThreadState, defers, owned_by

# Prepared entries kept (least recently used dropped first): each holds its plan's loaded kernels,
# and a server sees a few signatures per graph; the kernel cache keeps 1024 modules too.
PREPARED_ENTRIES = 1024


class CupyRuntime:
    # The GPU its streams, buffers and kernels are on: made current on each thread the first time it
    # runs work there, before its stream and buffers are made (CuPy's memory pool is per device: the
    # current device's serves). None: the thread's current device (stand-ins built without __init__).
    device_index: int | None = None
    options: CodegenOptions = DEFAULT_OPTIONS  # what its kernels are generated with

    def __init__(self, cache_dir: str | None = None, cache=None, options: CodegenOptions = DEFAULT_OPTIONS):
        """`cache`: a kernel cache to share (the default runtime shares the device's), else one of
        its own in `cache_dir`. `options`: the code generator's (compiler/codegen/options.py)."""
        self.options = options
        device = get_device()
        self.cp = device.cp
        self.device_index = device.index
        self.sm_count, self.arch = device.sm_count, device.arch
        self.cache = cache if cache is not None else device.kernel_cache(cache_dir)
        # CUDA graphs for repeated kernels-only runs (SEGFUSE_CUDA_GRAPHS=0 turns them off); off
        # for good, with the reason kept, if a capture ever fails
        self.use_graphs = os.environ.get("SEGFUSE_CUDA_GRAPHS", "1") != "0"
        self.graph_fallback_reason = ""
        self.graph_captures = 0  # graphs captured so far (all threads)
        self._prepared: OrderedDict = OrderedDict()  # prepare's LRU
        self._plock = threading.Lock()
        self._tls = threading.local()

    def _thread_state(self):
        st = getattr(self._tls, "st", None)
        if st is None:
            if self.device_index is not None:
                self.cp.cuda.Device(self.device_index).use()
            st = self._tls.st = ThreadState(self.cp)
        return st

    # ---- preparation -----------------------------------------------------------------------
    def prepare(self, fusion, shapes: dict, dtypes: dict, strides: dict, plan) -> Prepared:
        """The prepared entry of `plan` at inputs of these shapes, dtypes and strides: made once,
        then found in an LRU of PREPARED_ENTRIES."""
        key = (fusion.id, id(plan), tuple((k, shapes[k], dtypes[k], strides[k]) for k in shapes))
        entries = self._prepared
        hit = entries.get(key)
        if hit is not None:
            try:
                entries.move_to_end(key)
            except KeyError:  # dropped by another thread meanwhile: still a valid entry
                pass
            return hit
        with self._plock:
            hit = entries.get(key)
            if hit is not None:
                return hit
            bound = fusion.bind(shapes, dtypes)
            prep = entries[key] = prepare_plan(self, fusion, plan, bound, strides)
            # once evicted and unused, its entries in every thread's state go too (the bound on
            # per-thread memory: PREPARED_ENTRIES entries' worth, plus what live callers hold)
            owned_by(prep, prep.tokens)
            while len(entries) > PREPARED_ENTRIES:
                entries.popitem(last=False)
            return prep

    def prepared_for(self, fusion, inputs: dict) -> Prepared | None:
        """The most recently prepared entry of `fusion` for inputs of these shapes (what a run of
        them executes: its steps, launch count and fallbacks), or None."""
        shapes = {k: tuple(v.shape) for k, v in inputs.items()}
        for key, prep in reversed(list(self._prepared.items())):
            if key[0] == fusion.id and {k: s for k, s, _, _ in key[2]} == shapes:
                return prep
        return None

    def warmup(self, fusion, shapes: dict, plan, dtypes: dict | None = None) -> Prepared:
        """Compile `plan`'s kernels for these input shapes without running it: the entry a run of
        contiguous inputs handed the same plan finds (Engine.warmup passes its cached one)."""
        dtypes = dtypes or {n: t.dtype for n, t in fusion.inputs}
        strides = {n: contiguous_strides(shapes[n]) for n in shapes}
        return self.prepare(fusion, {k: tuple(v) for k, v in shapes.items()}, dtypes, strides, plan)

    # ---- running -------------------------------------------------------------------------
    def run(self, fusion, inputs: dict, plan, deferred: bool = False) -> tuple[dict, dict]:
        """Run `fusion` on `inputs` (the general path). With `deferred`, a plan whose kernels
        check data returns once launched, unless it updates an input in place; its failure is
        raised by a later call on this thread (`DeferredRunError`) or by `synchronize()`."""
        st = self._thread_state()
        stream = st.stream
        t0 = time.perf_counter()
        with stream:
            shapes, dtypes, strides, arrays = to_device(self.cp, fusion, inputs)
            prep = self.prepare(fusion, shapes, dtypes, strides, plan)
            t1 = time.perf_counter()
            env = dict(arrays)
            # inputs updated in place (alias_of) are staged: the plan writes the copy, and the
            # caller's array changes only after the whole run succeeded
            for name in prep.staged:
                env[name] = arrays[name].copy()
            outs = st.execute(fusion, [step.run for step in prep.steps], env, RunCtx(self, st), prep.may_fail,
                              prep.may_fail and deferred and defers(fusion, st), bool(prep.staged),
                              lambda: commit_outputs(prep.outputs, env, inputs, st, self.cp.ndarray))
            if prep.staged:
                stream.synchronize()
        t2 = time.perf_counter()
        return outs, {"prepare_us": (t1 - t0) * 1e6, "run_us": (t2 - t1) * 1e6,
                      "compile_us": prep.compile_s * 1e6, "fallbacks": prep.fallbacks}

    def synchronize(self):
        """Wait for the calling thread's runs; raise the first failure among its deferred ones."""
        self._thread_state().synchronize()

    def stream(self):
        """The calling thread's stream: its runs' kernels, and the one a batch's end waits for."""
        return self._thread_state().stream

    def begin_batch(self):
        self._thread_state().begin_batch()

    def batch_owner(self, owner):
        self._thread_state().owner = owner

    def end_batch(self) -> dict:
        return self._thread_state().end_batch()

    def prepared_call(self, fusion, inputs: dict, plan, deferred: bool = False):
        """The per-signature fast path: a callable that runs `fusion` on inputs with exactly the
        shapes, strides and dtypes of `inputs` (CuPy arrays), skipping binding, planning and the
        prepared-plan lookup. The same checks and commit rules as `run`: a plan whose kernels check
        indices or divisors synchronizes once and raises on a bad one before anything is returned
        or committed (with `deferred`, it returns once launched, as in `run`); a plan that cannot
        fail returns as soon as it is launched (results are ordered on the GPU before later work
        on the caller's default stream). Safe from several threads (each uses its own stream,
        error words and buffers)."""
        st0 = self._thread_state()
        with st0.stream:
            shapes, dtypes, strides, arrays = to_device(self.cp, fusion, inputs)
        prep = self.prepare(fusion, shapes, dtypes, strides, plan)
        if signature(fusion, inputs) is None:
            return None  # host (NumPy) inputs are uploaded per call: the general path does that
        return make_call(self, fusion, prep, st0, deferred)

    def runner(self, fusion, inputs: dict, plan):
        """A lean callable for one input signature (shapes/dtypes/strides of `inputs`): the
        serving fast path once a graph is warm. Other signatures take the general path."""
        call = self.prepared_call(fusion, inputs, plan)
        key = signature(fusion, inputs)
        if call is None or key is None:
            return lambda ins: self.run(fusion, ins, plan)[0]

        def checked(ins: dict) -> dict:
            if signature(fusion, ins) != key:
                return self.run(fusion, ins, plan)[0]  # another signature: the general path
            return call(ins)

        return checked

    def kernel_time_us(self, fusion, inputs: dict, plan, reps: int = 20, warmup: int = 3) -> float:
        """Mean device time of a prepared plan's launches alone. The stream is first held by a
        spin kernel longer than the host needs to enqueue all repetitions, so CUDA events measure the kernels back to back, without the host's launch cost."""
        cp = self.cp
        st = self._thread_state()
        stream = st.stream
        with stream:
            shapes, dtypes, strides, arrays = to_device(self.cp, fusion, inputs)
            prep = self.prepare(fusion, shapes, dtypes, strides, plan)
            ctx = RunCtx(self, st)
            envs = [dict(arrays) for _ in range(reps + warmup)]
            t0 = time.perf_counter()
            for e in envs[:warmup]:
                for step in prep.steps:
                    step.run(e, ctx)
            stream.synchronize()
            host_s = (time.perf_counter() - t0) / max(warmup, 1)
            _spin_kernel(cp)((1,), (1,), (np.uint64(int((host_s * reps * 2 + 2e-3) * 1e9)),))
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record(stream)
            for e in envs[warmup:]:
                for step in prep.steps:
                    step.run(e, ctx)
            b.record(stream)
        b.synchronize()
        return cp.cuda.get_elapsed_time(a, b) * 1000.0 / reps


_SPIN = []


def _spin_kernel(cp):
    """A one-thread kernel that waits `ns` nanoseconds of GPU time (the global timer)."""
    if not _SPIN:
        _SPIN.append(cp.RawKernel(
            'extern "C" __global__ void sf_spin(unsigned long long ns) { unsigned long long t0, t;'
            ' asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));'
            ' do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns); }', "sf_spin"))
    return _SPIN[0]


_RUNTIME = None
_RLOCK = threading.Lock()


def get_runtime() -> CupyRuntime:
    global _RUNTIME
    with _RLOCK:
        if _RUNTIME is None:
            try:
                _RUNTIME = CupyRuntime(cache=get_device().cache)
            except ImportError as e:
                raise RuntimeError(f"the cupy backend needs CuPy and a CUDA GPU ({e})") from None
        return _RUNTIME
