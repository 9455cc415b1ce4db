"""Running a prepared plan on a stream the caller owns (PyTorch's current stream, say), with no host
synchronization, so that a call can be captured into the caller's CUDA graph.

The runtime's own run paths (compiler/cuda/runtime.py) launch on a per-thread stream of their own,
reuse output buffers across runs and wait for checked plans. Here instead:

- `StreamStates` hands out a `StreamState` per (thread, stream pointer): what a plan's steps read
  from a run's thread state (parameter blocks, the zeroed counters kernels share on one stream, the
  radix sort's launch block, scratch, reusable buffers, the error block). States are made ahead,
  outside any capture (their counters are zeroed by a memset that must run, not be captured), and
  a stream seen for the first time during a capture takes one from that stock with no CUDA call.
- Nothing is kept between calls: every output, intermediate and scratch buffer is allocated in the
  call, from whatever allocator is current (the caller points CuPy's at its own: torch_ext does at
  torch's caching allocator, so that allocations during a capture come from the graph's pool), and
  freed in stream order. A captured graph therefore holds no pointer into memory a later call reuses.
  (`ExternalStreams.launcher` keeps CUDA graphs of a plan's own launches, not memory: one is
  replayed only by a call whose parameter blocks hold its pointers again, that call's buffers.)
- Device errors (a bad index) go to an error block of the caller's (`ErrorBlocks`, mapped pinned
  host memory): one block per owner shared by all its calls and replays, first failure kept, read
  later by `ErrorBlocks.failures` once the caller has synchronized; as the deferred mode does.
"""

from __future__ import annotations

import ctypes
import threading
import warnings

import numpy as np

from ..errors import DeferredRunError
from . import radix_sort
from .arrays import cp_dtype
from .graphs import capture_launches
from .thread_state import ERR_WORDS, RunCtx, device_error, track

BLOCKS_PER_CHUNK = 256  # error blocks per mapped pinned allocation
# CUDA graphs kept per prepared entry and stream state (distinct parameter sets, each captured
# when seen again among the last few calls' sets; past that the oldest goes)
GRAPHS_PER_STATE = 4
STATES_AHEAD = 8  # stream states made ahead, for streams first seen during a capture
MAX_STATES = 512  # (thread, stream) pairs kept; past that the oldest state serves the new pair


