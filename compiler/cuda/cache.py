"""KernelCache: generated source -> compiled module, in memory (LRU) and on disk (cubins).

Key = sha256(source + options + arch). A restarted server finds its cubins on disk and loads
them without compiling. Concurrent requests for one key compile it once (a lock per key).
Counters (hits, disk hits, misses, compile seconds) feed the server's metrics.

Compilation goes through NVRTC via `cuda.bindings` when available (the same path CI uses
offline), else through CuPy's RawModule (which has its own cache).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from . import nvrtc


@dataclass
class CacheStats:
    hits: int = 0
    disk_hits: int = 0
    misses: int = 0
    compile_s: float = 0.0
    last_compile_s: float = 0.0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def cache_key(source: str, options: list[str], arch: str) -> str:
    h = hashlib.sha256()
    for part in (source, "\0".join(options), arch):
        h.update(part.encode())
        h.update(b"\1")
    return h.hexdigest()[:32]


class KernelCache:
    def __init__(self, directory: str | None = None, capacity: int = 1024, arch: str = "sm_90",
                 loader=None):
        """`loader(cubin_path, source, options)` turns a cubin into a runnable module (CuPy on the
        GPU); None keeps cubin bytes only (offline compile, CI)."""
        self.dir = directory or os.environ.get("SEGFUSE_KERNEL_CACHE") or os.path.join(
            tempfile.gettempdir(), "segfuse-kernels")
        os.makedirs(self.dir, exist_ok=True)
        self.capacity, self.arch, self.loader = capacity, arch, loader
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

    def get(self, source: str):
        """The compiled module for `source` (loaded by `loader`, or cubin bytes)."""
        opts = self.options()
        key = cache_key(source, opts, self.arch)
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
            if os.path.exists(path):
                self.stats.disk_hits += 1
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
            tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
            with open(tmp, "wb") as f:
                f.write(cubin)
            os.replace(tmp, path)  # atomic: other processes never see half a file
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

    def clear_memory(self):
        with self._glock:
            self._mem.clear()
