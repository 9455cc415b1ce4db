"""Kernel steps: a generated module's launches through the driver with a parameter block per
thread (the fast path's CUDA graphs key on those blocks' bytes, compiler/cuda/graphs.py)."""

from __future__ import annotations

import ctypes

from .arrays import cp_dtype, is_small, output_buffer


def kernel_step(rt, mod, kernels, types, alias_buf, token=None):
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
    # this step's parameter block in each thread's state (the prepared entry's: purged with it)
    token = token if token is not None else object()
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
            # an in-place result is its self's array; else its plan buffer's view (put in the
            # env by compiler/cuda/buffers.py), or (a tensor the plan gives no buffer) allocated
            a = env[src] if src is not None else env.get(p)
            if a is None:
                a = env[p] = output_buffer(ctx, key, shape, dt, is_small_, empty)
            elif src is not None:
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
