"""Arrays on the wire: host copies of NumPy/CuPy/torch arrays, KServe datatype names, .npy bytes.

No hard dependency on CuPy or torch: device arrays are recognised by protocol
(`__dlpack__`, `__cuda_array_interface__`), never by importing their library.
"""

from __future__ import annotations

import io
import sys

import numpy as np
from segfuse.compiler.dtypes import FROM_KSERVE, KSERVE_NAMES, DType, from_numpy

# DLPack device type codes (dlpack.h): only kDLCPU is readable by NumPy directly.
_DL_CPU = 1


def to_host(array) -> np.ndarray:
    """A C-contiguous NumPy copy-or-view of `array` on the host.

    Accepts NumPy arrays and anything array-like, CPU tensors through DLPack, and GPU
    arrays (CuPy, torch CUDA tensors, ...) through DLPack's cross-device copy or
    `__cuda_array_interface__`.
    """
    if isinstance(array, np.ndarray):
        return _c_order(array)
    if "bfloat16" in str(getattr(array, "dtype", "")):
        bits = _bfloat16_bits(array)
        if bits is not None:
            return to_host(bits).view(DType.bfloat16.np)
    if hasattr(array, "__dlpack_device__"):
        host = _from_dlpack(array)
        if host is not None:
            return _c_order(host)
    if hasattr(array, "__cuda_array_interface__"):
        return _from_cuda_array_interface(array)
    if hasattr(array, "__dlpack_device__"):
        raise TypeError(f"cannot copy a {type(array).__name__} on DLPack device "
                        f"{array.__dlpack_device__()} to the host; pass a NumPy array")
    return _c_order(np.asarray(array))


def _bfloat16_bits(array):
    """An int16 view of a bfloat16 tensor of a library that has one, else None.

    NumPy has no bfloat16, so DLPack and `__array__` either refuse bfloat16 or hand over
    nameless 2-byte voids; the bits travel as int16 and become ml_dtypes' bfloat16 on the host.
    """
    torch = sys.modules.get("torch")  # only if the caller already uses torch: no import here
    if torch is not None and isinstance(array, torch.Tensor):
        return array.detach().view(torch.int16)
    return None


def _c_order(a: np.ndarray) -> np.ndarray:
    # Not np.ascontiguousarray: it turns a 0-d array into shape (1,).
    return np.asarray(a, order="C")


def _from_dlpack(array) -> np.ndarray | None:
    device_type, _ = array.__dlpack_device__()
    # torch refuses to export tensors that require grad; the detached view shares memory.
    if getattr(array, "requires_grad", False) and hasattr(array, "detach"):
        array = array.detach()
    if int(device_type) == _DL_CPU:
        return np.from_dlpack(array)
    try:
        # DLPack 1.0 / array API 2023.12: the producer copies to the host for us.
        return np.from_dlpack(array, device="cpu", copy=True)
    except (TypeError, ValueError, BufferError, NotImplementedError, RuntimeError):
        return None  # an older producer: try __cuda_array_interface__ next


def _from_cuda_array_interface(array) -> np.ndarray:
    cai = array.__cuda_array_interface__
    dtype = np.dtype(cai["typestr"])
    shape = tuple(cai["shape"])
    ptr = cai["data"][0]
    out = np.empty(shape, dtype=dtype)
    if out.nbytes == 0:
        return out
    strides = cai.get("strides")
    if strides is not None and tuple(strides) != out.strides:
        # A strided view: let the owning library make it contiguous on the device first.
        for attr in ("contiguous", "copy"):
            if hasattr(array, attr):
                return _from_cuda_array_interface(getattr(array, attr)())
        raise TypeError("a non-contiguous __cuda_array_interface__ array; make it contiguous first")
    stream = cai.get("stream")
    _cuda_memcpy_to_host(out, ptr, stream)
    return out


def _cuda_memcpy_to_host(out: np.ndarray, ptr: int, stream) -> None:
    """cudaMemcpy through whichever CUDA Python binding is installed (CuPy or cuda-bindings)."""
    try:
        import cupy

        if stream not in (None, 0, 1, 2):
            cupy.cuda.ExternalStream(stream).synchronize()
        cupy.cuda.runtime.memcpy(out.ctypes.data, ptr, out.nbytes, cupy.cuda.runtime.memcpyDeviceToHost)
        return
    except ImportError:
        pass
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        raise TypeError("copying a __cuda_array_interface__ array to the host needs CuPy or cuda-bindings; "
                        "pass a NumPy array instead") from None
    (err,) = cudart.cudaDeviceSynchronize()
    err, = cudart.cudaMemcpy(out.ctypes.data, ptr, out.nbytes, cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost)
    if int(err) != 0:
        raise TypeError(f"cudaMemcpy to the host failed: {err}")


# ---- datatypes ------------------------------------------------------------------------------
def kserve_datatype(dtype) -> str:
    """'INT64' for int64 and so on; ValueError for a dtype segfuse does not support."""
    return KSERVE_NAMES[from_numpy(dtype)]


def numpy_dtype(datatype: str) -> np.dtype:
    """The NumPy dtype of a KServe datatype name ('FP32') or a segfuse dtype name ('float32')."""
    if datatype in FROM_KSERVE:
        return FROM_KSERVE[datatype].np
    try:
        return DType(datatype).np
    except ValueError:
        raise ValueError(f"unknown datatype '{datatype}'") from None


def as_numpy_dtype(dtype) -> np.dtype:
    """A NumPy dtype, a KServe name ('INT64') or a segfuse name ('bfloat16') as a NumPy dtype."""
    return numpy_dtype(dtype) if isinstance(dtype, str) else np.dtype(dtype)


# ---- bytes --------------------------------------------------------------------------------
def from_raw(raw: bytes, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """A writable array from little-endian row-major bytes (the wire format; every host segfuse
    runs on is little-endian, so NumPy's native order is the wire order)."""
    return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()


def load_npy(data: bytes) -> np.ndarray:
    return np.load(io.BytesIO(data), allow_pickle=False)
