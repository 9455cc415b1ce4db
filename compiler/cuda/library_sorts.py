"""Library sorts of the CUDA backend: segments the codegen leaves to a routine.

- the sort epilogue's segments (plan: compiler/segmenter/sort_epilogue.py, text:
  compiler/codegen/sort_epilogue.py): one launch of the radix sort's fused variant;
- single-op argsort/sort/topk segments whose rows are too long for one block: our multi-block
  radix sort where it takes the row (compiler/cuda/radix_sort.py), else CuPy's sorts.
Each maker returns a step's `run(env, ctx)`, or None when it does not take the segment.
"""

from __future__ import annotations

import numpy as np

from ..codegen.layout import numel
from ..codegen.radix_sort import supported, takes
from ..codegen.sort_epilogue import render
from ..dtypes import DType
from ..ops.registry import LibrarySort
from . import radix_sort
from .arrays import cp_dtype, is_small, output_buffer
from .buffers import store


def sort_epilogue_run(rt, fusion, seg, types, token=None, layout=None, block_token=None):
    """(run(env, ctx), may_fail) for a segment the sort epilogue pass made (its plan's
    `sort_epilogue`), at these concrete types: `run` launches the fused kernel; `may_fail` says
    whether it can write the error word (a checked divisor), so the run must synchronize to learn
    its outcome. None: not such a segment, or the radix sort does not take its keys; the general
    path runs it. `layout`: element strides of the tensors that may not be contiguous; where the
    key is contiguous, `run` has `bind` and `fire` as a kernel step's (the fast paths capture its
    launch in their CUDA graphs; its parameter block is kept in each state under `block_token`),
    else each run copies the key first."""
    m = seg.sort_epilogue
    if m is None:
        return None
    kt = types[m.key]
    n = numel(types[fusion.nodes[m.argsort].inputs[0]].shape)  # the one row's length
    # bfloat16 travels as uint16 bits, which would sort as integers
    if kt.dtype is DType.bfloat16 or not takes((n,), cp_dtype(kt.dtype), 0):
        return None
    epi, params = render(fusion, m, types)
    may_fail = "sf_err" in epi.store + epi.scatter + epi.init + epi.hist
    cp = rt.cp
    if cp is None:  # a preparation that compiles nothing (prepare.SourcesOnly): the decision only
        return None, may_fail
    key_dt = np.dtype(cp_dtype(kt.dtype))
    radix_sort.prepare(key_dt, epi)
    specs = tuple((p, tuple(types[p].shape), cp_dtype(types[p].dtype)) for p in params)
    specs = tuple((p, shape, dt, is_small(shape, dt)) for p, shape, dt in specs)
    key, desc = m.key, m.descending
    # this step's reusable outputs in each thread's state (the prepared entry's: purged with it)
    token = token if token is not None else object()
    empty = cp.empty

    def outputs(env, ctx):
        # into the outputs' plan buffers (compiler/cuda/buffers.py); else per-thread buffers
        outs = [env.get(name) for name, _, _, _ in specs]
        outs = [a if a is not None else output_buffer(ctx, (token, i), shape, dt, small, empty)
                for i, (a, (_, shape, dt, small)) in enumerate(zip(outs, specs))]
        for (name, _, _, _), a in zip(specs, outs):
            env[name] = a
        return outs

    strides = (layout or {}).get(key)
    if strides is not None and not is_row_major(kt.shape, strides):
        def run_copying(env, ctx):
            x = env[key]
            with ctx.stream:  # (CuPy copies a strided key on the current stream)
                x = cp.ascontiguousarray(x.reshape(-1))
            radix_sort.argsort(cp, x, 0, desc, ctx.state, epilogue=epi, outputs=outputs(env, ctx))

        return run_copying, may_fail

    step = radix_sort.FusedStep(cp, key_dt, epi, n, desc, len(specs),
                                block_token if block_token is not None else object())

    def bind(env, ctx):
        x = env[key]
        return step.bind(x.reshape(-1) if x.ndim != 1 else x, outputs(env, ctx), ctx.state)

    fire = step.fire

    def run(env, ctx):
        fire(bind(env, ctx), ctx.state.err_ptr, ctx.sp)

    run.bind, run.fire = bind, fire
    return run, may_fail


