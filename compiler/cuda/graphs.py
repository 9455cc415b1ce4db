"""CUDA graphs for the kernels-only fast path: repeated launches with the same parameter blocks are
captured once and replayed with one `cuGraphLaunch`."""

from __future__ import annotations

import operator

from .arrays import committer, getrefcount, plain_outputs
from .thread_state import ERR_WORDS

GRAPHS_PER_CALL = 4  # graphs kept per prepared signature and thread (distinct parameter sets)
# the replay memo (see `graphed_call`): the most a memo keeps allocated besides the caller's
# arrays, and how many calls after a miss store none (a caller that keeps every result, or
# passes new buffers each time, would otherwise pay for storing one that never hits)
MEMO_BYTES = 4 << 20
MEMO_WAIT = 32
_ptr = operator.attrgetter("data.ptr")


def capture_launches(rt, st, recs, fires, err_ptr: int):
    """The launches of bound parameter blocks `recs` (each fired by its `fires` entry) as a CUDA
    graph, or None, and no graphs on this runtime from now on, where a capture fails. Captured on a
    non-blocking stream of the state's own (`st.capture_stream`, made here): capturing a blocking
    stream makes other threads' work on the legacy stream fail (cudaErrorStreamCaptureImplicit)
    while it lasts, and capturing a caller's stream would take its other work into the graph."""
    stream = st.capture_stream
    if stream is None:
        stream = st.capture_stream = rt.cp.cuda.Stream(non_blocking=True)
    try:
        stream.begin_capture()
        try:
            for rec, fire in zip(recs, fires):
                fire(rec, err_ptr, stream.ptr)
        finally:
            graph = stream.end_capture()
    except Exception as e:
        rt.use_graphs = False
        rt.graph_fallback_reason = f"{type(e).__name__}: {e}"
        return None
    rt.graph_captures += 1
    return graph


