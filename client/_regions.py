"""Shared-memory regions on the client side: the register/status/unregister calls (I/O-free, as in
`_builder`), a POSIX shared-memory helper for NumPy arrays (`SystemRegion`), and the CUDA IPC
handle of a CuPy array or torch tensor (CuPy is imported only for that)."""

from __future__ import annotations

import base64
import ctypes
import math
from multiprocessing import shared_memory

import numpy as np

from ._arrays import as_numpy_dtype
from ._builder import Call, _json, _RequestBuilder, _seg
from ._errors import ClientError
from ._types import Region

SYSTEM_PREFIX, CUDA_PREFIX = "/v2/systemsharedmemory", "/v2/cudasharedmemory"
PREFIX = {"system": SYSTEM_PREFIX, "cuda": CUDA_PREFIX}


class RegionCalls:
    """The region methods of `Client` and `AsyncClient` as generators (see `_builder`)."""

    def __init__(self, builder: _RequestBuilder):
        self.build = builder

    def register_system(self, name: str, key, byte_size: int | None, offset: int = 0) -> Call:
        if isinstance(key, SystemRegion):
            key, byte_size = key.key, key.nbytes - offset if byte_size is None else byte_size
        if byte_size is None:
            raise ClientError(f"region '{name}': give byte_size, the bytes of the region")
        _json((yield self.build.request("POST", f"{SYSTEM_PREFIX}/region/{_seg(name)}/register",
                                        json={"key": key, "offset": int(offset), "byte_size": int(byte_size)})))
        return Region(name, 0, int(byte_size))

    def register_cuda(self, name: str, tensor_or_handle, device_id: int | None, byte_size: int | None) -> Call:
        handle, device, region, registered = cuda_region(name, tensor_or_handle, device_id, byte_size)
        _json((yield self.build.request("POST", f"{CUDA_PREFIX}/region/{_seg(name)}/register",
                                        json={"raw_handle": {"b64": handle}, "device_id": device,
                                              "byte_size": registered})))
        return region

    def status(self, kind: str, name: str | None = None) -> Call:
        path = f"{PREFIX[kind]}/region/{_seg(name)}/status" if name else f"{PREFIX[kind]}/status"
        return _json((yield self.build.get(path)))

    def unregister(self, kind: str, name: str | None = None) -> Call:
        path = f"{PREFIX[kind]}/region/{_seg(name)}/unregister" if name else f"{PREFIX[kind]}/unregister"
        return _json((yield self.build.request("POST", path))).get("unregistered", [])

    def regions(self) -> Call:
        """Every region, system then CUDA, each with its "kind"."""
        out = []
        for kind in PREFIX:
            out += [{"kind": kind, **r} for r in (yield from self.status(kind))]
        return out


class SystemRegion:
    """A POSIX shared-memory object made by this process, to hand NumPy arrays to the server.

        with SystemRegion.create("/ids_shm", ids.nbytes) as shm:
            shm.array(ids.dtype, ids.shape)[...] = ids
            region = client.register_system_shared_memory("ids", shm.key, shm.nbytes)
            client.run(graph, inputs={"topk_ids": region.tensor(ids.dtype, ids.shape)})
            client.unregister_system_shared_memory("ids")

    Leaving the `with` block closes and unlinks the object (drop the arrays of `array()` first).
    """

    def __init__(self, shm: shared_memory.SharedMemory):
        self.shm = shm

    @classmethod
    def create(cls, key: str, nbytes: int) -> SystemRegion:
        return cls(shared_memory.SharedMemory(name=key.lstrip("/"), create=True, size=int(nbytes)))

    @property
    def key(self) -> str:
        return "/" + self.shm.name.lstrip("/")

    @property
    def nbytes(self) -> int:
        return self.shm.size

    def array(self, dtype, shape, offset: int = 0) -> np.ndarray:
        """A NumPy view of the object's bytes from `offset`."""
        return np.ndarray(tuple(shape), as_numpy_dtype(dtype), buffer=self.shm.buf, offset=int(offset))

    def close(self) -> None:
        self.shm.close()

    def unlink(self) -> None:
        self.shm.unlink()

    def __enter__(self) -> SystemRegion:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
        self.unlink()


