"""The CuPy backend: executes a Plan on the GPU.

Per (fusion, input shapes/dtypes/strides) the runtime prepares once: plan, generated modules,
loaded kernels, launch geometry. A run then only allocates buffers from CuPy's pool, launches
the kernels on the calling thread's own stream, checks the device error word once at the end
and commits outputs (and in-place `alias_of` updates) only if the whole run succeeded.

Segments the codegen does not cover fall back to CuPy routines (sorts, scans) or, last resort,
to the NumPy reference implementation on the host, so every plan runs.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from dataclasses import dataclass, field

import numpy as np

from ..codegen.lazy import Unsupported
from ..codegen.segment import generate
from ..dtypes import DType
from ..errors import DeferredRunError, Issue, RunError
from ..numpy_backend import eval_node
from ..plan import Segment, SegmentKind
from ..segmenter_cache import SHARED_PLANS
from ..segmenter_reference import split_nodes
from ..segmenter_sort_epilogue import ROUTINE
from .arrays import contiguous_strides, cp_dtype, host_view, is_small, output_buffer, signature, to_device
from .device import get_device
from .library_sorts import LIBRARY, library_run, sort_epilogue_run

_ERR_WORDS = 5
# deferred runs in flight per thread before a run waits for the oldest ones (see _ThreadState)
DEFERRED_SLOTS = 64
# error blocks of replayed CUDA graphs with deferred errors, per thread (see prepared_call)
GRAPH_BLOCKS = 64
GRAPHS_PER_CALL = 4  # graphs kept per prepared signature and thread (distinct parameter sets)
_ZERO_RING = bytes((DEFERRED_SLOTS + GRAPH_BLOCKS) * _ERR_WORDS * 8)


@dataclass
class Step:
    kind: str  # kernel | library | host | copy
    seg: object
    run: object  # callable(env, ctx)
    desc: str = ""


@dataclass
class Prepared:
    plan: object
    types: dict
    steps: list
    compile_s: float = 0.0
    kernels: int = 0
    fallbacks: list = field(default_factory=list)
    # some kernel checks indices or divisors (writes the error word): a run must synchronize to
    # learn its outcome before it returns. Plans that cannot fail return once launched.
    may_fail: bool = False


class _ThreadState:
    """Per thread: its own stream, and error words in mapped pinned host memory. Kernels write a
    word directly (UVA), so a run needs no memset and no copy-back: the host clears it before
    launching and reads it after the stream synchronizes.

    Block 0 serves synchronous runs. Runs with deferred errors (`Engine(errors="deferred")`) each
    take their own block of a ring, so a failure names its run when a later call finds it. A
    captured CUDA graph of a deferred plan has a block of its own (its kernels' parameters are
    fixed), shared by its replays: a failure names the graph's fusion."""

    def __init__(self, cp):
        self.cp = cp
        # A blocking stream: work the caller queued on the legacy default stream (cp.asarray,
        # torch's default stream) is ordered before our launches and our results before later
        # default-stream work, with no host-side event; other threads' streams still overlap.
        self.stream = cp.cuda.Stream(non_blocking=False)
        self._scratch = None
        self.params: dict = {}  # kernel step -> its parameter block on this thread
        # counters kernels share on this stream (a multi-block histogram's ticket): zero between
        # launches, because each kernel that takes one zeroes it again before it ends
        with self.stream:
            self.ctr = cp.zeros(16, dtype=np.uint32)
        self.ctr_ptr = self.ctr.data.ptr
        self.buffers: dict = {}  # (kernel step, parameter) -> the buffer its last run allocated
        # deferred runs launched since the stream last drained without an error: their graphs,
        # in launch order; run i owns ring block i
        self.pending: list = []
        # graph blocks: the fusion of the deferred graph owning each, the free ones, and how many
        # deferred graph replays were launched since the stream last drained without an error
        self.graph_owner: list = [None] * GRAPH_BLOCKS
        self.graph_free: list = []
        self.graph_runs = 0
        self.capture_stream = None  # created at the first capture (see CupyRuntime._graphed_call)
        # a batch in progress (Engine.run_batch): the error blocks its runs claimed, as (owner,
        # "slot" | "graph", index); None outside a batch. `owner` names the run launching now.
        self.batch: list | None = None
        self.owner = None
        rt = cp.cuda.runtime
        self.mapped = False
        self.fallback_reason = ""
        words = _ERR_WORDS * (1 + DEFERRED_SLOTS + GRAPH_BLOCKS)
        try:
            self._host_ptr = rt.hostAlloc(words * 8, rt.hostAllocMapped | rt.hostAllocPortable)
            try:
                dev = rt.hostGetDevicePointer(self._host_ptr, 0)
            except AttributeError:  # with unified addressing the host pointer is the device pointer
                dev = self._host_ptr
            buf = (ctypes.c_int64 * words).from_address(self._host_ptr)
            every = np.frombuffer(buf, dtype=np.int64, count=words)
            every[:] = 0
            self.host = every[:_ERR_WORDS]
            blocks = every[_ERR_WORDS:].reshape(DEFERRED_SLOTS + GRAPH_BLOCKS, _ERR_WORDS)
            self.ring, self.gblocks = blocks[:DEFERRED_SLOTS], blocks[DEFERRED_SLOTS:]
            self.ring_host = self._host_ptr + _ERR_WORDS * 8
            self._ring_bytes = (ctypes.c_char * len(_ZERO_RING)).from_address(self.ring_host)
            self.word0 = ctypes.c_int64.from_address(self._host_ptr)
            self.ring_dev = int(dev) + _ERR_WORDS * 8
            self.gblock_dev = self.ring_dev + DEFERRED_SLOTS * _ERR_WORDS * 8
            self.graph_free = list(range(GRAPH_BLOCKS - 1, -1, -1))
            self.err_ptr = self.sync_err_ptr = int(dev)
            self.mapped = True
        except Exception as e:  # fall back to a device word copied back after each run
            self.fallback_reason = f"{type(e).__name__}: {e}"
            with self.stream:
                self.dev = cp.zeros(_ERR_WORDS, dtype=np.int64)
            pinned = cp.cuda.alloc_pinned_memory(_ERR_WORDS * 8)
            self._pinned = pinned
            self.host = np.frombuffer(pinned, np.int64, _ERR_WORDS)
            self.word0 = ctypes.c_int64.from_address(self.host.ctypes.data)
            self.err_ptr = self.sync_err_ptr = self.dev.data.ptr

    # ---- deferred errors -------------------------------------------------------------------
    def claim_slot(self, fusion) -> int:
        """The error block (device pointer) for a new deferred run of `fusion`. A full ring first
        drains the stream, which reports any failure among the runs it holds."""
        if len(self.pending) >= DEFERRED_SLOTS:
            if self.batch is not None:
                raise RuntimeError(f"a batch holds at most {DEFERRED_SLOTS} runs with deferred errors")
            self.stream.synchronize()
            self.settle(drained=True)
        i = len(self.pending)
        self.pending.append(fusion)
        if self.batch is not None:
            self.batch.append((self.owner, "slot", i))
        return self.ring_dev + i * (_ERR_WORDS * 8)

    def graph_replayed(self, blk: int) -> None:
        """A deferred graph with error block `blk` was replayed."""
        self.graph_runs += 1
        if self.batch is not None:
            self.batch.append((self.owner, "graph", blk))

    # ---- batches (Engine.run_batch) ----------------------------------------------------------
    def begin_batch(self) -> None:
        """Runs from now until `end_batch` launch with deferred errors, each in a block of its
        own, and nothing raises between them: `end_batch` waits once and names each failed run.
        An earlier deferred run's failure is raised here, before the batch starts."""
        if self.pending or self.graph_runs:
            self.synchronize()
        self.batch, self.owner = [], None

    def end_batch(self) -> dict:
        """Wait for the batch's runs; {owner: RunError} for each run whose block holds a failure."""
        claimed, self.batch, self.owner = self.batch or [], None, None
        self.stream.synchronize()
        failures: dict = {}
        if self.mapped and self._ring_bytes.raw != _ZERO_RING:
            for owner, kind, i in claimed:
                words = self.ring[i] if kind == "slot" else self.gblocks[i]
                if words[0] != 0 and owner not in failures:
                    fusion = self.pending[i] if kind == "slot" else self.graph_owner[i]
                    failures[owner] = _device_error(fusion, [int(x) for x in words])
            self.ring[:] = 0
            self.gblocks[:] = 0
        self.pending.clear()
        self.graph_runs = 0
        return failures

    def settle(self, drained: bool = False):
        """Raise the first failure among pending deferred runs, if one is visible already (or, with
        `drained`, forget them all once none failed). Costs one host-memory read while none did."""
        if self.batch is not None:
            return  # a batch reports its failures per run when it ends
        # only pending runs' and deferred graphs' blocks can be non-zero: compare them all (one
        # copy of 5 KiB and a memcmp; cheaper than working out the pending part in Python)
        if self._ring_bytes.raw == _ZERO_RING:
            if drained:
                self.pending.clear()
                self.graph_runs = 0
            return
        if not drained:
            self.stream.synchronize()  # the failing kernel may still be filling in its words
        failed = [(self.pending[i], self.ring[i]) for i in range(len(self.pending)) if self.ring[i, 0] != 0]
        failed += [(self.graph_owner[b], self.gblocks[b]) for b in range(GRAPH_BLOCKS) if self.gblocks[b, 0] != 0]
        fusion, words = failed[0]
        err = _device_error(fusion, [int(x) for x in words], cls=DeferredRunError)
        err.later_failures = len(failed) - 1
        self.ring[:] = 0
        self.gblocks[:] = 0
        self.pending.clear()
        self.graph_runs = 0
        raise err

    def synchronize(self):
        self.stream.synchronize()
        if self.pending or self.graph_runs:
            self.settle(drained=True)

    def launch_deferred(self, fusion, runs, env, ctx):
        """Launch a run's steps with their failures going to a block of the ring of its own."""
        self.err_ptr = self.claim_slot(fusion)
        try:
            for run in runs:
                run(env, ctx)
        finally:
            self.err_ptr = self.sync_err_ptr

    def outcome(self, fusion):
        """After a checked run was launched: wait for it, then raise an earlier deferred run's
        failure first (it happened first), then this run's."""
        self.fetch()
        self.stream.synchronize()
        if self.pending or self.graph_runs:
            self.settle(drained=True)
        if self.word0.value != 0:
            raise _device_error(fusion, [int(x) for x in self.host])

    def scratch_for(self, nbytes: int):
        """One scratch buffer per thread, grown on demand: steps of a run use it one after another
        on this thread's stream, so stream order keeps them apart."""
        buf = self._scratch
        if buf is None or buf.nbytes < nbytes:
            with self.stream:
                buf = self._scratch = self.cp.empty(max(nbytes, 1 << 16), dtype=np.uint8)
        return buf

    def reset(self):
        if self.mapped:
            self.word0.value = 0  # kernels claim word 0 first (atomicCAS), then fill the rest
        else:
            self.cp.cuda.runtime.memsetAsync(self.dev.data.ptr, 0, _ERR_WORDS * 8, self.stream.ptr)

    def fetch(self):
        if not self.mapped:
            rt = self.cp.cuda.runtime
            rt.memcpyAsync(self.host.ctypes.data, self.dev.data.ptr, _ERR_WORDS * 8, rt.memcpyDeviceToHost,
                           self.stream.ptr)


