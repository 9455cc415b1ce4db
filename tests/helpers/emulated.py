"""Generated kernels run on the CUDA emulator (tests/cuda_emulator.py) behind the stand-in CuPy
(tests/cupy_standin.py, tests/standin_kernels.py): the runtime's real paths without a GPU."""

from __future__ import annotations

import numpy as np


def emulated_runtime(monkeypatch):
    """(runtime, Array): a CupyRuntime on the stand-in CuPy (tests/standin_kernels.py) whose
    launches run the generated kernels and the library radix sort on the emulator."""
    from cupy_standin import Array
    from segfuse.compiler.cuda import arrays
    from standin_kernels import StandinGPU

    g = StandinGPU(emulate=True)
    g.cp.empty = lambda shape, dtype=np.float64: _aligned(shape, dtype).view(Array)  # (CuPy's alignment)
    g.cp.asarray = lambda a, dtype=None: _aligned_copy(np.asarray(a, dtype=dtype)).view(Array)
    g.record_generate(monkeypatch)
    g.install_radix(monkeypatch)
    monkeypatch.setattr(arrays, "_ND", [Array])
    return g.runtime(), Array


def _aligned(shape, dtype=np.float64, align=256) -> np.ndarray:
    """np.empty whose memory starts at a multiple of `align` bytes, as CuPy's allocations do (so
    the runtime launches the vector variants, which need 32-byte aligned tensors, as on the GPU;
    NumPy's own memory is only 16-byte aligned)."""
    dt, shape = np.dtype(dtype), (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    raw = np.empty(n + align, np.uint8)
    off = -raw.ctypes.data % align
    return raw[off:off + n].view(dt).reshape(shape)


def _aligned_copy(v: np.ndarray) -> np.ndarray:
    a = _aligned(v.shape, v.dtype)
    a[...] = v
    return a


def on_device(ins, Array):
    """`ins` as the stand-in's device arrays, in aligned memory (bfloat16 stays a NumPy array)."""
    out = {k: _aligned_copy(np.asarray(v)) for k, v in ins.items()}
    return {k: a if a.dtype.name == "bfloat16" else a.view(Array) for k, a in out.items()}
