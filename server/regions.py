"""`RegionStore`: Triton's system and CUDA shared-memory regions, registered by name in one namespace.

A *system* region is the slice [offset, offset + byte_size) of a POSIX shared-memory object that a
client created (`key`: a plain name in the shared-memory namespace, never a path). The server holds
a descriptor of the object, never a mapping: runs read and write it with pread/pwrite, which report
an object the client shrank as a short count, where touching a mapping's missing pages would kill
the server with SIGBUS (region_io.py). A *CUDA* region is the first byte_size bytes of a
device allocation of another process, named by its 64-byte `cudaIpcMemHandle_t`; the server opens
the handle on its own device (CuPy, imported only here and only on the cupy backend).

Bounds: `max_regions` regions and `max_region_bytes` bytes per store (a server; under scale-out one
store per namespace; auth has one token, so per token is per server), and process-wide at most half
the process's open-file limit (RLIMIT_NOFILE) in region descriptors, so that regions never take
the descriptors connections need; 413 past any of them. Keys that name the server's own shared
memory (`RESERVED`) are refused.

Runs pin the regions they use (`pin`: a reference count, held from the start of the run's execution
until its outputs are committed). Unregistering a pinned region is refused with 400, as Triton does;
"unregister all" unregisters the idle regions and refuses, naming them, the ones in use. The state
is guarded by one threading lock (runs pin from worker threads, routes register on the event loop);
nothing slow happens while it is held. How runs use regions is in `region_io.py`.
"""

from __future__ import annotations

import base64
import binascii
import ctypes
import logging
import os
import re
import stat
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from .errors import ApiError, bad_request, not_found, too_large

log = logging.getLogger("segfuse.server")

SYSTEM, CUDA = "system", "cuda"
TITLE = {SYSTEM: "system shared memory", CUDA: "CUDA shared memory"}
IPC_HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)
_KEY = re.compile(r"^/?[A-Za-z0-9_.\-]{1,250}$")
DEFAULT_MAX_REGIONS = 1024
SERVER_PREFIX = "segfuse-codec-"  # the codec's segments, where it must name one (server/segments.py)
# The server's own objects: POSIX named semaphores are /dev/shm/sem.NAME (multiprocessing's locks
# among them: writing one would wedge the server), and the codec's segments.
RESERVED = ("sem.", SERVER_PREFIX)


@dataclass
class Region:
    name: str
    kind: str  # SYSTEM or CUDA
    byte_size: int
    key: str | None = None  # system: the shm object, with its leading '/'
    offset: int = 0  # system: where the region starts in the object (CUDA: always 0)
    device_id: int | None = None  # CUDA
    handle: bytes | None = None  # CUDA: the raw cudaIpcMemHandle_t
    mapping: Any = None  # CUDA: the opened base pointer (int)
    fd: int = -1  # system: a descriptor of the object
    inode: tuple = ()  # system: (st_dev, st_ino), the object whatever key names it
    writable: bool = True
    pins: int = 0

    @property
    def memory(self) -> tuple:
        """What two regions must share to overlap: the same object or the same allocation."""
        return (self.kind, self.inode if self.kind == SYSTEM else self.handle)

    def status(self) -> dict:
        if self.kind == SYSTEM:
            return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size,
                    "ref_count": self.pins}
        return {"name": self.name, "device_id": self.device_id, "byte_size": self.byte_size, "ref_count": self.pins}

    def check_size(self, loc: list) -> None:
        """400 if the client shrank the shm object below the region since registering it."""
        if self.kind == SYSTEM:
            size = os.fstat(self.fd).st_size
            if size < self.offset + self.byte_size:
                raise self.shrank(size, loc)

    def shrank(self, size: int, loc: list) -> ApiError:
        return bad_request(f"shared memory object '{self.key}' of region '{self.name}' shrank to {size} bytes "
                           f"since it was registered with offset {self.offset} and byte_size {self.byte_size}; "
                           "a client may not shrink an object while it is registered: register it again", loc)

    def read_into(self, pos: int, dst: memoryview, loc: list) -> None:
        """dst <- the object's bytes from `pos` (system); 400 if the object is shorter."""
        done = 0
        try:
            while done < len(dst):
                n = os.preadv(self.fd, [dst[done:]], pos + done)
                if n == 0:
                    raise self.shrank(os.fstat(self.fd).st_size, loc)
                done += n
        except OSError as e:
            raise bad_request(f"reading shared memory object '{self.key}' of region '{self.name}' failed: "
                              f"{e.strerror}", loc) from None

    def write_from(self, pos: int, src: memoryview, loc: list) -> None:
        """The object's bytes from `pos` <- src (system). pwrite into an object shrunk meanwhile extends
        it again rather than faulting."""
        done = 0
        try:
            while done < len(src):
                done += os.pwrite(self.fd, src[done:], pos + done)
        except OSError as e:  # ENOSPC: the object was shrunk and /dev/shm is full
            raise bad_request(f"writing shared memory object '{self.key}' of region '{self.name}' failed after "
                              f"{done} of {len(src)} bytes: {e.strerror}", loc) from None