class _RunCtx:
    """One run's context: the runtime, the prepared plan and the calling thread's state (its
    stream, error word, scratch, parameter blocks and reusable buffers)."""

    __slots__ = ("rt", "stream", "sp", "prepared", "state", "graphs", "last_key")

    def __init__(self, rt, state, prepared):
        self.rt, self.stream, self.prepared, self.state = rt, state.stream, prepared, state
        self.sp = state.stream.ptr
        # the fast path's CUDA graphs of this plan on this thread: parameter bytes -> (graph,
        # error block or None); and the parameters of the last run that launched directly
        self.graphs: dict = {}
        self.last_key = None


class CupyRuntime:
    def __init__(self, cache_dir: str | None = None, planner=None, cache=None):
        """`planner(fusion, types) -> Plan`: how runs handed no plan are planned (default: the
        process's plan cache, as an Engine plans). `cache`: a kernel cache to share (the default
        runtime shares the device's), else one of its own in `cache_dir`."""
        device = get_device()
        self.cp = device.cp
        self.sm_count, self.arch = device.sm_count, device.arch
        self.cache = cache if cache is not None else device.kernel_cache(cache_dir)
        self.planner = planner
        # CUDA graphs for repeated kernels-only runs (SEGFUSE_CUDA_GRAPHS=0 turns them off); off
        # for good, with the reason kept, if a capture ever fails
        self.use_graphs = os.environ.get("SEGFUSE_CUDA_GRAPHS", "1") != "0"
        self.graph_fallback_reason = ""
        self.graph_captures = 0  # graphs captured so far (all threads)
        self._prepared: dict = {}
        self._plock = threading.Lock()
        self._tls = threading.local()

    def _thread_state(self):
        st = getattr(self._tls, "st", None)
        if st is None:
            st = self._tls.st = _ThreadState(self.cp)
        return st

    # ---- planning ------------------------------------------------------------------------
    def _plan(self, fusion, types, bound):
        """The plan for a run handed none (the Engine always hands its cached plan)."""
        if self.planner is not None:
            return self.planner(fusion, types)
        return SHARED_PLANS.get(fusion, bound)[0]

    def prepare(self, fusion, shapes: dict, dtypes: dict, strides: dict, plan=None) -> Prepared:
        key = (fusion.id, id(plan), tuple((k, shapes[k], dtypes[k], strides[k]) for k in shapes))
        hit = self._prepared.get(key)
        if hit is not None:
            return hit
        with self._plock:
            hit = self._prepared.get(key)
            if hit is not None:
                return hit
            bound = fusion.bind(shapes, dtypes)
            types = dict(bound.types)
            if plan is None:
                plan = self._plan(fusion, types, bound)
            for seg in plan.segments:  # private copies of scatter selfs have their source's type
                for c in getattr(seg, "copies", []) or []:
                    types.setdefault(c.dst, types[c.src])
            t0 = time.perf_counter()
            prep = Prepared(plan, types, [])
            prep.staged = [o.alias_of for o in fusion.outputs if o.alias_of is not None]
            c0 = self.cache.stats.compile_s
            for seg in plan.segments:
                prep.steps.append(self._step(fusion, seg, types, strides, prep))
            prep.compile_s = self.cache.stats.compile_s - c0
            prep.plan_s = time.perf_counter() - t0
            self._prepared[key] = prep
            return prep

    def prepared_for(self, fusion, inputs: dict) -> Prepared | None:
        """The most recently prepared entry of `fusion` for inputs of these shapes (what a run of
        them executes: its steps, launch count and fallbacks), or None."""
        shapes = {k: tuple(v.shape) for k, v in inputs.items()}
        for key, prep in reversed(list(self._prepared.items())):
            if key[0] == fusion.id and {k: s for k, s, _, _ in key[2]} == shapes:
                return prep
        return None

    def warmup(self, fusion, shapes: dict, dtypes: dict | None = None, plan=None) -> Prepared:
        """Compile a graph's kernels for these input shapes without running it. Given the plan a
        run will be handed (Engine.warmup passes its cached one), the entry is the one that run
        finds (contiguous inputs)."""
        dtypes = dtypes or {n: t.dtype for n, t in fusion.inputs}
        strides = {n: contiguous_strides(shapes[n]) for n in shapes}
        return self.prepare(fusion, {k: tuple(v) for k, v in shapes.items()}, dtypes, strides, plan)

    # ---- steps ---------------------------------------------------------------------------
    def _step(self, fusion, seg, types, in_strides, prep) -> Step:
        kind = getattr(seg.kind, "value", seg.kind)
        if not seg.nodes:
            return Step("copy", seg, _copy_step(self, seg, types), "copy")
        fused = sort_epilogue_run(self, fusion, seg, types)
        if fused is not None:
            run, may_fail = fused
            prep.kernels += 1
            prep.may_fail = prep.may_fail or may_fail  # (a checked divisor writes the error word)
            return Step("library", seg, run, ROUTINE)
        # A scatter writes straight into its self's buffer only when that buffer is materialized
        # before the segment (in place, ordered, or a staged alias_of input). Otherwise the kernel
        # initializes its own output from self (which is what a private copy means).
        aliased, alias_buf = set(), {}
        graph_inputs = set(fusion.input_names)
        staged = {o.alias_of for o in fusion.outputs if o.alias_of is not None}
        for a in getattr(seg, "aliases", []) or []:
            mode = getattr(a, "mode", "inplace")
            if a.buffer not in seg.inputs:
                continue
            if a.buffer in graph_inputs and a.buffer not in staged:
                continue
            node = next((fusion.nodes[p] for p in seg.nodes if a.tensor in fusion.nodes[p].outputs), None)
            if node is None or (node.inputs[0] != a.buffer and mode != "copy"):
                continue
            aliased.add(a.tensor)
            alias_buf[a.tensor] = a.buffer
        strides = {n: in_strides.get(n) or contiguous_strides(types[n].shape) for n in seg.inputs}
        try:
            mod = generate(fusion, seg, types, strides, aliased=aliased, sm_count=self.sm_count,
                           single_block=(kind == "single_block"))
        except Unsupported as e:
            return self._split_step(fusion, seg, types, strides, prep, str(e))
        return self._kernel(mod, types, alias_buf, prep, seg)

    def _kernel(self, mod, types, alias_buf, prep, seg) -> Step:
        rawmod = self.cache.get(mod.source)
        prep.kernels += len(mod.launches)
        prep.may_fail = prep.may_fail or mod.may_fail
        kernels = []
        for ln in mod.launches:
            k = rawmod.get_function(ln.kernel)
            if ln.smem > 48 * 1024:
                k.max_dynamic_shared_size_bytes = ln.smem
            kernels.append((k, ln))
        return Step("kernel", seg, _kernel_step(self, mod, kernels, types, alias_buf), mod.key)

    def _split_step(self, fusion, seg, types, strides, prep, why) -> Step:
        """The segment as several launches: one per anchor (grid mode), CuPy or host for the rest."""

        subs = []
        for nodes, ins, outs in split_nodes(fusion, seg.nodes, seg.inputs, seg.outputs):
            sub = Segment(seg.id, SegmentKind.pointwise, nodes, ins, outs, "split")
            try:
                mod = generate(fusion, sub, types, {n: strides.get(n) or contiguous_strides(types[n].shape) for n in ins},
                               sm_count=self.sm_count, single_block=False)
                subs.append(self._kernel(mod, types, {}, prep, sub))
            except Unsupported as e:
                lib = library_run(self, fusion, sub, types)
                anchor = fusion.nodes[nodes[-1]] if nodes else None
                if lib is None and anchor is not None and anchor.op.name in LIBRARY and len(nodes) > 1:
                    # materialize the sort's (lazily computed) input with a kernel, then CuPy sorts it
                    x = anchor.inputs[0]
                    if x not in ins:
                        pre = Segment(seg.id, SegmentKind.pointwise, nodes[:-1], ins, [x], "split")
                        pmod = generate(fusion, pre, types, {n: strides.get(n) or contiguous_strides(types[n].shape) for n in ins},
                                        sm_count=self.sm_count, single_block=False)
                        subs.append(self._kernel(pmod, types, {}, prep, pre))
                    one = Segment(seg.id, SegmentKind.library, [nodes[-1]], [x], outs, "split")
                    lib = library_run(self, fusion, one, types)
                if lib is not None:
                    prep.fallbacks.append(f"segment {seg.id}: library ({e})")
                    subs.append(Step("library", sub, lib, str(e)))
                else:
                    prep.fallbacks.append(f"segment {seg.id}: host ({e})")
                    subs.append(Step("host", sub, _host_step(self, fusion, sub, types), str(e)))
        prep.fallbacks.append(f"segment {seg.id}: split into {len(subs)} launches ({why})")

        def run(env, ctx):
            for s in subs:
                s.run(env, ctx)

        return Step("split", seg, run, why)

    # ---- running -------------------------------------------------------------------------
    def run(self, fusion, inputs: dict, plan=None, deferred: bool = False) -> tuple[dict, dict]:
        """Run `fusion` on `inputs` (the general path). With `deferred`, a plan whose kernels
        check data returns once launched, unless it updates an input in place; its failure is
        raised by a later call on this thread (`DeferredRunError`) or by `synchronize()`."""
        st = self._thread_state()
        stream = st.stream
        t0 = time.perf_counter()
        if st.pending:
            st.settle()
        with stream:
            shapes, dtypes, strides, arrays = to_device(self.cp, fusion, inputs)
            prep = self.prepare(fusion, shapes, dtypes, strides, plan)
            t1 = time.perf_counter()
            env = dict(arrays)
            ctx = _RunCtx(self, st, prep)
            # inputs updated in place (alias_of) are staged: the plan writes the copy, and the
            # caller's array changes only after the whole run succeeded
            for name in prep.staged:
                env[name] = arrays[name].copy()
            if prep.may_fail and deferred and _defers(fusion, st):
                st.launch_deferred(fusion, [step.run for step in prep.steps], env, ctx)
            elif prep.may_fail:
                st.reset()
                for step in prep.steps:
                    step.run(env, ctx)
                st.outcome(fusion)
            else:
                for step in prep.steps:
                    step.run(env, ctx)
            outs = self._commit(fusion, env, inputs, arrays)
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
        tls, new_state, rt = self._tls, self._thread_state, self
        outputs = tuple((o.name, o.alias_of) for o in fusion.outputs)
        steps = tuple(s.run for s in prep.steps)
        staged = tuple(prep.staged)
        may_fail = prep.may_fail
        defer = may_fail and deferred and _defers(fusion, st0)
        token = object()  # this call's run context in each thread's state

        def new_ctx(st):
            ctx = st.params[token] = _RunCtx(rt, st, prep)
            return ctx

        def context():
            st = getattr(tls, "st", None) or new_state()
            if st.pending:
                st.settle()  # an earlier deferred run's failure, once visible, fails this call
            return st, st.params.get(token) or new_ctx(st)

        def commit(env, ins, st):
            res = {}
            for name, alias in outputs:
                v = env[name]
                if alias is not None:
                    with st.stream:
                        ins[alias][...] = v
                    v = ins[alias]
                else:
                    for a in ins.values():
                        if v is a:
                            with st.stream:
                                v = v.copy()  # an output never exposes an input's buffer
                            break
                res[name] = v
            return res

        if all(s.kind == "kernel" for s in prep.steps) and not staged and self.use_graphs and st0.mapped:
            return self._graphed_call(fusion, prep, defer, tls, new_state, token, new_ctx, commit)

        if all(s.kind == "kernel" for s in prep.steps) and not staged:
            # kernels only: their steps allocate on the thread's stream themselves, so the call
            # needs no stream context (a few microseconds per call at decode sizes)
            def call(ins: dict) -> dict:
                st = getattr(tls, "st", None) or new_state()
                ctx = st.params.get(token) or new_ctx(st)
                env = dict(ins)
                if may_fail and not defer:
                    st.reset()
                    for run in steps:
                        run(env, ctx)
                    res = commit(env, ins, st)  # (no writes to inputs here: built while the GPU works)
                    st.outcome(fusion)  # (raises an earlier deferred run's failure first)
                    return res
                if defer:
                    st.launch_deferred(fusion, steps, env, ctx)
                else:
                    for run in steps:
                        run(env, ctx)
                if st.pending:
                    # an earlier deferred run's failure, once visible, fails this call. Checked
                    # after the launch, while the GPU works: this run's outputs are then dropped
                    # (its own failure, if any, is counted among the later ones)
                    st.settle()
                return commit(env, ins, st)

            return call

        def call_general(ins: dict) -> dict:
            st, ctx = context()
            stream = st.stream
            with stream:
                env = dict(ins)
                for name in staged:
                    env[name] = ins[name].copy()
                if defer:
                    st.launch_deferred(fusion, steps, env, ctx)
                elif may_fail:
                    st.reset()
                    for run in steps:
                        run(env, ctx)
                    st.outcome(fusion)
                else:
                    for run in steps:
                        run(env, ctx)
                res = commit(env, ins, st)
                if staged:
                    stream.synchronize()
            return res

        return call_general

    def _graphed_call(self, fusion, prep, defer, tls, new_state, token, new_ctx, commit):
        """The kernels-only fast path with CUDA graphs. A run binds every kernel's parameter block
        first (tensor pointers, outputs allocated); when those bytes equal the last run's, the
        launches are captured once into a graph, and later runs with the same parameters replay
        it: one `cuGraphLaunch` instead of a `cuLaunchKernel` per kernel (on the H200 host 1.6 us
        against 5.8 us for one kernel; benchmarks/README.md). Parameters seen for the first time
        launch directly, so runs on ever new buffers never pay for a capture. Errors: a checked
        plan's graph writes the thread's synchronous error block like a direct run; a deferred
        plan's graph has an error block of its own (`_ThreadState.graph_owner`)."""
        rt = self
        binds = tuple(s.run.bind for s in prep.steps)
        fires = tuple(s.run.fire for s in prep.steps)
        may_fail = prep.may_fail
        checked = may_fail and not defer  # waits for the outcome before returning
        block_bytes = _ERR_WORDS * 8

        def release(st, blk):
            st.graph_owner[blk] = None
            st.graph_free.append(blk)

        def capture(st, ctx, key, recs):
            if not rt.use_graphs:
                return None
            graphs = ctx.graphs
            full = len(graphs) >= GRAPHS_PER_CALL
            if full and st.batch is not None:
                return None  # no eviction inside a batch: a dropped graph's block may hold a failure
            if defer and not full and not st.graph_free:
                return None  # every graph block is taken (by other plans' graphs)
            if full:  # the oldest goes (a deferred plan's frees its block)
                _graph, old = graphs.pop(next(iter(graphs)))
                if old is not None:
                    try:
                        st.synchronize()  # its replays may still write its block (raises their failure)
                    finally:
                        release(st, old)
            blk, err = None, st.sync_err_ptr
            if defer:
                if not st.graph_free:
                    return None
                blk = st.graph_free.pop()
                st.graph_owner[blk] = fusion
                err = st.gblock_dev + blk * block_bytes
            # captured on a non-blocking stream of the thread's own: capturing a blocking stream
            # makes other threads' work on the legacy stream fail (cudaErrorStreamCaptureImplicit)
            # while it lasts. Replays run on the thread's blocking stream, ordered as direct runs.
            stream = st.capture_stream
            if stream is None:
                stream = st.capture_stream = rt.cp.cuda.Stream(non_blocking=True)
            try:
                stream.begin_capture()
                try:
                    for rec, fire in zip(recs, fires):
                        fire(rec, err, stream.ptr)
                finally:
                    graph = stream.end_capture()
            except Exception as e:  # no graphs on this runtime from now on; this run launches directly
                rt.use_graphs = False
                rt.graph_fallback_reason = f"{type(e).__name__}: {e}"
                if blk is not None:
                    release(st, blk)
                return None
            g = graphs[key] = (graph, blk)
            rt.graph_captures += 1
            return g

        def call(ins: dict) -> dict:
            st = getattr(tls, "st", None) or new_state()
            ctx = st.params.get(token) or new_ctx(st)
            env = dict(ins)
            recs = [bind(env, ctx) for bind in binds]
            key = b"".join([bytes(r[0]) for r in recs])  # every parameter but the error block's
            g = ctx.graphs.get(key)
            if g is None:
                if key == ctx.last_key:  # the same parameters twice in a row: capture them
                    g = capture(st, ctx, key, recs)
                else:
                    ctx.last_key = key
            if checked:
                st.reset()
                if g is None:
                    for rec, fire in zip(recs, fires):
                        fire(rec, st.sync_err_ptr, ctx.sp)
                else:
                    g[0].launch(st.stream)
                res = commit(env, ins, st)  # (no writes to inputs here: built while the GPU works)
                st.outcome(fusion)  # (raises an earlier deferred run's failure first)
                return res
            if g is None:
                err = st.claim_slot(fusion) if defer else st.sync_err_ptr
                for rec, fire in zip(recs, fires):
                    fire(rec, err, ctx.sp)
            else:
                g[0].launch(st.stream)
                if g[1] is not None:
                    st.graph_replayed(g[1])
            if st.pending or st.graph_runs:
                st.settle()  # after the launch, as in prepared_call's other kernels-only path
            return commit(env, ins, st)

        return call

    def runner(self, fusion, inputs: dict, plan=None):
        """A lean callable for one input signature (shapes/dtypes/strides of `inputs`): the
        serving fast path once a graph is warm. Other signatures take the general path."""
        if plan is None:
            bound = fusion.bind({k: tuple(v.shape) for k, v in inputs.items()})
            plan = self._plan(fusion, dict(bound.types), bound)
        call = self.prepared_call(fusion, inputs, plan)
        key = signature(fusion, inputs)
        if call is None or key is None:
            return lambda ins: self.run(fusion, ins, plan)[0]

        def checked(ins: dict) -> dict:
            if signature(fusion, ins) != key:
                return self.run(fusion, ins, plan)[0]  # another signature: the general path
            return call(ins)

        return checked

    def kernel_time_us(self, fusion, inputs: dict, reps: int = 20, warmup: int = 3) -> float:
        """Mean device time of a prepared graph's launches alone. The stream is first held by a
        spin kernel longer than the host needs to enqueue all repetitions, so CUDA events measure
        the kernels back to back, without the host's launch cost."""
        cp = self.cp
        st = self._thread_state()
        stream = st.stream
        with stream:
            shapes, dtypes, strides, arrays = to_device(self.cp, fusion, inputs)
            prep = self.prepare(fusion, shapes, dtypes, strides, None)
            ctx = _RunCtx(self, st, prep)
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

    def _commit(self, fusion, env, inputs, arrays):
        cp = self.cp
        result = {}
        for o in fusion.outputs:
            v = env[o.name]
            if o.alias_of is not None:
                dst = inputs[o.alias_of]
                if isinstance(dst, cp.ndarray):
                    dst[...] = v
                    result[o.name] = dst
                else:
                    h = cp.asnumpy(v)
                    np.copyto(dst, h.view(dst.dtype) if h.dtype != dst.dtype else h)
                    result[o.name] = cp.asarray(v)
            elif any(v is a for a in arrays.values()):
                result[o.name] = v.copy()  # an output never exposes an input's buffer
            else:
                result[o.name] = v
        return result


