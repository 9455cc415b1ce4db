"""The kernel cache's disk layer (issue 17, item 10), with NVRTC offline (no GPU): a corrupt or
unverifiable cubin is compiled again and replaced, never loaded; the key includes the compiler's
version; the default directory is per user; the directory is bounded, oldest cubins first."""

from __future__ import annotations

import os

import pytest
from segfuse.compiler.codegen.options import CodegenOptions
from segfuse.compiler.cuda import nvrtc
from segfuse.compiler.cuda.cache import SIDECAR, KernelCache, cache_key, default_directory

pytestmark = pytest.mark.skipif(not nvrtc.available(), reason="needs the nvrtc extra (cuda-bindings)")


def _src(k: int) -> str:
    return f'extern "C" __global__ void sf_t{k}(int* p) {{ p[threadIdx.x] = {k}; }}'


def _only_cubin(d) -> str:
    (name,) = [n for n in os.listdir(d) if n.endswith(".cubin")]
    return os.path.join(d, name)


@pytest.mark.parametrize("damage", ["flip", "truncate", "no-sidecar", "bad-sidecar"])
def test_a_damaged_cubin_is_compiled_again(tmp_path, damage):
    first = KernelCache(str(tmp_path)).get(_src(1))
    path = _only_cubin(tmp_path)
    if damage == "flip":
        data = bytearray(open(path, "rb").read())
        data[len(data) // 2] ^= 0xFF
        open(path, "wb").write(bytes(data))
    elif damage == "truncate":
        open(path, "wb").write(open(path, "rb").read()[:100])
    elif damage == "no-sidecar":
        os.remove(path + SIDECAR)
    else:
        open(path + SIDECAR, "w").write("garbage")
    again = KernelCache(str(tmp_path))
    mod = again.get(_src(1))
    assert mod == first and again.stats.corrupt == 1 and again.stats.misses == 1 and again.stats.disk_hits == 0
    third = KernelCache(str(tmp_path))  # the file was replaced: a clean disk hit now
    assert third.get(_src(1)) == first and third.stats.disk_hits == 1 and third.stats.corrupt == 0


def test_the_key_names_the_compiler(tmp_path):
    src, opts = _src(2), nvrtc.default_options()
    assert cache_key(src, opts, "sm_90", "nvrtc-13.0") != cache_key(src, opts, "sm_90", "nvrtc-13.1")
    KernelCache(str(tmp_path)).get(src)
    other = KernelCache(str(tmp_path))
    other.compiler = "nvrtc-0.0"  # a cache volume reused by another compiler: its cubins are not served
    other.get(src)
    assert other.stats.misses == 1 and other.stats.disk_hits == 0
    assert len([n for n in os.listdir(tmp_path) if n.endswith(".cubin")]) == 2


def test_the_key_names_the_code_generators_options(tmp_path):
    """Kernels generated under other CodegenOptions are other cache entries; the default options
    keep the keys cubins were cached under before there were options."""
    src, opts = _src(3), nvrtc.default_options()
    plain = cache_key(src, opts, "sm_90", "nvrtc-13.0")
    assert cache_key(src, opts, "sm_90", "nvrtc-13.0", CodegenOptions()) == plain
    assert cache_key(src, opts, "sm_90", "nvrtc-13.0", CodegenOptions(row_load_hints=False)) != plain
    cache = KernelCache(str(tmp_path))
    cache.get(src)
    cache.get(src, CodegenOptions(row_one_barrier=True))
    assert cache.stats.misses == 2 and len([n for n in os.listdir(tmp_path) if n.endswith(".cubin")]) == 2


def test_default_directory_is_per_user(monkeypatch, tmp_path):
    monkeypatch.delenv("SEGFUSE_KERNEL_CACHE", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert default_directory() == str(tmp_path / ".cache" / "segfuse" / "kernels")
    assert KernelCache().dir == default_directory()
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_directory() == str(tmp_path / "xdg" / "segfuse" / "kernels")


def test_the_directory_is_bounded_oldest_first(tmp_path):
    cache = KernelCache(str(tmp_path))
    cache.get(_src(10))
    one = os.path.getsize(_only_cubin(tmp_path))
    small = KernelCache(str(tmp_path), max_bytes=int(one * 2.5))
    for k in (11, 12, 13, 14):
        small.get(_src(k))
    cubins = [n for n in os.listdir(tmp_path) if n.endswith(".cubin")]
    assert small.stats.evicted >= 2 and len(cubins) <= 2
    assert sum(os.path.getsize(tmp_path / n) for n in cubins) <= small.max_bytes
    assert all(os.path.exists(tmp_path / (n + SIDECAR)) for n in cubins)  # evicted with their sidecars
    # the newest survives, and is served from disk
    again = KernelCache(str(tmp_path), max_bytes=small.max_bytes)
    again.get(_src(14))
    assert again.stats.disk_hits == 1
