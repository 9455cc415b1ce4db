"""Generated CUDA kernels run on the CPU (tests/cuda_emulator.h: a fiber per CUDA thread,
per-block shared memory, warp intrinsics through per-warp slots), so a CPU machine checks what a
kernel computes against NumPy, not only that it compiles. The kernel's text is the codegen's,
with three rewrites the host compiler needs: `extern __shared__` arrays become the block's
dynamic buffer, static `__shared__` variables the block's own storage, and the prelude's PTX lines
(f16/bf16 conversions, an acquire load) calls of the header's C versions.

Slow (a fiber per CUDA thread, one CPU core) and blind to the GPU's memory model and speed: the GPU suite
stays the judge; this is for logic, on small sizes. Needs a C++17 compiler (`c++`)."""

from __future__ import annotations

import ctypes
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

HEADER = Path(__file__).with_name("cuda_emulator.h")
CACHE = Path(os.environ.get("SEGFUSE_EMU_CACHE", Path(tempfile.gettempdir()) / "segfuse-emu"))
MAX_ARGS = 128
# SEGFUSE_EMU_SHUFFLE=N (N > 0): threads run in a random order (seed N) between switch points, so a
# missing barrier shows; 0 (default): a fixed order, the same results every run
SHUFFLE = int(os.environ.get("SEGFUSE_EMU_SHUFFLE", "0"))

_ASM = [  # the prelude's PTX, as C
    (re.compile(r'asm\("cvt\.f32\.f16 %0, %1;" : "=f"\((\w+)\) : "h"\(([\w.]+)\)\);'), r"\1 = sfemu::h2f(\2);"),
    (re.compile(r'asm\("cvt\.rn\.f16\.f32 %0, %1;" : "=h"\(([\w.]+)\) : "f"\((\w+)\)\);'), r"\1 = sfemu::f2h(\2);"),
    (re.compile(r'asm\("cvt\.rn\.bf16\.f32 %0, %1;" : "=h"\(([\w.]+)\) : "f"\((\w+)\)\);'), r"\1 = sfemu::f2b(\2);"),
    (re.compile(r'asm\("(max|min)\.NaN\.f32 %0, %1, %2;" : "=f"\((\w+)\) : "f"\((\w+)\), "f"\((\w+)\)\);'),
     r"\2 = sfemu::\1_nan(\3, \4);"),
    (re.compile(r'asm volatile\("ld\.acquire\.gpu\.global\.u32 %0, \[%1\];" : "=r"\((\w+)\) : "l"\((\w+)\) : "memory"\);'),
     r"\1 = sfemu::ld_acquire(\2);"),
    (re.compile(r'asm volatile\("barrier\.cluster\.arrive\.release\.aligned;\\n\\tbarrier\.cluster\.wait\.acquire\.aligned;" ::: "memory"\);'),
     "sfemu::cluster_sync();"),
    (re.compile(r'asm volatile\("mapa\.u64 %0, %1, %2;" : "=l"\((\w+)\) : "l"\(([^"]+)\), "r"\((\w+)\)\);'),
     r"\1 = sfemu::mapa(\2, \3);"),
    # cache hints change nothing a program can see: the policy is a number, the loads are copies
    (re.compile(r'asm volatile\("createpolicy\.fractional\.L2::evict_last\.b64 %0, 1\.0;" : "=l"\((\w+)\)\);'),
     r"\1 = 0;"),
    (re.compile(r'asm volatile\("ld\.global\.L1::evict_last\.L2::cache_hint\.u32 [^"]*" : "=r"\((\w+)\[0\]\) : "l"\((\w+)\), "l"\(\w+\)\);'),
     r"__builtin_memcpy(\1, \2, 4);"),
    (re.compile(r'asm volatile\("ld\.global\.L1::evict_last\.L2::cache_hint\.v2\.u32 [^"]*" : "=r"\((\w+)\[0\]\)[^:]* : "l"\((\w+)\), "l"\(\w+\)\);'),
     r"__builtin_memcpy(\1, \2, 8);"),
    (re.compile(r'asm volatile\("ld\.global\.L1::evict_last\.L2::cache_hint\.v4\.u32 [^"]*" : "=r"\((\w+)\[0\]\)[^:]* : "l"\((\w+)\), "l"\(\w+\)\);'),
     r"__builtin_memcpy(\1, \2, 16);"),
]
# a kernel's compile-time cluster size (launches run its blocks in clusters of it)
_CLUSTER = re.compile(r"__cluster_dims__\((\d+), 1, 1\) __launch_bounds__\([^)]*\) (\w+)\(")
_DYN = re.compile(r"extern __shared__ (?:__align__\(\d+\) )?unsigned char (\w+)\[\];")
_STATIC = re.compile(r"__shared__ (?:__align__\(\d+\) )?([A-Za-z_][\w ]*?) (\w+)((?:\[[^\]]+\])?);")


