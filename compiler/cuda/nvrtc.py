"""Compile CUDA C to a cubin with NVRTC through `cuda.bindings` (no GPU needed).

The `nvidia-cuda-nvrtc` wheel provides libnvrtc; `cuda.bindings.nvrtc` finds it. CI uses this
path to prove that every generated kernel compiles for sm_90; the GPU runtime uses it too (then
loads the cubin with CuPy), so one compiler and one cache serve both.
"""

from __future__ import annotations

import time


class CompileError(RuntimeError):
    def __init__(self, msg: str, log: str = "", source: str = ""):
        super().__init__(msg + ("\n" + log if log else ""))
        self.log, self.source = log, source


def available() -> bool:
    try:
        from cuda.bindings import nvrtc  # noqa: F401
    except Exception:
        return False
    return True


def version() -> str:
    """NVRTC's version, e.g. "nvrtc-13.0" (part of the kernel cache's key: another compiler's
    cubins are never served), or "nvrtc-none" where it cannot be loaded."""
    try:
        from cuda.bindings import nvrtc

        _err, major, minor = nvrtc.nvrtcVersion()
        return f"nvrtc-{major}.{minor}"
    except Exception:  # no cuda.bindings, or no libnvrtc: CuPy's compiler, keyed by CuPy itself
        return "nvrtc-none"


def default_options(arch: str = "sm_90") -> list[str]:
    # lambdas inside kernels need C++17; sizes are baked in, so no other flags matter
    return [f"-arch={arch}", "--std=c++17"]


def _check(res, what: str):
    from cuda.bindings import nvrtc

    err = res[0] if isinstance(res, tuple) else res
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise CompileError(f"{what} failed: {err}")
    return res[1:] if isinstance(res, tuple) and len(res) > 1 else None


def compile_cubin(source: str, options: list[str] | None = None, name: str = "segfuse.cu") -> tuple[bytes, float]:
    """Returns (cubin bytes, compile seconds). Raises CompileError with NVRTC's log."""
    from cuda.bindings import nvrtc

    opts = [o.encode() for o in (options or default_options())]
    t0 = time.perf_counter()
    (prog,) = _check(nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], []), "nvrtcCreateProgram")
    try:
        res = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        err = res[0] if isinstance(res, tuple) else res
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            (n,) = _check(nvrtc.nvrtcGetProgramLogSize(prog), "log size")
            log = b" " * n
            nvrtc.nvrtcGetProgramLog(prog, log)
            raise CompileError("NVRTC compilation failed", log.decode(errors="replace").rstrip("\x00 "), source)
        (n,) = _check(nvrtc.nvrtcGetCUBINSize(prog), "cubin size")
        cubin = b" " * n
        _check(nvrtc.nvrtcGetCUBIN(prog, cubin), "cubin")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return bytes(cubin), time.perf_counter() - t0
