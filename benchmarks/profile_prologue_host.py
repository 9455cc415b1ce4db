"""The host side of the whole MoE prologue at decode size (issue 20: pipelined T = 1 is bound by
the host, not the GPU): `Engine("cupy", errors="deferred").run` back to back for SECONDS seconds,
for py-spy to sample (`py-spy record -f raw -o stacks.txt -- python benchmarks/profile_prologue_host.py`).
Prints the pipelined time per call before and after the sampled loop."""

from __future__ import annotations

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))


def main():
    import cupy as cp
    from segfuse.compiler.engine import Engine
    from segfuse.compiler.ir import Fusion
    from torch_graphs import E, K, prologue_graph

    T = int(os.environ.get("PROLOGUE_T", "1"))
    idt = os.environ.get("PROLOGUE_IDT", "int64")
    f = Fusion.from_json(prologue_graph(idt))
    ids = cp.asarray(cp.random.randint(0, E, (T, K)).astype(idt))
    eng = Engine("cupy", errors="deferred")
    for _ in range(20):
        eng.run(f, {"topk_ids": ids})
    cp.cuda.runtime.deviceSynchronize()

    def per_call(n):
        t0 = time.perf_counter()
        for _ in range(n):
            eng.run(f, {"topk_ids": ids})
        cp.cuda.runtime.deviceSynchronize()
        return (time.perf_counter() - t0) / n * 1e6

    print(f"T={T} {idt}: pipelined {per_call(2000):.2f} us per call", flush=True)
    end = time.time() + float(os.environ.get("SECONDS_", "15"))
    n = 0
    while time.time() < end:
        per_call(500)
        n += 500
    print(f"sampled loop: {n} calls; pipelined after {per_call(2000):.2f} us per call", flush=True)


if __name__ == "__main__":
    main()