class ErrorBlocks:
    """Error blocks in mapped pinned host memory, one per owner (an op), handed out by `claim`.
    Kernels write a block directly (UVA) and claim its word 0 first, so the first failure since the
    block was last cleared is the one it holds."""

    def __init__(self, cp):
        self.cp = cp
        self._lock = threading.Lock()
        self._chunks: list = []  # (host words [n, ERR_WORDS], device base pointer, raw bytes view)
        self._owners: list = []  # owner per block, in claim order
        self._zero = bytes(BLOCKS_PER_CHUNK * ERR_WORDS * 8)

    def _grow(self):
        rt = self.cp.cuda.runtime
        nbytes = BLOCKS_PER_CHUNK * ERR_WORDS * 8
        host = rt.hostAlloc(nbytes, rt.hostAllocMapped | rt.hostAllocPortable)
        try:
            dev = rt.hostGetDevicePointer(host, 0)
        except AttributeError:  # with unified addressing the host pointer is the device pointer
            dev = host
        raw = (ctypes.c_char * nbytes).from_address(host)
        ctypes.memset(host, 0, nbytes)
        words = np.frombuffer(raw, dtype=np.int64).reshape(BLOCKS_PER_CHUNK, ERR_WORDS)
        self._chunks.append((words, int(dev), raw))

    def claim(self, owner) -> int:
        """A block for `owner` (anything with `.fusion`); returns its device pointer. Allocates
        host memory when every block is taken: call it outside a capture."""
        with self._lock:
            i = len(self._owners)
            if i // BLOCKS_PER_CHUNK >= len(self._chunks):
                self._grow()
            self._owners.append(owner)
            words, dev, _ = self._chunks[i // BLOCKS_PER_CHUNK]
            return dev + (i % BLOCKS_PER_CHUNK) * ERR_WORDS * 8

    def dirty(self) -> bool:
        """Whether some block holds a failure (one read of host memory per chunk, no synchronization;
        a failure still being written shows here once its word 0 is)."""
        zero = self._zero
        for _, _, raw in self._chunks:  # (a loop, not any() over a generator: every call pays it)
            if raw.raw != zero:
                return True
        return False

    def failures(self) -> list:
        """(owner, error words) of every block holding a failure, the blocks cleared. Call it once
        the work that wrote them has finished (the caller synchronized)."""
        found = []
        with self._lock:
            for c, (words, _, _) in enumerate(self._chunks):
                for j in np.flatnonzero(words[:, 0]):
                    found.append((self._owners[c * BLOCKS_PER_CHUNK + int(j)], [int(x) for x in words[j]]))
                    words[j] = 0
        return found

    def raise_failures(self) -> None:
        """Raise the first failure found (a DeferredRunError naming the graph, op and index; how many
        others there were in `later_failures`), clearing every block. Call it after synchronizing."""
        found = self.failures()
        if found:
            owner, words = found[0]
            err = device_error(owner.fusion, words, cls=DeferredRunError)
            err.later_failures = len(found) - 1
            raise err


class _NoReuse(dict):
    """`buffers` of a StreamState: nothing is kept, so each run allocates its plan buffers afresh (a
    buffer reused across calls would be written by an earlier call's captured graph too)."""

    def __setitem__(self, key, value):
        pass


class StreamState:
    """What a prepared plan's steps use from a run's thread state (see ThreadState), for one
    (thread, stream) pair: the stream, parameter blocks, counters, and per call the error block."""

    mapped = True

    def __init__(self, cp, make_stream):
        self.cp = cp
        self.stream = None
        self.params: dict = {}
        self.buffers = _NoReuse()
        self.ctxs: dict = {}
        track(self)  # (its params and ctxs are keyed by owners' tokens: see thread_state.forget)
        self.err_ptr = 0
        self.capture_stream = None  # made at the first CUDA graph capture (ExternalStreams.launcher)
        with make_stream:  # zeroed now, on a stream of our own (the caller synchronizes it)
            self.ctr = cp.zeros(16, dtype=np.uint32)
            # the radix sort's launch block and counters in this state (what radix_sort.argsort
            # would make at its first launch, with a memset that must not be captured)
            self.params[radix_sort._STATE_KEY] = radix_sort._Launch(cp, make_stream)
        self.ctr_ptr = self.ctr.data.ptr

    def bind(self, stream) -> StreamState:
        self.stream = stream
        self.ctxs: dict = {}  # prepared entry's ctx_token -> RunCtx on this stream
        return self

    def scratch_for(self, nbytes: int):
        """Scratch for one step, allocated now and freed in stream order after its launch."""
        return self.cp.empty(max(nbytes, 1), dtype=np.uint8)


class StreamStates:
    """StreamState per (thread, stream pointer), from a stock made ahead (see the module doc)."""

    def __init__(self, cp):
        self.cp = cp
        self._lock = threading.Lock()
        self._by_key: dict = {}
        self._stock: list = []
        self._own = cp.cuda.Stream(non_blocking=True)

    def refill(self) -> None:
        """Make states ahead until STATES_AHEAD are in stock (outside a capture: it synchronizes)."""
        if len(self._stock) >= STATES_AHEAD:
            return
        with self._lock:
            if len(self._stock) >= STATES_AHEAD:
                return
            while len(self._stock) < STATES_AHEAD:
                self._stock.append(StreamState(self.cp, self._own))
            self._own.synchronize()

    def get(self, stream_ptr: int) -> StreamState:
        """The state of this thread on the stream `stream_ptr` (a stock state the first time; no
        CUDA call). RuntimeError when the stock is empty: `refill` outside a capture first."""
        key = (threading.get_ident(), stream_ptr)
        st = self._by_key.get(key)
        if st is not None:
            return st
        with self._lock:
            if len(self._by_key) >= MAX_STATES:  # the oldest pair's state serves this one
                st = self._by_key.pop(next(iter(self._by_key)))
            elif self._stock:
                st = self._stock.pop()
            else:
                raise RuntimeError("segfuse: no stream state left for a new stream during a CUDA graph capture; "
                                   "run the op (or its warmup) once outside the capture first")
            self._by_key[key] = st.bind(external_stream(self.cp, stream_ptr))
            return st


class _StreamRef:
    """A stream pointer as the CUDA stream protocol presents it (`__cuda_stream__`)."""

    __slots__ = ("ptr",)

    def __init__(self, ptr: int):
        self.ptr = ptr

    def __cuda_stream__(self):
        return (0, self.ptr)


def external_stream(cp, ptr: int):
    """A CuPy stream object for a stream the caller owns (no CUDA call): `Stream.from_external`
    where CuPy has it (14+), else `ExternalStream`; the legacy default stream is CuPy's null stream."""
    if ptr == 0:
        return cp.cuda.Stream.null
    from_external = getattr(cp.cuda.Stream, "from_external", None)
    if from_external is not None:
        try:
            return from_external(_StreamRef(ptr))
        except Exception:  # an older protocol: the deprecated class still works
            pass
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return cp.cuda.ExternalStream(ptr)


def launch(rt, prep, env: dict, st: StreamState, err_ptr: int) -> None:
    """Launch a prepared plan's steps on `st`'s stream, failures to the error block `err_ptr`;
    `env` holds the inputs and receives every tensor the steps make. Allocations use the current
    CuPy allocator, on that stream (the caller has made it CuPy's current stream)."""
    ctx = st.ctxs.get(prep.ctx_token)
    if ctx is None:
        ctx = st.ctxs[prep.ctx_token] = RunCtx(rt, st)
    st.err_ptr = err_ptr
    for step in prep.steps:
        step.run(env, ctx)


def _capture(rt, st: StreamState, ctx, key: bytes, recs, fires, err_ptr: int):
    """The launches of `recs` as a CUDA graph kept under `key` (graphs.capture_launches; None where a capture
    fails). Replayed on the caller's stream."""
    graph = capture_launches(rt, st, recs, fires, err_ptr)
    if graph is not None:
        ctx.graphs[key] = graph
    return graph


def host_steps(prep) -> list:
    """Descriptions of the prepared plan's steps that run on the host (they synchronize, so they
    cannot be captured), split steps included."""
    return [f for f in prep.fallbacks if ": host (" in f]


class ExternalStreams:
    """Prepared plans run on callers' streams (segfuse.torch's CUDA path goes through this, handed
    out by the CUDA backend): the runtime's preparation, the error blocks, the stream states."""

    def __init__(self, rt):
        self.rt = rt
        self.cp = rt.cp
        self.errors = ErrorBlocks(rt.cp)
        self.states = StreamStates(rt.cp)
        self.states.refill()

    def prepare(self, plan, fusion, shapes: dict, dtypes: dict, strides: dict):
        """The runtime's prepared entry of `plan` at inputs of these shapes, dtypes and (element)
        strides (compiled and loaded once; see CupyRuntime.prepare)."""
        return self.rt.prepare(fusion, shapes, dtypes, strides, plan)

    def launch(self, prep, env: dict, st: StreamState, err_ptr: int) -> None:
        launch(self.rt, prep, env, st, err_ptr)

    def launcher(self, prep):
        """`launch(env, st, err_ptr, capturing) -> graph or None` for one prepared entry, decided
        once: a plan of kernels and views binds every parameter block first and, when those bytes
        repeat (the caller's allocator handed out the same memory again, as torch's caching
        allocator does for a call repeated on one stream), replays a CUDA graph of its launches
        captured once (one `cuGraphLaunch` instead of one launch per kernel), and returns it. Not
        while the caller captures a graph itself (its capture records the launches), and never
        for other plans. A graph returned may be replayed (`replay`) by a later call whose every
        pointer is this call's again: the same parameter bytes, without binding."""
        rt = self.rt
        steps = prep.steps
        token = prep.ctx_token
        if not (steps and all(s.launches_only for s in steps) and any(s.fires for s in steps)):
            def launch_steps(env, st, err_ptr, capturing=False):
                launch(rt, prep, env, st, err_ptr)
                return None

            return launch_steps
        binds = tuple(s.run.bind for s in steps)
        fires = tuple(s.run.fire for s in steps)

        def launch_graphed(env, st, err_ptr, capturing=False):
            ctx = st.ctxs.get(token)
            if ctx is None:
                ctx = st.ctxs[token] = RunCtx(rt, st)
            st.err_ptr = err_ptr
            recs = [bind(env, ctx) for bind in binds]
            if capturing or not rt.use_graphs:
                for rec, fire in zip(recs, fires):
                    fire(rec, err_ptr, ctx.sp)
                return None
            key = b"".join([bytes(r[0]) for r in recs]) + err_ptr.to_bytes(8, "little")
            g = ctx.graphs.get(key)
            if g is None:
                # (the parameter sets of the last few calls: a caller that holds each result until
                # the next call returns gets two sets of memory in turn)
                seen = ctx.last_key or ()
                if key in seen:
                    if len(ctx.graphs) >= GRAPHS_PER_STATE:  # the oldest goes (a replay of it in
                        del ctx.graphs[next(iter(ctx.graphs))]  # flight completes: CUDA frees it after)
                    g = _capture(rt, st, ctx, key, recs, fires, err_ptr)
                else:
                    ctx.last_key = (key,) + seen[:GRAPHS_PER_STATE - 1]
            if g is not None:
                g.launch(st.stream)
                return g
            for rec, fire in zip(recs, fires):
                fire(rec, err_ptr, ctx.sp)
            return None

        return launch_graphed

    @staticmethod
    def replay(graph, st: StreamState) -> None:
        """Launch a graph `launch` returned on the state's stream (see `launcher`)."""
        graph.launch(st.stream)

    @staticmethod
    def host_steps(prep) -> list:
        return host_steps(prep)

    @staticmethod
    def launches_only(prep) -> bool:
        """Whether every step only launches kernels or makes views: such steps allocate what they
        need themselves, so a call needs no stream context around them."""
        return all(s.launches_only for s in prep.steps)

    @staticmethod
    def array_dtype(dt):
        """The CuPy dtype a segfuse dtype travels as (bfloat16 as uint16 bits)."""
        return cp_dtype(dt)


_EXTERNAL: list = []
_EXTERNAL_LOCK = threading.Lock()


def external_streams(rt) -> ExternalStreams:
    """The process's ExternalStreams (on the process's runtime `rt`)."""
    if not _EXTERNAL:
        with _EXTERNAL_LOCK:
            if not _EXTERNAL:
                _EXTERNAL.append(ExternalStreams(rt))
    return _EXTERNAL[0]