def available() -> bool:
    return shutil.which("c++") is not None


def host_source(src: str) -> str:
    """The kernel source as host C++ (see the module doc)."""
    for pat, rep in _ASM:
        src = pat.sub(rep, src)
    if "asm" in re.sub(r"//.*", "", src).replace("sfemu", ""):
        found = re.findall(r"asm[^;]*;", src)
        if found:
            raise ValueError(f"PTX the emulator does not know: {found[0]}")
    src = _DYN.sub(r"unsigned char* \1 = sfemu::dyn_smem();", src)

    def static(m):
        t, name, dims = m.group(1), m.group(2), m.group(3)
        if dims:
            return f"{t} (&{name}){dims} = *({t}(*){dims})sfemu::static_smem(__COUNTER__, sizeof({t}{dims}));"
        return f"{t}& {name} = *({t}*)sfemu::static_smem(__COUNTER__, sizeof({t}));"

    src = _STATIC.sub(static, src)
    return f'#include "{HEADER}"\n' + src


class Module:
    def __init__(self, path: Path, clusters: dict | None = None):
        self.lib = ctypes.CDLL(str(path))
        self.lib.sfemu_launch.restype = ctypes.c_int
        self.lib.sfemu_launch.argtypes = [ctypes.c_void_p, ctypes.c_uint, ctypes.c_uint, ctypes.c_uint,
                                          ctypes.POINTER(ctypes.c_ulonglong), ctypes.c_uint, ctypes.c_uint, ctypes.c_uint]
        self.clusters = clusters or {}  # kernel name -> blocks of its cluster (__cluster_dims__)

    def launch(self, name: str, grid: int, block: int, smem: int, args: list, wave: int | None = None) -> None:
        """Run kernel `name`; `args`: NumPy arrays (their memory is the device memory), ints, or
        None (a null pointer). `wave`: blocks run at once (all of them for grid barriers)."""
        words = (ctypes.c_ulonglong * MAX_ARGS)()
        if len(args) > MAX_ARGS:
            raise ValueError(f"the emulator passes at most {MAX_ARGS} kernel parameters, not {len(args)}")
        for i, a in enumerate(args):
            words[i] = 0 if a is None else a.ctypes.data if isinstance(a, np.ndarray) else int(a) & (2**64 - 1)
        fn = ctypes.cast(getattr(self.lib, name), ctypes.c_void_p).value
        wave = grid if wave is None else wave
        cl = self.clusters.get(name, 1)
        if grid % cl:
            raise ValueError(f"a grid of {grid} blocks is no multiple of the kernel's cluster of {cl}")
        wave = max(cl, min(wave, grid) // cl * cl)
        rc = self.lib.sfemu_launch(fn, grid, block, smem, words, wave, SHUFFLE, cl)
        if rc != 0:
            raise RuntimeError({-1: "the emulator ran out of memory for the kernel's threads",
                                -2: "deadlock: every thread waits at a barrier no other thread reaches"}.get(rc, str(rc)))


_MODULES: dict = {}


def compile_source(src: str) -> Module:
    """The kernel source compiled for the host (cached by its text's hash)."""
    text = host_source(src)
    key = hashlib.sha256((text + HEADER.read_text()).encode()).hexdigest()[:20]
    if key in _MODULES:
        return _MODULES[key]
    CACHE.mkdir(parents=True, exist_ok=True)
    so = CACHE / f"{key}.so"
    if not so.exists():
        cpp = CACHE / f"{key}.cpp"
        cpp.write_text(text)
        tmp = CACHE / f"{key}.{os.getpid()}.so"
        p = subprocess.run(["c++", "-std=c++17", "-O1", "-fPIC", "-shared", "-w", "-U_FORTIFY_SOURCE", "-o", str(tmp), str(cpp)],
                           capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(f"host compile failed:\n{p.stderr[-4000:]}")
        os.replace(tmp, so)
    _MODULES[key] = Module(so, {name: int(n) for n, name in _CLUSTER.findall(src)})
    return _MODULES[key]