_SPIN = []


def _spin_kernel(cp):
    """A one-thread kernel that waits `ns` nanoseconds of GPU time (the global timer)."""
    if not _SPIN:
        _SPIN.append(cp.RawKernel(
            'extern "C" __global__ void sf_spin(unsigned long long ns) { unsigned long long t0, t;'
            ' asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));'
            ' do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns); }', "sf_spin"))
    return _SPIN[0]


_ERROR_TEXT = {
    1: lambda op, v, d, s: f"{op}: index {v} is out of bounds for dimension {d} with size {s}",
    2: lambda op, v, d, s: "integer division by zero",
    3: lambda op, v, d, s: "integers to negative integer powers are not allowed",
}


def _device_error(fusion, w, cls=RunError):
    code, op_index, value, dim, size = w
    name = next((nd.op.name for nd in fusion.nodes if nd.index == op_index), "op")
    text = _ERROR_TEXT.get(code, lambda *a: f"device error code {code}")(name, value, dim, size)
    if cls is DeferredRunError:
        text = f"an earlier run of graph '{fusion.name}' failed: {text}"
    return cls([Issue(("ops", op_index, "inputs", 1), text)])


def _kernel_step(rt, mod, kernels, types, alias_buf):
    """Launches through the driver (`cuLaunchKernel` via CuPy's thin binding) with a parameter
    block prepared once per thread: a run only writes the pointers that changed (3-4 us less per
    launch than a RawKernel call, which converts every argument each time).

    The returned `run(env, ctx)` is `fire(bind(env, ctx), error block, stream)`: `bind` fills the
    block's tensor pointers (allocating outputs) and zeroes its error-block entry, so the block's
    bytes identify a launch for the fast path's CUDA graphs; `fire` sets the error block and
    launches."""
    cp = rt.cp
    launch = cp.cuda.driver.launchKernel
    params = tuple(mod.params)
    n_params = len(params)
    n = n_params + 3  # tensors, then scratch, the error word and the counters: all pointers
    err_i = n_params + 1
    scratch_bytes = mod.scratch_bytes
    vec_align = 32  # sf_v4<double> is 32-byte aligned; every other vector needs 16 or less
    seq = tuple((k.kernel.ptr, ln.grid, ln.block, ln.smem, ln.vector_of is not None) for k, ln in kernels)
    token = object()  # this step's parameter block in each thread's state
    empty = cp.empty
    spec = {p: (tuple(types[p].shape), cp_dtype(types[p].dtype)) for p in params if p in types}
    small = {p for p, (shape, dt) in spec.items() if is_small(shape, dt)}
    # per parameter, what a run needs when the env lacks it (an output): decided once here
    slots = tuple((i, p, alias_buf.get(p), (token, i)) + (spec.get(p, (None, None))) + (p in small,)
                  for i, p in enumerate(params))

    def param_block(st):
        vals = (ctypes.c_uint64 * n)()
        vals[n_params + 2] = st.ctr_ptr  # the thread's counters: the same for every run
        ptrs = (ctypes.c_void_p * n)(*[ctypes.addressof(vals) + 8 * i for i in range(n)])
        rec = st.params[token] = [vals, ptrs, ctypes.addressof(ptrs), True]  # (+ all aligned)
        return rec

    def bind(env, ctx):
        st = ctx.state
        rec = st.params.get(token) or param_block(st)
        vals = rec[0]
        aligned = True
        for i, p, src, key, shape, dt, is_small_ in slots:
            a = env.get(p)
            if a is None:
                if src is not None:
                    a = env[src]
                else:
                    a = output_buffer(ctx, key, shape, dt, is_small_, empty)
                env[p] = a
            ptr = a.data.ptr
            vals[i] = ptr
            if ptr % vec_align:
                aligned = False
        if scratch_bytes:
            vals[n_params] = st.scratch_for(scratch_bytes).data.ptr
        vals[err_i] = 0
        rec[3] = aligned
        return rec

    def fire(rec, err_ptr, sp):
        vals, _keep, addr, aligned = rec
        vals[err_i] = err_ptr
        skip_next = False
        for fptr, grid, block, smem, is_vector in seq:
            if skip_next:
                skip_next = False
                continue
            if is_vector:  # the vector variant runs only when every tensor is aligned
                if aligned:
                    launch(fptr, grid, 1, 1, block, 1, 1, smem, sp, addr, 0)
                    skip_next = True
                continue
            launch(fptr, grid, 1, 1, block, 1, 1, smem, sp, addr, 0)

    def run(env, ctx):
        fire(bind(env, ctx), ctx.state.err_ptr, ctx.sp)

    run.bind, run.fire = bind, fire
    return run


