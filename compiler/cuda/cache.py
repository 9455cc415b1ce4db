"""KernelCache: generated source -> compiled module, in memory (LRU) and on disk (cubins).

Key = sha256(source + options + arch + NVRTC's version, + the code generator's options when not
the defaults). A restarted server finds its cubins on
disk and loads them without compiling; each cubin has a sidecar with its size and sha256, checked
before it is loaded (a corrupt or half-copied file is compiled again and replaced, never loaded).
The directory is bounded (`max_bytes`): past it the least recently used cubins go. Concurrent
requests for one key compile it once (a lock per key). Counters (hits, disk hits, misses, compile
seconds, corrupt files) feed the server's metrics.

Compilation goes through NVRTC via `cuda.bindings` when available (the same path CI uses
offline), else through CuPy's RawModule (which has its own cache).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from ..codegen.options import DEFAULT_OPTIONS, CodegenOptions
from . import nvrtc

log = logging.getLogger("segfuse.compiler")

SIDECAR = ".sha256"  # beside each cubin: "<size> <sha256 hex>"
DEFAULT_MAX_BYTES = 4 << 30  # SEGFUSE_KERNEL_CACHE_BYTES overrides it


def default_directory() -> str:
    """Per user, not a shared temporary directory: $XDG_CACHE_HOME/segfuse/kernels or
    ~/.cache/segfuse/kernels."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "segfuse", "kernels")


def _write_atomic(path: str, data: bytes) -> None:
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


@dataclass
class CacheStats:
    hits: int = 0
    disk_hits: int = 0
    misses: int = 0
    compile_s: float = 0.0
    last_compile_s: float = 0.0
    corrupt: int = 0  # cubins on disk whose size or checksum did not match their sidecar
    evicted: int = 0  # cubins removed to keep the directory under max_bytes

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def cache_key(source: str, options: list[str], arch: str, compiler: str = "",
              codegen: CodegenOptions = DEFAULT_OPTIONS) -> str:
    """The key of `source` compiled with NVRTC `options` for `arch` by `compiler`, generated under
    `codegen`'s options (the defaults add nothing: keys of cubins cached before there were options
    stay valid)."""
    h = hashlib.sha256()
    parts = (source, "\0".join(options), arch, compiler) + (() if codegen == DEFAULT_OPTIONS else (codegen.key,))
    for part in parts:
        h.update(part.encode())
        h.update(b"\1")
    return h.hexdigest()[:32]


