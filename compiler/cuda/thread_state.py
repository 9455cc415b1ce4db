"""Per-thread state of the CUDA runtime: each thread's stream, its error words in mapped pinned
host memory (a synchronous block, a ring of blocks for runs with deferred errors, blocks for
deferred CUDA graphs), scratch and parameter blocks; and the errors the device reports."""

from __future__ import annotations

import ctypes
import threading
import weakref

import numpy as np

from ..errors import DeferredRunError, Issue, RunError

ERR_WORDS = 5
# deferred runs in flight per thread before a run waits for the oldest ones (see ThreadState)
DEFERRED_SLOTS = 64
# error blocks of replayed CUDA graphs with deferred errors, per thread (see prepared_call)
GRAPH_BLOCKS = 64
ZERO_RING = bytes((DEFERRED_SLOTS + GRAPH_BLOCKS) * ERR_WORDS * 8)


# Every state whose `params` / `buffers` / `ctxs` hold entries keyed by an owner's tokens (thread
# states, and the external-stream path's stream states): `forget` purges a dead owner's entries.
_STATES: weakref.WeakSet = weakref.WeakSet()
_STATES_LOCK = threading.RLock()  # (re-entrant: a finalizer may run while `track` holds it)


def track(state) -> None:
    """Register a state whose entries `forget` must reach."""
    with _STATES_LOCK:
        _STATES.add(state)


def forget(tokens) -> None:
    """Drop what any state keeps under one of `tokens` (`params[t]`, `ctxs[t]`, `buffers[(t, ..)]`):
    their owner (a prepared entry, a fast-path call) is gone, so nothing can look them up again.
    Without this, each evicted prepared entry would leave its parameter blocks, run contexts,
    CUDA graphs and reusable buffers in every thread that ran it, and a server meeting many shape
    classes would grow without bound. Runs from the owner's finalizer, in any thread: popping keys
    no run can reach is safe next to the owning thread's use of the same dicts."""
    toks = set(tokens)
    with _STATES_LOCK:
        states = list(_STATES)
    for st in states:
        for t in toks:
            st.params.pop(t, None)
            ctxs = getattr(st, "ctxs", None)
            if ctxs:
                ctxs.pop(t, None)
        buffers = st.buffers
        for key in [k for k in list(buffers) if type(k) is tuple and k[0] in toks]:
            buffers.pop(key, None)


def owned_by(owner, tokens) -> None:
    """`forget(tokens)` once `owner` is collected (no cost to the runs in between)."""
    fin = weakref.finalize(owner, forget, tuple(tokens))
    fin.atexit = False  # at interpreter exit the states go anyway (and CuPy may be gone first)


