"""A stand-in for the parts of CuPy that the runtime's per-thread state uses (`ThreadState`):
mapped host memory is ordinary host memory (its device pointer is its address), arrays are NumPy
arrays with a `.data.ptr`. Tests pass their own stream class. `Devices` models CUDA devices: their
properties, PCI bus ids and each thread's current device (`cupy_module` makes a `cupy` of them)."""

from __future__ import annotations

import ctypes
import threading
import types

import numpy as np


class Array(np.ndarray):
    @property
    def data(self):
        return types.SimpleNamespace(ptr=self.ctypes.data)

    def get(self, stream=None) -> np.ndarray:
        """CuPy's copy to the host."""
        return np.array(self)


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


class Devices:
    """CUDA devices as CuPy's runtime API reports them (`getDeviceCount`, `getDeviceProperties`,
    `deviceGetPCIBusId`, `Device(i).use()`), and each thread's current device (0 until the thread
    selects one, as in CUDA). `props[i]`: device i's properties (a dict as CuPy's); `bus_ids[i]`:
    what deviceGetPCIBusId answers, None for a call that raises. `selected`: thread name -> the
    device it selected last; `install(cp)` puts all of it in a stand-in CuPy namespace."""

    def __init__(self, props: list[dict], bus_ids: list):
        self.props, self.bus_ids = props, bus_ids
        self._tls = threading.local()
        self.selected: dict[str, int] = {}

    def current(self) -> int:
        return getattr(self._tls, "device", 0)

    def _use(self, i: int) -> None:
        if not 0 <= i < len(self.props):
            raise RuntimeError(f"cudaErrorInvalidDevice: device {i}")
        self._tls.device = i
        self.selected[threading.current_thread().name] = i

    def _bus_id(self, i: int) -> str:
        if self.bus_ids[i] is None:
            raise RuntimeError("cudaErrorNotSupported")
        return self.bus_ids[i]

    def install(self, cp):
        devices = self

        class Device:
            def __init__(self, i=None):
                self.id = devices.current() if i is None else i

            def use(self):
                devices._use(self.id)

            def synchronize(self):
                pass

        rt = cp.cuda.runtime
        rt.getDeviceCount = lambda: len(self.props)
        rt.getDevice = self.current
        rt.getDeviceProperties = lambda i: dict(self.props[i])
        rt.deviceGetPCIBusId = self._bus_id
        cp.cuda.Device = Device
        return cp


def cupy_module(devices: Devices):
    """A stand-in `cupy` module (for sys.modules) with these devices and the per-thread state's parts."""
    fake = fake_cupy(object)
    mod = types.ModuleType("cupy")
    mod.__dict__.update(vars(fake))
    devices.install(mod)
    return mod