def graphed_call(rt, fusion, prep, defer, tls, new_state, token, new_ctx):
    """The kernels-only fast path with CUDA graphs. A run binds every kernel's parameter block
    first (tensor pointers, outputs allocated); when those bytes equal the last run's, the
    launches are captured once into a graph, and later runs with the same parameters replay
    it: one `cuGraphLaunch` instead of a `cuLaunchKernel` per kernel (on the H200 host 1.6 us
    against 5.8 us for one kernel; benchmarks/README.md). Parameters seen for the first time
    launch directly, so runs on ever new buffers never pay for a capture. Errors: a checked
    plan's graph writes the thread's synchronous error block like a direct run; a deferred
    plan's graph has an error block of its own (`ThreadState.graph_owner`).

    The replay memo: after a run replayed (or captured) a graph, the run context keeps that graph
    with the run's arrays (outputs, the plan's buffers, the scratch) and the inputs' pointers. The
    next call replays it without binding anything when its inputs are at the same pointers and
    nobody but the memo holds those arrays (the caller dropped the last results: reference counts
    as at the memo's making), which is exactly when binding would find the same buffers and the
    same parameter bytes (the host cost at decode sizes, issue 20). Any miss drops the memo, so
    the buffers are free for binding again. Only plain outputs (no copy or write at commit) and
    runs holding at most `MEMO_BYTES` besides the caller's arrays are memoized."""
    binds = tuple(s.run.bind for s in prep.steps)
    fires = tuple(s.run.fire for s in prep.steps)
    may_fail = prep.may_fail
    commit = committer(prep.outputs, rt.cp.ndarray)
    names = plain_outputs(prep.outputs)
    checked = may_fail and not defer  # waits for the outcome before returning
    block_bytes = ERR_WORDS * 8

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
        # replays run on the thread's blocking stream, ordered as direct runs
        graph = capture_launches(rt, st, recs, fires, err)
        if graph is None:  # this run launches directly
            if blk is not None:
                release(st, blk)
            return None
        g = graphs[key] = (graph, blk)
        return g

    def remember(st, ctx, ins, env, key, g) -> dict:
        """This run's results, and its memo (its env is emptied: nothing else reads it)."""
        theirs = {id(a) for a in ins.values()} | {id(a.base) for a in ins.values() if a.base is not None}
        held = tuple(a for a in env.values() if id(a) not in theirs and id(a.base) not in theirs)
        held += (st.scratch,)  # a scratch replaced since stays alive for the graph's replays
        objs = tuple(env[n] for n in names)
        objs += tuple({id(a.base): a.base for a in objs if a.base is not None}.values())
        env.clear()
        if sum(a.nbytes for a in held if a is not None) > MEMO_BYTES:
            ctx.memo_wait = -1  # the sizes are the signature's: never for this call
        else:
            # the reference counts with only the memo holding the arrays (no local name holds
            # one here): what a later call sees once the caller dropped these results
            m = (list(map(_ptr, ins.values())), key, g, held, objs)
            ctx.memo = m + (tuple(map(getrefcount, objs)),)
        return dict(zip(names, objs))

    def replay_unchecked(st, g):
        """The graph's launch with a direct run's error checks (below) when it does not wait."""
        if defer and (st.pending or st.graph_runs):
            st.settle()
        g[0].launch(st.stream)
        if g[1] is not None:
            st.graph_replayed(g[1])
        if not defer and (st.pending or st.graph_runs):
            st.settle()

    def replay(st, g, results):
        """The graph's launch with a direct run's error checks; `results()` makes what the call
        returns (None: the caller makes them, after)."""
        if not checked:
            replay_unchecked(st, g)
            return results() if results is not None else None
        st.reset()
        g[0].launch(st.stream)
        res = results() if results is not None else None  # (no input writes: while the GPU works)
        st.outcome(fusion)
        return res

    replay_memo = replay_unchecked if not checked else lambda st, g: replay(st, g, None)

    def call(ins: dict) -> dict:
        st = getattr(tls, "st", None) or new_state()
        ctx = st.params.get(token) or new_ctx(st)
        m = ctx.memo
        if m is not None:
            if (ctx.graphs.get(m[1]) is m[2] and list(map(_ptr, ins.values())) == m[0]
                    and tuple(map(getrefcount, m[4])) == m[5]):
                try:
                    replay_memo(st, m[2])
                except BaseException:
                    ctx.memo = None  # (a failure leaves no memo)
                    raise
                return dict(zip(names, m[4]))
            ctx.memo = None
            del m  # its arrays are free for this run's binding
            ctx.memo_wait = MEMO_WAIT
        env = dict(ins)
        recs = [bind(env, ctx) for bind in binds]
        key = b"".join([bytes(r[0]) for r in recs])  # every parameter but the error block's
        g = ctx.graphs.get(key)
        if g is None:
            if key == ctx.last_key:  # the same parameters twice in a row: capture them
                g = capture(st, ctx, key, recs)
            else:
                ctx.last_key = key
        if g is not None:
            if names is not None and ctx.memo_wait == 0:
                return replay(st, g, lambda: remember(st, ctx, ins, env, key, g))
            if ctx.memo_wait > 0:
                ctx.memo_wait -= 1
            return replay(st, g, lambda: commit(env, ins, st))
        if checked:
            st.reset()
            for rec, fire in zip(recs, fires):
                fire(rec, st.sync_err_ptr, ctx.sp)
            res = commit(env, ins, st)  # (no input writes: while the GPU works)
            st.outcome(fusion)  # (raises an earlier deferred run's failure first)
            return res
        # ThreadState.execute's rule: a deferred run checks earlier runs before its launch (it
        # never reports its own failure), a run that cannot fail after it, while the GPU works
        if defer and (st.pending or st.graph_runs):
            st.settle()
        err = st.claim_slot(fusion) if defer else st.sync_err_ptr
        for rec, fire in zip(recs, fires):
            fire(rec, err, ctx.sp)
        if not defer and (st.pending or st.graph_runs):
            st.settle()
        return commit(env, ins, st)

    return call
