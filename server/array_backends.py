"""The server's array backends: where stored buffers live (host NumPy arrays, or CuPy arrays on
the GPU) and how arrays move between the host and there; and `resolve`, which picks the Engine and
the array backend for `--backend` ("auto" is resolved by the compiler's backend registry).

CuPy is imported only here and only when asked for (or probed by "auto"), never at module level,
so the server imports and runs on machines without a GPU.
"""

from __future__ import annotations

import logging
import os

import numpy as np

from .gpu_info import describe as describe_gpu

log = logging.getLogger("segfuse.server")

QUEUED_COPY_BYTES = 1 << 20  # results up to this size are copied to the host inside the batch
PINNED_GET_BYTES = 1 << 20  # larger device arrays come to the host through pinned memory


class BackendUnavailable(RuntimeError):
    pass


class ArrayBackend:
    """Host <-> buffer-device transfers for one backend. NumPy: buffers are host arrays."""

    name = "numpy"

    def __init__(self, device: int = 0):
        self.device_index = device

    @property
    def device(self) -> str:
        return "cpu"

    def activate(self) -> None:
        """Called in each worker thread before it touches arrays (selects the GPU for CuPy)."""

    def gpu_info(self) -> dict | None:
        """The GPU buffers live on (server/gpu_info.py), or None: the NumPy backend has none."""
        return None

    def from_host(self, a: np.ndarray):
        # A private, writeable, contiguous copy: stored buffers never share memory with request bodies.
        return np.array(a, copy=True, order="C")

    def to_host(self, a) -> np.ndarray:
        # A copy: the caller serialises it after the buffer's pin is released.
        return np.array(a, copy=True, order="C")

    def host_buffer(self, nbytes: int) -> np.ndarray:
        """Host memory (uint8) to receive a request body into before it goes where buffers live."""
        return np.empty(nbytes, np.uint8)

    def to_host_queued(self, a) -> np.ndarray | None:
        """A host copy of `a` queued on the calling thread's run stream, complete once the batch
        being launched has waited for the device (Engine.run_batch's on_launched); None when
        this backend copies after the wait instead (`to_host`)."""
        return None

    def copy(self, a):
        return a.copy()

    def may_share(self, a, b) -> bool:
        return np.may_share_memory(a, b)

    def owns(self, a) -> bool:
        """Whether `a` can be stored as is: a writeable array of this backend's kind."""
        return isinstance(a, np.ndarray) and a.flags.writeable

    def contiguous(self, a):
        return np.require(a, requirements="C")  # keeps 0-d (np.ascontiguousarray makes it 1-d)

    def synchronize(self) -> None:
        pass