class KernelCache:
    def __init__(self, directory: str | None = None, capacity: int = 1024, arch: str = "sm_90",
                 loader=None, max_bytes: int | None = None):
        """`loader(cubin_path, source, options)` turns a cubin into a runnable module (CuPy on the
        GPU); None keeps cubin bytes only (offline compile, CI)."""
        self.dir = directory or os.environ.get("SEGFUSE_KERNEL_CACHE") or default_directory()
        os.makedirs(self.dir, exist_ok=True)
        self.capacity, self.arch, self.loader = capacity, arch, loader
        env_max = os.environ.get("SEGFUSE_KERNEL_CACHE_BYTES")
        self.max_bytes = max_bytes if max_bytes is not None else int(env_max) if env_max else DEFAULT_MAX_BYTES
        self.compiler = nvrtc.version()
        self._mem: OrderedDict = OrderedDict()
        self._locks: dict[str, threading.Lock] = {}
        self._glock = threading.Lock()
        self.stats = CacheStats()
        self.compiler_ready = threading.Event()
        self.first_compile_s: float | None = None

    def warm_compiler(self) -> threading.Thread | None:
        """Load NVRTC and compile a trivial kernel in the background. The first compile in a
        process pays NVRTC's one-time start (0.1-0.5 s); a server does that at start-up instead
        of in its first request. `compiler_ready` is set when done (`first_compile_s` says how
        long it took)."""
        if not nvrtc.available():
            self.compiler_ready.set()
            return None

        def work():
            t0 = time.perf_counter()
            try:
                nvrtc.compile_cubin('extern "C" __global__ void sf_warm(int* p) { *p = 0; }', self.options())
            except Exception:  # a broken compiler shows up in the first real compile, with its log
                pass
            self.first_compile_s = time.perf_counter() - t0
            self.compiler_ready.set()

        t = threading.Thread(target=work, name="segfuse-nvrtc-warmup", daemon=True)
        t.start()
        return t

    def options(self) -> list[str]:
        return nvrtc.default_options(self.arch)

    def _lock_for(self, key: str) -> threading.Lock:
        with self._glock:
            lk = self._locks.get(key)
            if lk is None:
                lk = self._locks[key] = threading.Lock()
            return lk

    def _path(self, key: str) -> str:
        return os.path.join(self.dir, f"{key}.cubin")

    def get(self, source: str, codegen: CodegenOptions = DEFAULT_OPTIONS):
        """The compiled module for `source`, generated under `codegen` (loaded by `loader`, or
        cubin bytes)."""
        opts = self.options()
        key = cache_key(source, opts, self.arch, self.compiler, codegen)
        with self._glock:
            hit = self._mem.get(key)
            if hit is not None:
                self._mem.move_to_end(key)
                self.stats.hits += 1
                return hit
        with self._lock_for(key):  # single flight: the first caller compiles, the rest wait
            with self._glock:
                hit = self._mem.get(key)
                if hit is not None:
                    self.stats.hits += 1
                    return hit
            path = self._path(key)
            if os.path.exists(path) and self._verified(path):
                self.stats.disk_hits += 1
                with contextlib.suppress(OSError):
                    os.utime(path)  # recently used: eviction takes the oldest first
                mod = self._load(path, source, opts)
            else:
                mod = self._compile(source, opts, path)
            with self._glock:
                self._mem[key] = mod
                while len(self._mem) > self.capacity:
                    self._mem.popitem(last=False)
            return mod

    def _compile(self, source: str, opts: list[str], path: str):
        t0 = time.perf_counter()
        cubin = None
        if nvrtc.available():
            try:
                cubin, _ = nvrtc.compile_cubin(source, opts)
            except nvrtc.CompileError:
                raise
            except Exception:  # libnvrtc not loadable here: let CuPy compile
                if self.loader is None:
                    raise
        if cubin is not None:
            _write_atomic(path, cubin)  # other processes never see half a file
            _write_atomic(path + SIDECAR, f"{len(cubin)} {hashlib.sha256(cubin).hexdigest()}".encode())
            self._evict()
            mod = self._load(path, source, opts)
        elif self.loader is not None:
            mod = self.loader(None, source, opts)  # CuPy compiles (and caches) itself
        else:
            raise nvrtc.CompileError("no CUDA compiler: install the 'nvrtc' extra (cuda-bindings)")
        dt = time.perf_counter() - t0
        self.stats.misses += 1
        self.stats.compile_s += dt
        self.stats.last_compile_s = dt
        return mod

    def _load(self, path: str, source: str, opts: list[str]):
        if self.loader is None:
            with open(path, "rb") as f:
                return f.read()
        return self.loader(path, source, opts)

    def _verified(self, path: str) -> bool:
        """Whether the cubin at `path` is the one its sidecar describes (size and sha256)."""
        try:
            with open(path + SIDECAR, "rb") as f:
                size, digest = f.read().decode().split()
            with open(path, "rb") as f:
                data = f.read()
            if len(data) == int(size) and hashlib.sha256(data).hexdigest() == digest:
                return True
        except (OSError, ValueError, UnicodeDecodeError):
            pass
        self.stats.corrupt += 1
        log.warning("kernel cache: %s does not match its checksum; compiling it again", path)
        return False

    def _evict(self) -> None:
        """Remove the least recently used cubins (and sidecars) while the directory holds more
        than max_bytes; down to 90% of it, so that not every compile scans again."""
        try:
            entries = []
            with os.scandir(self.dir) as it:
                for e in it:
                    if e.name.endswith(".cubin"):
                        st = e.stat()
                        entries.append((st.st_mtime, st.st_size, e.path))
        except OSError:
            return
        total = sum(size for _, size, _ in entries)
        if total <= self.max_bytes:
            return
        for _mtime, size, path in sorted(entries):
            if total <= self.max_bytes * 0.9:
                break
            for p in (path, path + SIDECAR):
                with contextlib.suppress(OSError):
                    os.remove(p)
            total -= size
            self.stats.evicted += 1
