"""The process's GPU as the CUDA backend sees it: CuPy, the SM count and architecture, how a cubin
becomes a loaded module, and the kernel cache that everything compiling for this GPU shares.

It sits below the runtime so that launchers of their own kernels (the library radix sort) can
compile and size them without importing the runtime: one `Device` per process (`get_device`);
the default `CupyRuntime` uses its cache, so its statistics count every kernel the process
compiled.
"""

from __future__ import annotations

import re
import threading

from .cache import KernelCache


def cupy_module():
    import cupy

    return cupy


class Device:
    def __init__(self):
        cp = self.cp = cupy_module()
        dev = cp.cuda.Device()
        self.index = dev.id  # the device current when the process's Device was made (the server's)
        self.sm_count = dev.attributes["MultiProcessorCount"]
        self.arch = f"sm_{dev.compute_capability}"
        self.cache = self.kernel_cache()

    def kernel_cache(self, cache_dir: str | None = None) -> KernelCache:
        """A kernel cache for this GPU (in `cache_dir`, or the default directory), with NVRTC
        warming up in the background."""
        cache = KernelCache(cache_dir, arch=self.arch, loader=self.load_module)
        cache.warm_compiler()
        return cache

    def load_module(self, path, source, opts):
        if path is not None:
            try:
                mod = self.cp.RawModule(path=path)
                m = re.search(r"sf_k_[0-9a-f]+_0", source)
                if m:
                    mod.get_function(m.group(0))  # load now: a cubin this driver rejects falls back
                return mod
            except Exception:
                pass
        return self.cp.RawModule(code=source, options=tuple(opts), backend="nvrtc")


_DEVICE: list = []
_LOCK = threading.Lock()


def get_device() -> Device:
    """The process's Device (made at the first call; ImportError without CuPy)."""
    if not _DEVICE:
        with _LOCK:
            if not _DEVICE:
                _DEVICE.append(Device())
    return _DEVICE[0]
