"""The per-signature fast path's run paths (`CupyRuntime.prepared_call`): a warm graph's runs skip
binding, planning and the prepared-entry lookup. Kernels-only plans launch their parameter blocks
directly or replay CUDA graphs (compiler/cuda/graphs.py); other plans run step by step in the
thread's stream context."""

from __future__ import annotations

from .arrays import committer
from .graphs import graphed_call
from .thread_state import RunCtx, defers, owned_by


def make_call(rt, fusion, prep, st0, deferred: bool):
    """The call for one prepared signature (see `CupyRuntime.prepared_call`); `st0`: the calling
    thread's state. Its run context in each thread's state (CUDA graphs included) goes with it."""
    token = object()  # this call's run context in each thread's state
    call = _call(rt, fusion, prep, st0, deferred, token)
    owned_by(call, (token,))
    return call


def _call(rt, fusion, prep, st0, deferred: bool, token):
    tls, new_state = rt._tls, rt._thread_state
    commit = committer(prep.outputs, rt.cp.ndarray)
    steps = tuple(s.run for s in prep.steps)
    staged = tuple(prep.staged)
    may_fail = prep.may_fail
    defer = may_fail and deferred and defers(fusion, st0)

    def new_ctx(st):
        ctx = st.params[token] = RunCtx(rt, st)
        return ctx

    launches_only = all(s.launches_only for s in prep.steps)
    kernels = any(s.fires for s in prep.steps)
    if launches_only and kernels and not staged and rt.use_graphs and st0.mapped:
        return graphed_call(rt, fusion, prep, defer, tls, new_state, token, new_ctx)

    def state():
        st = getattr(tls, "st", None) or new_state()
        return st, st.params.get(token) or new_ctx(st)

    if launches_only and not staged:
        # kernels and views only: their steps allocate on the thread's stream themselves, so the
        # call needs no stream context (a few microseconds per call at decode sizes)
        def call(ins: dict) -> dict:
            st, ctx = state()
            env = dict(ins)
            return st.execute(fusion, steps, env, ctx, may_fail, defer, False,
                              lambda: commit(env, ins, st))

        return call

    def call_general(ins: dict) -> dict:
        st, ctx = state()
        stream = st.stream
        with stream:
            env = dict(ins)
            for name in staged:
                env[name] = ins[name].copy()
            res = st.execute(fusion, steps, env, ctx, may_fail, defer, bool(staged),
                             lambda: commit(env, ins, st))
            if staged:
                stream.synchronize()
        return res

    return call_general

