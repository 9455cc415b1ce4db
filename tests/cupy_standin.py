"""A stand-in for the parts of CuPy that the runtime's per-thread state uses (`ThreadState`):
mapped host memory is ordinary host memory (its device pointer is its address), arrays are NumPy
arrays with a `.data.ptr`. Tests pass their own stream class."""

from __future__ import annotations

import ctypes
import types

import numpy as np


class Array(np.ndarray):
    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.ctypes.data)


class Graph:
    """A captured "CUDA graph": replaying it runs the work recorded while capturing."""

    def __init__(self, work):
        self.work, self.launches = work, 0

    def launch(self, stream=None):
        self.launches += 1
        for w in self.work:
            w()


def fake_cupy(stream_cls):
    keep = []

    def host_alloc(nbytes, flags):
        buf = ctypes.create_string_buffer(nbytes)
        keep.append(buf)
        return ctypes.addressof(buf)

    runtime = types.SimpleNamespace(hostAlloc=host_alloc, hostGetDevicePointer=lambda p, flags: p,
                                    hostAllocMapped=2, hostAllocPortable=1)
    return types.SimpleNamespace(cuda=types.SimpleNamespace(Stream=stream_cls, runtime=runtime),
                                 zeros=lambda n, dtype: np.zeros(n, dtype).view(Array), ndarray=Array, _keep=keep)