class RegionStore:
    def __init__(self, max_bytes: int, on_change: Callable[[RegionStore], None] | None = None,
                 max_regions: int = DEFAULT_MAX_REGIONS):
        self.max_bytes = max_bytes
        self.max_regions = max_regions
        self._regions: dict[str, Region] = {}
        self._lock = threading.Lock()
        self._on_change = on_change

    # ---- reading state ------------------------------------------------------------------
    def get(self, name: str) -> Region | None:
        return self._regions.get(name)

    def all(self, kind: str | None = None) -> list[Region]:
        with self._lock:
            return [r for _, r in sorted(self._regions.items()) if kind is None or r.kind == kind]

    def used_bytes(self, kind: str | None = None) -> int:
        return sum(r.byte_size for r in self.all(kind))

    def find(self, name: str, kind: str | None, loc: list) -> Region:
        """The region `name` (of `kind`, when given), or 404."""
        r = self._regions.get(name)
        if r is None:
            what = TITLE[kind] if kind else "shared memory"
            raise not_found(f"{what} region", name, loc)
        if kind is not None and r.kind != kind:
            msg = f"region '{name}' is registered as {TITLE[r.kind]}, not {TITLE[kind]}"
            raise ApiError(404, msg, [{"loc": list(loc), "msg": msg}])
        return r

    # ---- registering ----------------------------------------------------------------------
    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> Region:
        key = check_key(key)
        self._check_new(name, byte_size)
        DESCRIPTORS.acquire()
        fd = -1
        try:
            fd, writable, st = _open_shm(key)
            if offset + byte_size > st.st_size:
                raise bad_request(f"failed to register shared memory region '{name}': offset {offset} + byte_size "
                                  f"{byte_size} exceeds the {st.st_size} bytes of shared memory object '{key}'",
                                  ["body", "byte_size"])
            region = Region(name, SYSTEM, byte_size, key=key, offset=offset, fd=fd, inode=(st.st_dev, st.st_ino),
                            writable=writable)
            self._add(region)
        except BaseException:
            if fd >= 0:
                os.close(fd)
            DESCRIPTORS.release()
            raise
        return region

    def register_cuda(self, name: str, raw_b64: str, device_id: int, byte_size: int, arrays) -> Region:
        """On a thread with the server's device current (`Runtime.on_device`)."""
        if getattr(arrays, "name", None) != "cupy":
            msg = (f"this server has no GPU (backend {getattr(arrays, 'name', 'none')}): CUDA shared memory "
                   "needs the cupy backend; use system shared memory")
            raise ApiError(501, msg, [{"loc": [], "msg": msg}])
        handle = decode_handle(raw_b64, ["body", "raw_handle", "b64"])
        if device_id != arrays.device_index:
            raise bad_request(f"device_id {device_id} is not this server's GPU ({arrays.device_index}): CUDA "
                              "shared memory works only on the GPU the server runs on", ["body", "device_id"])
        self._check_new(name, byte_size)
        ptr, size = HANDLES.acquire(arrays.cp, handle, device_id)
        try:
            if byte_size > size:
                raise bad_request(f"failed to register CUDA shared memory region '{name}': byte_size {byte_size} "
                                  f"exceeds the {size} bytes of the allocation the handle names",
                                  ["body", "byte_size"])
            region = Region(name, CUDA, byte_size, device_id=device_id, handle=handle, mapping=ptr)
            self._add(region)
        except ApiError:
            HANDLES.release(arrays.cp, handle)
            raise
        return region

    def _check_new(self, name: str, byte_size: int) -> None:
        r = self._regions.get(name)
        if r is not None:
            raise bad_request(f"shared memory region '{name}' is already registered (as {TITLE[r.kind]}); "
                              "unregister it first", ["path", "name"])
        self._check_count(name, len(self._regions))
        used = self.used_bytes()
        if used + byte_size > self.max_bytes:
            raise too_large(f"registering {byte_size} more bytes would exceed the limit of {self.max_bytes} bytes "
                            f"for all shared-memory regions ({used} registered)", ["body", "byte_size"])

    def _check_count(self, name: str, count: int) -> None:
        if count >= self.max_regions:
            raise ApiError(413, f"registering region '{name}' would exceed the limit of {self.max_regions} "
                                f"shared-memory regions (max_regions, --max-regions; {count} registered); "
                                "unregister one first",
                           [{"loc": ["path", "name"], "msg": f"over the limit of {self.max_regions} regions "
                                                             "(max_regions)"}])

    def _add(self, region: Region) -> None:
        with self._lock:  # checked again: another registration may have won the race meanwhile
            if region.name in self._regions:
                raise bad_request(f"shared memory region '{region.name}' is already registered", ["path", "name"])
            self._check_count(region.name, len(self._regions))
            used = sum(r.byte_size for r in self._regions.values())
            if used + region.byte_size > self.max_bytes:
                raise too_large(f"registering {region.byte_size} more bytes would exceed the limit of "
                                f"{self.max_bytes} bytes for all shared-memory regions", ["body", "byte_size"])
            self._regions[region.name] = region
        self._changed()

    # ---- unregistering -----------------------------------------------------------------------
    def unregister(self, name: str, kind: str) -> Region:
        """Remove an idle region (the caller then `close`s it); 400 while a run uses it."""
        with self._lock:
            r = self.find(name, kind, ["path", "name"])
            if r.pins:
                raise bad_request(f"Cannot unregister shared memory region '{name}', it is currently in use "
                                  f"(by {r.pins} run(s)); retry when they have finished", ["path", "name"])
            del self._regions[name]
        self._changed()
        return r

    def unregister_all(self, kind: str) -> tuple[list[Region], list[Region]]:
        """(removed, in use): removes the idle regions of `kind` only."""
        with self._lock:
            regions = [r for _, r in sorted(self._regions.items()) if r.kind == kind]
            idle, busy = [r for r in regions if not r.pins], [r for r in regions if r.pins]
            for r in idle:
                del self._regions[r.name]
        self._changed()
        return idle, busy

    @staticmethod
    def close(region: Region, arrays=None) -> None:
        """Release what registering opened (CUDA: on a thread with the server's device current)."""
        if region.kind == SYSTEM:
            if region.fd >= 0:
                os.close(region.fd)
                region.fd = -1
                DESCRIPTORS.release()
        else:
            HANDLES.release(arrays.cp, region.handle)

    # ---- pins ------------------------------------------------------------------------------
    @contextmanager
    def pin(self, names: Iterable[str], loc_of: Callable[[str], list] = lambda n: []) -> Iterator[dict[str, Region]]:
        """Hold the regions `names` (404 for one not registered) for the body of the block."""
        with self._lock:
            held = {n: self.find(n, None, loc_of(n)) for n in set(names)}
            for r in held.values():
                r.pins += 1
        try:
            yield held
        finally:
            with self._lock:
                for r in held.values():
                    r.pins -= 1

    def _changed(self) -> None:
        if self._on_change:
            self._on_change(self)