class ThreadState:
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
        track(self)  # (the keys are owners' tokens: `forget` drops a dead owner's entries)
        # deferred runs launched since the stream last drained without an error: their graphs,
        # in launch order; run i owns ring block i
        self.pending: list = []
        # graph blocks: the fusion of the deferred graph owning each, the free ones, and how many
        # deferred graph replays were launched since the stream last drained without an error
        self.graph_owner: list = [None] * GRAPH_BLOCKS
        self.graph_free: list = []
        self.graph_runs = 0
        self.capture_stream = None  # created at the first capture (see graphs.graphed_call)
        # a batch in progress (Engine.run_batch): the error blocks its runs claimed, as (owner,
        # "slot" | "graph", index); None outside a batch. `owner` names the run launching now.
        self.batch: list | None = None
        self.owner = None
        rt = cp.cuda.runtime
        self.mapped = False
        self.fallback_reason = ""
        words = ERR_WORDS * (1 + DEFERRED_SLOTS + GRAPH_BLOCKS)
        try:
            self._host_ptr = rt.hostAlloc(words * 8, rt.hostAllocMapped | rt.hostAllocPortable)
            try:
                dev = rt.hostGetDevicePointer(self._host_ptr, 0)
            except AttributeError:  # with unified addressing the host pointer is the device pointer
                dev = self._host_ptr
            buf = (ctypes.c_int64 * words).from_address(self._host_ptr)
            every = np.frombuffer(buf, dtype=np.int64, count=words)
            every[:] = 0
            self.host = every[:ERR_WORDS]
            blocks = every[ERR_WORDS:].reshape(DEFERRED_SLOTS + GRAPH_BLOCKS, ERR_WORDS)
            self.ring, self.gblocks = blocks[:DEFERRED_SLOTS], blocks[DEFERRED_SLOTS:]
            self.ring_host = self._host_ptr + ERR_WORDS * 8
            self._ring_bytes = (ctypes.c_char * len(ZERO_RING)).from_address(self.ring_host)
            self.word0 = ctypes.c_int64.from_address(self._host_ptr)
            self.ring_dev = int(dev) + ERR_WORDS * 8
            self.gblock_dev = self.ring_dev + DEFERRED_SLOTS * ERR_WORDS * 8
            self.graph_free = list(range(GRAPH_BLOCKS - 1, -1, -1))
            self.err_ptr = self.sync_err_ptr = int(dev)
            self.mapped = True
        except Exception as e:  # fall back to a device word copied back after each run
            self.fallback_reason = f"{type(e).__name__}: {e}"
            with self.stream:
                self.dev = cp.zeros(ERR_WORDS, dtype=np.int64)
            pinned = cp.cuda.alloc_pinned_memory(ERR_WORDS * 8)
            self._pinned = pinned
            self.host = np.frombuffer(pinned, np.int64, ERR_WORDS)
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
        return self.ring_dev + i * (ERR_WORDS * 8)

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
        if self.mapped and self._ring_bytes.raw != ZERO_RING:
            for owner, kind, i in claimed:
                words = self.ring[i] if kind == "slot" else self.gblocks[i]
                if words[0] != 0 and owner not in failures:
                    fusion = self.pending[i] if kind == "slot" else self.graph_owner[i]
                    failures[owner] = device_error(fusion, [int(x) for x in words])
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
        if self._ring_bytes.raw == ZERO_RING:
            if drained:
                self.pending.clear()
                self.graph_runs = 0
            return
        if not drained:
            self.stream.synchronize()  # the failing kernel may still be filling in its words
        failed = [(self.pending[i], self.ring[i]) for i in range(len(self.pending)) if self.ring[i, 0] != 0]
        failed += [(self.graph_owner[b], self.gblocks[b]) for b in range(GRAPH_BLOCKS) if self.gblocks[b, 0] != 0]
        fusion, words = failed[0]
        err = device_error(fusion, [int(x) for x in words], cls=DeferredRunError)
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

    def execute(self, fusion, runs, env, ctx, may_fail: bool, defer: bool, writes: bool, commit):
        """The one rule of every run path (CupyRuntime.run, the fast path's calls; the CUDA-graph
        path follows it with graph launches): launch `runs`, then return `commit()`'s outputs.
        - `defer` (deferred errors, nothing written in place): returns once launched; the run's
          failure is raised by a later call on this thread or by `synchronize()`;
        - `may_fail` otherwise: waits for the outcome and raises this run's failure; the commit
          runs first, while the GPU works, unless it `writes` inputs (in-place updates are
          committed only after success);
        - a plan that cannot fail returns once launched.
        An earlier deferred run's failure, once visible, fails this call: a deferred run checks
        before its launch (so it never reports its own failure), any other after it, while the GPU
        works (its own failure, if any, is then counted among the later ones)."""
        if defer:
            if self.pending or self.graph_runs:
                self.settle()
            self.launch_deferred(fusion, runs, env, ctx)
            return commit()
        if may_fail:
            self.reset()
        for run in runs:
            run(env, ctx)
        if may_fail:
            if writes:
                self.outcome(fusion)
                return commit()
            res = commit()
            self.outcome(fusion)  # (raises an earlier deferred run's failure first)
            return res
        if self.pending or self.graph_runs:
            self.settle()
        return commit()

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
            raise device_error(fusion, [int(x) for x in self.host])

    @property
    def scratch(self):
        """The thread's scratch buffer now (None before a step needed one)."""
        return self._scratch

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
            self.cp.cuda.runtime.memsetAsync(self.dev.data.ptr, 0, ERR_WORDS * 8, self.stream.ptr)

    def fetch(self):
        if not self.mapped:
            rt = self.cp.cuda.runtime
            rt.memcpyAsync(self.host.ctypes.data, self.dev.data.ptr, ERR_WORDS * 8, rt.memcpyDeviceToHost,
                           self.stream.ptr)


class RunCtx:
    """One run's context: the runtime, the prepared plan and the calling thread's state (its
    stream, error word, scratch, parameter blocks and reusable buffers). It does not hold the
    prepared entry: a state keeping the context must not keep an evicted entry alive."""

    __slots__ = ("rt", "stream", "sp", "state", "graphs", "last_key", "memo", "memo_wait")

    def __init__(self, rt, state):
        self.rt, self.stream, self.state = rt, state.stream, state
        self.sp = state.stream.ptr
        # the fast path's CUDA graphs of this plan on this thread: parameter bytes -> (graph,
        # error block or None); and the parameters of the last run that launched directly
        self.graphs: dict = {}
        self.last_key = None
        # the last replayed graph with its arrays (graphs.graphed_call's replay memo), and how many
        # calls store none (after a miss; -1: never, the run holds too much)
        self.memo = None
        self.memo_wait = 0


_ERROR_TEXT = {
    1: lambda op, v, d, s: f"{op}: index {v} is out of bounds for dimension {d} with size {s}",
    2: lambda op, v, d, s: "integer division by zero",
    3: lambda op, v, d, s: "integers to negative integer powers are not allowed",
}


def device_error(fusion, w, cls=RunError):
    code, op_index, value, dim, size = w
    name = next((nd.op.name for nd in fusion.nodes if nd.index == op_index), "op")
    text = _ERROR_TEXT.get(code, lambda *a: f"device error code {code}")(name, value, dim, size)
    if cls is DeferredRunError:
        text = f"an earlier run of graph '{fusion.name}' failed: {text}"
    return cls([Issue(("ops", op_index, "inputs", 1), text)])


def defers(fusion, st) -> bool:
    """Whether a run of `fusion` may return before its checks finished: not when it updates an
    input in place (that commit waits for the outcome), nor without mapped error words."""
    return st.mapped and all(o.alias_of is None for o in fusion.outputs)