class CupyArrayBackend(ArrayBackend):
    name = "cupy"
    # the calling thread's run stream (the engine's backend `stream_ptr`), set by `resolve`:
    # a result copy queued there is ordered after the run that made it
    run_stream_ptr = None

    def __init__(self, device: int = 0):
        super().__init__(device)
        import cupy  # noqa: F401  (deferred: only with a GPU)

        self.cp = cupy
        n = cupy.cuda.runtime.getDeviceCount()
        if not 0 <= device < n:
            raise BackendUnavailable(f"GPU {device} is not visible ({n} visible)")

    @property
    def device(self) -> str:
        return f"cuda:{self.device_index}"

    def activate(self) -> None:
        self.cp.cuda.Device(self.device_index).use()

    def gpu_info(self) -> dict | None:
        return describe_gpu(self.cp, self.device_index)

    def from_host(self, a: np.ndarray):
        self.activate()
        out = self.cp.array(a, copy=True, order="C")
        # The engine runs on its own non-blocking stream, which does not wait for this copy.
        self.cp.cuda.get_current_stream().synchronize()
        return out

    def host_buffer(self, nbytes: int) -> np.ndarray:
        # Pinned memory from CuPy's pool: once warm it is mapped already (no page faults while the
        # body arrives) and the copy to the device is a DMA.
        return np.frombuffer(self.cp.cuda.alloc_pinned_memory(max(nbytes, 1)), np.uint8, nbytes)

    def to_host(self, a) -> np.ndarray:
        if isinstance(a, np.ndarray):
            return np.require(a, requirements="C")  # keeps 0-d (np.ascontiguousarray makes it 1-d)
        if a.flags.c_contiguous and a.nbytes >= PINNED_GET_BYTES:
            # into pinned memory from CuPy's pool: a DMA, and no fresh pages to fault in
            out = np.frombuffer(self.cp.cuda.alloc_pinned_memory(a.nbytes), a.dtype, a.size).reshape(a.shape)
            return a.get(out=out)
        return self.cp.asnumpy(a)

    def to_host_queued(self, a) -> np.ndarray | None:
        # Small contiguous results: an asynchronous copy into pinned memory (CuPy's pool), covered
        # by the batch's one wait, instead of a synchronous copy to pageable memory per output.
        cp = self.cp
        if isinstance(a, np.ndarray) or not a.flags.c_contiguous or not 0 < a.nbytes <= QUEUED_COPY_BYTES \
                or self.run_stream_ptr is None:
            return None
        mem = cp.cuda.alloc_pinned_memory(a.nbytes)
        out = np.frombuffer(mem, a.dtype, a.size).reshape(a.shape)
        cp.cuda.runtime.memcpyAsync(out.ctypes.data, a.data.ptr, a.nbytes, cp.cuda.runtime.memcpyDeviceToHost,
                                    self.run_stream_ptr())
        return out

    def may_share(self, a, b) -> bool:
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            return isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and np.may_share_memory(a, b)
        return bool(self.cp.may_share_memory(a, b))

    def owns(self, a) -> bool:
        return isinstance(a, self.cp.ndarray)

    def copy(self, a):
        return self.cp.array(a, copy=True)  # also moves a host array to the device

    def contiguous(self, a):
        return self.cp.ascontiguousarray(a).reshape(a.shape)  # keeps 0-d

    def synchronize(self) -> None:
        self.cp.cuda.Device(self.device_index).synchronize()


def cupy_visible() -> bool:
    return cupy_missing() is None


def cupy_missing() -> str | None:
    """Why the CuPy backend cannot start here (no CuPy, no driver, no device), or None."""
    from segfuse.compiler.engine import backend_unavailable

    return backend_unavailable("cupy")


def make_engine(backend: str):
    from segfuse.compiler import Engine

    return Engine(backend)


def resolve(backend: str, device: int, cache_dir: str | None):
    """(engine, array backend) for 'auto' | 'cupy' | 'numpy'. Raises BackendUnavailable."""
    if cache_dir:
        # Read when the first kernel compiles: segfuse's cubins in kernels/, CuPy's own cache (its
        # library kernels) in cupy/ (the layout docker/Dockerfile sets up too).
        for sub, var in (("kernels", "SEGFUSE_KERNEL_CACHE"), ("cupy", "CUPY_CACHE_DIR")):
            os.makedirs(os.path.join(cache_dir, sub), exist_ok=True)
            os.environ[var] = os.path.join(cache_dir, sub)
    if backend == "auto":
        if cupy_visible():
            try:
                return resolve("cupy", device, cache_dir)
            except BackendUnavailable as e:
                log.warning("auto backend: %s; using numpy", e)
        return resolve("numpy", device, cache_dir)
    if backend == "cupy":
        if not cupy_visible():
            raise BackendUnavailable("backend 'cupy' needs CuPy and a visible GPU")
        arrays = CupyArrayBackend(device)
        arrays.activate()  # the engine reads the current device's properties
        try:
            engine = make_engine("cupy")
        except ValueError as e:  # the Engine has no CuPy backend yet
            raise BackendUnavailable(str(e)) from None
        engine.start()  # now, not in the first request: it starts NVRTC's one-time warm-up
        arrays.run_stream_ptr = engine.device_backend.stream_ptr
        return engine, arrays
    if backend == "numpy":
        return make_engine("numpy"), ArrayBackend(device)
    raise BackendUnavailable(f"unknown backend '{backend}' (auto, cupy or numpy)")
