"""Arrays of the CUDA backend: dtypes as they live on the GPU, input signatures, and the
per-thread reusable output buffers of small results."""

from __future__ import annotations

import math
import sys

import numpy as np

from ..commit import commit
from ..dtypes import DType, from_numpy
from ..errors import BindError, Issue
from .device import cupy_module


def cp_dtype(dt: DType):
    # CuPy has no bfloat16: such tensors live on the GPU as their uint16 bit patterns
    return np.dtype(np.uint16) if dt is DType.bfloat16 else dt.np


def host_view(a: np.ndarray, dt: DType) -> np.ndarray:
    return a.view(dt.np) if dt is DType.bfloat16 else a


def signature(fusion, inputs: dict):
    """Hashable key of a run's inputs (graph, names, shapes, strides, dtypes) when all are CuPy
    arrays; None otherwise (host arrays take the general path)."""
    nd = _ND[0] if _ND else _ndarray_type()
    key = (fusion.id,)
    for k, a in inputs.items():  # (flat: four entries an input; hashes faster than nested tuples)
        if type(a) is not nd:
            return None
        key += (k, a.shape, a.strides, a.dtype)
    return key


_ND = []


def _ndarray_type():
    if not _ND:
        _ND.append(cupy_module().ndarray)
    return _ND[0]


def dtype_of(fusion, name, np_dtype):
    # bfloat16 travels as uint16 bits on the GPU (uint16 is no segfuse dtype: checked first)
    if np.dtype(np_dtype) == np.uint16 and any(n == name and t.dtype is DType.bfloat16 for n, t in fusion.inputs):
        return DType.bfloat16
    try:
        return from_numpy(np_dtype)
    except ValueError:
        return None


def contiguous_strides(shape):
    """Row-major strides, in elements."""
    s, acc = [], 1
    for d in reversed(tuple(shape)):
        s.append(acc)
        acc *= d
    return tuple(reversed(s))


getrefcount = sys.getrefcount
# References to a cached buffer nobody else holds: the cache's dict, the local name, the argument.
_FREE_REFS = 3
_REUSE_BYTES = 1 << 20


def is_small(shape, dt) -> bool:
    """Whether an output buffer of this shape and dtype is kept per thread for reuse (up to 1 MiB;
    larger ones go back to the pool, where the allocation cost is noise next to their kernels')."""
    return math.prod(shape) * np.dtype(dt).itemsize <= _REUSE_BYTES


def output_buffer(ctx, key, shape, dt, small: bool, empty):
    """An output buffer for a step of a run on this thread. A small one is this thread's buffer
    `key` from an earlier run once nobody else holds it (the caller dropped that result; runs on
    one thread are serialized): a per-signature free list, ~2 us less than the memory pool."""
    if not small:
        with ctx.stream:  # the pool hands out memory ordered on this stream
            return empty(shape, dt)
    buffers = ctx.state.buffers
    a = buffers.get(key)
    if a is None or getrefcount(a) > _FREE_REFS:
        with ctx.stream:
            a = buffers[key] = empty(shape, dt)
    return a


_ZERO8 = bytearray(8)


def shape_proxies(fusion, inputs: dict) -> dict:
    """Zero-byte NumPy stand-ins with each input's shape and dtype (for binding on the host)."""
    out = {}
    for k, v in inputs.items():
        if hasattr(v, "__cuda_array_interface__"):
            dt = dtype_of(fusion, k, v.dtype)
            npdt = dt.np if dt is not None else np.dtype(v.dtype)
            out[k] = np.ndarray(tuple(v.shape), npdt, buffer=_ZERO8, strides=(0,) * v.ndim)
        else:
            out[k] = np.asarray(v)
    return out


def plain_outputs(commits) -> tuple | None:
    """The output names when no output needs a copy or a write (the results are the run's arrays
    themselves), else None."""
    if all(not c.copy and c.alias_of is None for c in commits):
        return tuple(c.name for c in commits)
    return None


def committer(commits, device_array):
    """`commit_outputs` for these commits, decided once per prepared call: when no output needs a
    copy or a write, the results are the run's arrays themselves (the same result as the rule,
    without it: 0.5 us a call instead of 1.5 on a CPU, for the prologue's four outputs)."""
    names = plain_outputs(commits)
    if names is not None:
        return lambda env, inputs, st: {n: env[n] for n in names}
    return lambda env, inputs, st: commit_outputs(commits, env, inputs, st, device_array)


def commit_outputs(commits, env, inputs: dict, st, device_array) -> dict:
    """A run's results by the one commit rule (compiler/commit.py), with the plan's `Commit`s:
    copies and writes are ordered on the thread state `st`'s stream. An input updated in place
    that the caller passed as a host array is written through a copy to the host (bfloat16
    travels as uint16 bits). `device_array`: CuPy's ndarray type."""
    def copy(v):
        with st.stream:
            return v.copy()

    def write(c, v):
        dst = inputs[c.alias_of]
        if isinstance(dst, device_array):
            with st.stream:
                dst[...] = v
            return dst
        with st.stream:
            h = v.get()
        np.copyto(dst, h.view(dst.dtype) if h.dtype != dst.dtype else h)
        return v  # the device result (the host array was written)

    return commit(commits, env, copy, write)


def to_device(cp, fusion, inputs: dict):
    """CuPy arrays for the inputs (NumPy ones are uploaded), with their shapes/dtypes/strides."""
    shapes, dtypes, strides, arrays, issues = {}, {}, {}, {}, []
    for name, a in inputs.items():
        if isinstance(a, cp.ndarray):
            g = a
            dt = dtype_of(fusion, name, a.dtype)
        else:
            h = np.asarray(a)
            try:
                dt = from_numpy(h.dtype)
            except ValueError as e:
                issues.append(Issue(("inputs", name), str(e)))
                continue
            g = cp.asarray(h.view(np.uint16) if dt is DType.bfloat16 else h)
        if dt is None:
            issues.append(Issue(("inputs", name), f"unsupported dtype {a.dtype}"))
            continue
        shapes[name], dtypes[name] = tuple(g.shape), dt
        strides[name] = tuple(s // max(g.itemsize, 1) for s in g.strides)
        arrays[name] = g
    if issues:
        raise BindError(issues)
    return shapes, dtypes, strides, arrays