def metrics_updater(metrics) -> Callable[[RegionStore], None]:
    """The store's on_change: region gauges of `server/metrics.py` per kind."""
    def update(store: RegionStore) -> None:
        for kind in (SYSTEM, CUDA):
            regions = store.all(kind)
            metrics.region_bytes.labels(kind).set(sum(r.byte_size for r in regions))
            metrics.regions.labels(kind).set(len(regions))
    return update


# ---- system shared memory ----------------------------------------------------------------------
class _Descriptors:
    """Descriptors held by system regions in this process, all stores together (a scale-out shard holds
    one store per namespace): at most half the open-file limit, the rest left to connections, files
    and libraries."""

    def __init__(self):
        self.held = 0
        self._lock = threading.Lock()

    @staticmethod
    def limit() -> int | None:
        try:
            import resource
        except ImportError:
            return None
        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        return None if soft == resource.RLIM_INFINITY else soft // 2

    def acquire(self) -> None:
        limit = self.limit()
        with self._lock:
            if limit is not None and self.held >= limit:
                msg = (f"this server holds {self.held} descriptors for shared-memory regions, half of its limit of "
                       f"{2 * limit} open files (RLIMIT_NOFILE); unregister regions, or raise the limit (ulimit -n) "
                       "and restart")
                raise ApiError(413, msg, [{"loc": ["path", "name"], "msg": "over the descriptors left for regions"}])
            self.held += 1

    def release(self) -> None:
        with self._lock:
            self.held -= 1


DESCRIPTORS = _Descriptors()


def check_key(key: str) -> str:
    """A plain name in the shared-memory namespace ('/name' or 'name'), returned with its '/'."""
    bare = key[1:] if key.startswith("/") else key
    if not _KEY.fullmatch(key) or bare in (".", "..") or ".." in bare:
        raise bad_request(f"shared memory key '{key}' must be a plain name such as /input_data: 1-250 characters "
                          "of A-Z a-z 0-9 _ . - after an optional leading '/', no other '/' and no '..'",
                          ["body", "key"])
    if bare.startswith(RESERVED):
        raise bad_request(f"shared memory key '{key}' names the server's own shared memory (names starting with "
                          f"{' or '.join(RESERVED)}); choose another name", ["body", "key"])
    return "/" + bare


