"""What a row kernel's vector variant does to global memory, without a GPU: NVRTC compiles the
generated module for sm_90 (ptxas's register count) and for compute_90 (its PTX), and this prints
the block size, the registers, and every global load and store instruction of the kernel, with
the code generator's knobs as they are and under each variant of VARIANTS (norm_ab.py's specs,
e.g. "NORM_WIDE=1"; default: that one).

`python benchmarks/row_kernel_ptx.py rmsnorm:bfloat16:8x8192 softmax:bfloat16:32768x4096`"""

from __future__ import annotations

import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
sys.path.insert(0, HERE)


def _compile(src: str, opts: list[str]) -> tuple[str, str | None]:
    """(NVRTC's log, the PTX when `opts` target a compute_ architecture)."""
    from cuda.bindings import nvrtc

    _, prog = nvrtc.nvrtcCreateProgram(src.encode(), b"row.cu", 0, [], [])
    try:
        nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        n = nvrtc.nvrtcGetProgramLogSize(prog)[1]
        log = b" " * n
        nvrtc.nvrtcGetProgramLog(prog, log)
        ptx = None
        if any("compute_" in o for o in opts):
            n = nvrtc.nvrtcGetPTXSize(prog)[1]
            ptx = b" " * n
            nvrtc.nvrtcGetPTX(prog, ptx)
            ptx = ptx.decode()
        return log.decode(errors="replace"), ptx
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def accesses(kind: str, dtype: str, R: int, D: int, tag: str) -> dict:
    """The vector variant's block, registers, and global loads and stores (instruction -> count)."""
    from norm_graphs import norm_graph
    from segfuse.compiler.cuda.prepare import modules_without_device
    from segfuse.compiler.ir import Fusion
    from segfuse.compiler.segmenter.cache import PlanCache

    base = norm_graph(kind, dtype)
    f = Fusion.from_json({**base.to_json(), "name": f"{base.name}_{tag}"})
    b = f.bind(f.input_shapes({"R": R, "D": D}))
    (_, mod), = modules_without_device(f, PlanCache().get(f, b)[0], b, 132)
    name = mod.launches[0].kernel  # (the vector variant comes first where there is one)
    log, _ = _compile(mod.source, ["-arch=sm_90", "--std=c++17", "--ptxas-options=-v"])
    regs = dict(re.findall(r"Compiling entry function '(\w+)'[^\n]*\n(?:[^\n]*\n)*?[^\n]*Used (\d+) registers", log))
    _, ptx = _compile(mod.source, ["-arch=compute_90", "--std=c++17"])
    body = ptx[ptx.index(f".entry {name}("):]
    body = body[:body.index("\n}\n")]
    count = lambda pat: {i: len(re.findall(re.escape(i) + r"\s", body)) for i in sorted(set(re.findall(pat, body)))}  # noqa: E731
    return {"block": mod.launches[0].block, "registers": int(regs[name]) if name in regs else None,
            "loads": count(r"ld\.global[\w.:]*"), "stores": count(r"st\.global[\w.:]*")}


def main(argv) -> None:
    from norm_ab import variant

    variants = ["default", *os.environ.get("VARIANTS", "NORM_WIDE=1").split()]
    for spec in argv:
        kind, dtype, shape = spec.split(":")
        R, D = (int(v) for v in shape.split("x"))
        for i, v in enumerate(variants):
            with variant(v):
                a = accesses(kind, dtype, R, D, f"ptx{i}")
            print(f"{spec} [{v}]: block {a['block']}, {a['registers']} registers, loads {a['loads']}, stores {a['stores']}")


if __name__ == "__main__":
    main(sys.argv[1:])