def _copy_step(rt, seg, types):
    pairs = [(c.src, c.dst) for c in getattr(seg, "copies", []) or []] or list(zip(seg.inputs, seg.outputs))

    def run(env, ctx):
        for i, o in pairs:
            env[o] = env[i].copy()

    return run


def _host_step(rt, fusion, seg, types):
    """Last resort: the NumPy references on the host (exact semantics, slow)."""
    cp = rt.cp
    nodes = [fusion.nodes[p] for p in seg.nodes]

    def run(env, ctx):
        values = {}
        for n in seg.inputs:
            values[n] = host_view(cp.asnumpy(env[n], stream=ctx.stream), types[n].dtype)
        ctx.stream.synchronize()
        for nd in nodes:
            for x in nd.inputs:
                if isinstance(x, str) and x not in values:
                    values[x] = host_view(cp.asnumpy(env[x], stream=ctx.stream), types[x].dtype)
            eval_node(nd, values, types)
        for o in seg.outputs:
            h = np.require(values[o], requirements="C")  # keeps 0-d (ascontiguousarray makes 1-d)
            if types[o].dtype is DType.bfloat16:
                h = h.view(np.uint16)
            env[o] = cp.asarray(h)

    return run


_RUNTIME = None
_RLOCK = threading.Lock()


def _defers(fusion, st) -> bool:
    """Whether a run of `fusion` may return before its checks finished: not when it updates an
    input in place (that commit waits for the outcome), nor without mapped error words."""
    return st.mapped and all(o.alias_of is None for o in fusion.outputs)


def get_runtime() -> CupyRuntime:
    global _RUNTIME
    with _RLOCK:
        if _RUNTIME is None:
            try:
                _RUNTIME = CupyRuntime(cache=get_device().cache)
            except ImportError as e:
                raise RuntimeError(f"the cupy backend needs CuPy and a CUDA GPU ({e})") from None
        return _RUNTIME