def _open_shm(key: str) -> tuple[int, bool, os.stat_result]:
    """(descriptor of the object, writable, its stat). Through _posixshmem, what SharedMemory uses:
    SharedMemory itself would hand the client's object to this process's resource tracker, which
    unlinks it when the server exits. glibc's shm_open refuses symbolic links (O_NOFOLLOW)."""
    try:
        import _posixshmem
    except ImportError:
        raise ApiError(501, "system shared memory needs POSIX shared memory (not available on this platform)") from None
    loc = ["body", "key"]
    try:
        try:
            fd, writable = _posixshmem.shm_open(key, os.O_RDWR, mode=0o600), True
        except PermissionError:  # a read-only object can still hold inputs
            fd, writable = _posixshmem.shm_open(key, os.O_RDONLY, mode=0o600), False
    except FileNotFoundError:
        raise bad_request(f"Unable to open shared memory region: '{key}' (no such shared memory object)", loc) from None
    except OSError as e:
        raise bad_request(f"Unable to open shared memory region: '{key}': {e.strerror}", loc) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise bad_request(f"shared memory object '{key}' is not a regular shared memory object", loc)
        if st.st_size == 0:
            raise bad_request(f"shared memory object '{key}' is empty (0 bytes)", loc)
        return fd, writable, st
    except BaseException:
        os.close(fd)
        raise


# ---- CUDA shared memory ------------------------------------------------------------------------
def decode_handle(raw_b64: str, loc: list) -> bytes:
    try:
        raw = base64.b64decode(raw_b64, validate=True)
    except (binascii.Error, ValueError):
        raise bad_request("raw_handle.b64 is not valid base64", loc) from None
    if len(raw) != IPC_HANDLE_BYTES:
        raise bad_request(f"raw_handle.b64 decodes to {len(raw)} bytes; a cudaIpcMemHandle_t has "
                          f"{IPC_HANDLE_BYTES}", loc)
    return raw


class _OpenedHandles:
    """CUDA IPC handles opened by this process, by handle bytes: CUDA opens a handle once per process,
    so regions (of any app in the process) naming the same allocation share one opening."""

    def __init__(self):
        self._open: dict[bytes, list] = {}  # handle -> [base pointer, allocation bytes, users]
        self._lock = threading.Lock()

    def acquire(self, cp, handle: bytes, device: int) -> tuple[int, int]:
        with self._lock:
            hit = self._open.get(handle)
            if hit is not None:
                hit[2] += 1
                return hit[0], hit[1]
            try:
                ptr = int(cp.cuda.runtime.ipcOpenMemHandle(handle))
            except Exception as e:  # CUDARuntimeError: a stale, foreign or same-process handle
                raise bad_request(f"failed to open CUDA IPC handle: {e} (the allocating process must be alive, "
                                  "on this host and this GPU, in the same PID namespace, and not this server)",
                                  ["body", "raw_handle", "b64"]) from None
            try:
                where = int(cp.cuda.runtime.pointerGetAttributes(ptr).device)
                if where != device:
                    raise bad_request(f"the CUDA IPC handle names memory on GPU {where}, not on this server's "
                                      f"GPU {device}", ["body", "device_id"])
                size = allocation_size(ptr)
            except BaseException:
                cp.cuda.runtime.ipcCloseMemHandle(ptr)
                raise
            self._open[handle] = [ptr, size, 1]
            return ptr, size

    def release(self, cp, handle: bytes) -> None:
        with self._lock:
            hit = self._open.get(handle)
            if hit is None:
                return
            hit[2] -= 1
            if hit[2] == 0:
                del self._open[handle]
                try:
                    cp.cuda.runtime.ipcCloseMemHandle(hit[0])
                except Exception as e:  # the region is gone either way; the mapping goes with the process
                    log.warning("closing a CUDA IPC handle failed: %s", e)


HANDLES = _OpenedHandles()
_DRIVER: list = []


def allocation_size(ptr: int) -> int:
    """Bytes of the device allocation starting at `ptr` (cuMemGetAddressRange, as Triton checks it)."""
    if not _DRIVER:
        fn = ctypes.CDLL("libcuda.so.1").cuMemGetAddressRange_v2
        fn.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64]
        fn.restype = ctypes.c_int
        _DRIVER.append(fn)
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    rc = _DRIVER[0](ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr))
    if rc != 0:
        raise bad_request(f"cannot size the allocation the CUDA IPC handle names (cuMemGetAddressRange: CUresult {rc})",
                          ["body", "raw_handle", "b64"])
    return int(size.value) - (ptr - int(base.value))