def is_row_major(shape, strides) -> bool:
    """Whether element strides `strides` lay out `shape` row-major without gaps (dimensions of
    one element may have any stride)."""
    acc = 1
    for d, s in zip(reversed(tuple(shape)), reversed(tuple(strides))):
        if d != 1 and s != acc:
            return False
        acc *= d
    return True


def library_run(rt, fusion, seg, types):
    """CuPy routines for single-op sort/scan segments the codegen cannot emit (rows too long)."""
    nodes = [fusion.nodes[p] for p in seg.nodes]
    if len(nodes) != 1 or nodes[0].op.library_sort is None:
        return None
    nd = nodes[0]
    if any(types[x].dtype is DType.bfloat16 for x in nd.inputs if isinstance(x, str)):
        return None
    routine = nd.op.library_sort
    fn = LIBRARY[routine]
    cp = rt.cp
    x0 = nd.inputs[0]
    if routine is LibrarySort.indices and isinstance(x0, str) and len(types[x0].shape) >= 1:
        t = types[x0]
        axis = nd.attrs.dim % len(t.shape)
        if takes(t.shape, cp_dtype(t.dtype), axis):
            # the prepared signature fixes shape and dtype: our radix sort for every call, decided
            # once here; per call only the launch (the output is already contiguous int64)
            out_name, desc = nd.outputs[0], bool(nd.attrs.descending)

            def run_radix(env, ctx):
                store(env, out_name, radix_sort.argsort(cp, env[x0], axis, desc, ctx.state))

            return run_radix

    def run(env, ctx):
        args = [env[x] if isinstance(x, str) else x.value for x in nd.inputs]
        if args[0].ndim == 0:  # one element is sorted: itself, index 0 (as the NumPy reference)
            zero = cp.zeros((), dtype=np.int64)
            outs = [zero] if routine is LibrarySort.indices else [args[0].copy(), zero]
        else:
            outs = fn(cp, args, nd.attrs, [types[o] for o in nd.outputs], ctx.state)
        for o, v in zip(nd.outputs, outs):
            store(env, o, cp.ascontiguousarray(v) if v.ndim else v)  # (ascontiguousarray makes 0-d 1-d)

    return run


def argsort(cp, x, axis, descending, state=None):
    """Stable argsort along `axis`, int64 indices. `state`: the runtime thread state, if any."""
    if supported(x, axis):  # one row: our one-launch stable radix sort (int64 indices)
        return radix_sort.argsort(cp, x, axis, descending, state)
    if not descending:
        i = cp.argsort(x, axis=axis)  # CuPy's argsort is a stable (thrust) sort
    elif x.dtype.kind in "iu":  # ~x reverses the order of integers exactly: one stable ascending sort
        i = cp.argsort(~x, axis=axis)
    else:
        rev = cp.flip(x, axis=axis)
        n = x.shape[axis]
        i = cp.flip(n - 1 - cp.argsort(rev, axis=axis), axis=axis)
    return i.astype(np.int64, copy=False)


def _lib_argsort(cp, args, attrs, outs, state=None):
    x = args[0]
    return [argsort(cp, x, attrs.dim % x.ndim, attrs.descending, state)]


def _lib_sort(cp, args, attrs, outs, state=None):
    x = args[0]
    ax = attrs.dim % x.ndim
    i = argsort(cp, x, ax, attrs.descending, state)
    return [cp.take_along_axis(x, i, axis=ax), i]


def _lib_topk(cp, args, attrs, outs, state=None):
    x = args[0]
    ax = attrs.dim % x.ndim
    k = outs[0].shape[ax]
    i = argsort(cp, x, ax, attrs.largest, state)
    i = cp.take(i, cp.arange(k), axis=ax)
    return [cp.take_along_axis(x, i, axis=ax), i]


# keyed by the registry's trait: every LibrarySort member has its routine (tests/test_op_registry.py)
LIBRARY = {LibrarySort.indices: _lib_argsort, LibrarySort.values_and_indices: _lib_sort,
           LibrarySort.first_k: _lib_topk}