# ---- CUDA IPC -----------------------------------------------------------------------------------
def cuda_region(name: str, obj, device_id: int | None, byte_size: int | None) -> tuple[str, int, Region, int]:
    """(base64 handle, device, the Region addressing the tensor, bytes to register).

    `obj` is a raw cudaIpcMemHandle_t (64 bytes, or its base64) or a C-contiguous CUDA array with
    `__cuda_array_interface__` (CuPy, torch). An array's handle names its whole allocation (a memory
    pool hands out pieces of larger ones), so the region is registered from the allocation's start to
    the end of the array, and the returned Region's offset is where the array starts in it.
    """
    if isinstance(obj, (bytes, bytearray, str)):
        raw = base64.b64decode(obj) if isinstance(obj, str) else bytes(obj)
        if len(raw) != 64:
            raise ClientError(f"region '{name}': a cudaIpcMemHandle_t has 64 bytes, not {len(raw)}")
        if byte_size is None:
            raise ClientError(f"region '{name}': give byte_size with a raw handle")
        return base64.b64encode(raw).decode(), 0 if device_id is None else int(device_id), \
            Region(name, 0, int(byte_size)), int(byte_size)
    ptr, dtype, shape = _device_array(name, obj)
    try:
        import cupy
    except ImportError:
        raise ClientError("registering a CUDA array as a region needs CuPy (pip install cupy-cuda12x)") from None
    rt = cupy.cuda.runtime
    device = int(rt.pointerGetAttributes(ptr).device)
    if device_id is not None and int(device_id) != device:
        raise ClientError(f"region '{name}': the array is on GPU {device}, not on GPU {device_id}")
    with cupy.cuda.Device(device):
        base = _allocation_base(ptr)
        try:
            handle = rt.ipcGetMemHandle(base)
        except Exception as e:  # managed memory, torch's expandable segments, ...: not exportable
            raise ClientError(f"region '{name}': cannot export this allocation over CUDA IPC: {e}") from None
    nbytes = math.prod(shape) * dtype.itemsize
    offset = ptr - base
    region = Region(name, offset, nbytes, dtype=dtype, shape=shape)
    return base64.b64encode(bytes(handle)).decode(), device, region, \
        offset + nbytes if byte_size is None else int(byte_size)


def _device_array(name: str, obj) -> tuple[int, np.dtype, tuple]:
    """(device pointer, dtype, shape) of a C-contiguous CUDA array: a torch CUDA tensor (any dtype,
    bfloat16 included, which __cuda_array_interface__ cannot describe) or anything with
    __cuda_array_interface__ (CuPy, Numba, ...)."""
    if getattr(obj, "is_cuda", False) and hasattr(obj, "data_ptr"):  # torch
        if not obj.is_contiguous():
            raise ClientError(f"region '{name}': the tensor is not contiguous; call .contiguous() first")
        try:
            dtype = as_numpy_dtype(str(obj.dtype).removeprefix("torch."))
        except ValueError as e:
            raise ClientError(f"region '{name}': {e}") from None
        return int(obj.data_ptr()), dtype, tuple(int(d) for d in obj.shape)
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is None:
        raise ClientError(f"region '{name}': {type(obj).__name__} is not a CUDA array (no "
                           "__cuda_array_interface__); pass a CuPy array, a torch CUDA tensor or a raw handle")
    dtype, shape = np.dtype(cai["typestr"]), tuple(int(d) for d in cai["shape"])
    if cai.get("strides") is not None and tuple(cai["strides"]) != _c_strides(shape, dtype.itemsize):
        raise ClientError(f"region '{name}': the array is not C-contiguous; make it contiguous first")
    return int(cai["data"][0]), dtype, shape


def _c_strides(shape: tuple, itemsize: int) -> tuple:
    strides, step = [], itemsize
    for d in reversed(shape):
        strides.append(step)
        step *= max(d, 1)
    return tuple(reversed(strides))


def _allocation_base(ptr: int) -> int:
    """Start of the cudaMalloc allocation holding `ptr` (the driver's cuMemGetAddressRange)."""
    lib = ctypes.CDLL("libcuda.so.1")
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    rc = lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr))
    if rc != 0:
        raise ClientError(f"cuMemGetAddressRange failed for pointer {ptr:#x} (CUresult {rc})")
    return int(base.value)
