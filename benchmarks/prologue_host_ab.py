"""The host cost of one pipelined call of the whole MoE prologue at decode size (issue 20), split
into its parts and A/B'd in one process (the host's speed moves 30-50% between runs on the H200
machine, so only same-process turns compare):

- `eng.run`, replay memo off (every call binds its parameter blocks) and on (compiler/cuda/graphs.py);
- the prepared call alone (the engine's signature lookup and RunResult skipped), memo off and on;
- `Graph.launch` of the call's captured one-kernel graph alone (the driver's floor);
- the engine's signature of the inputs, alone and with the prepared call's lookup;
- torch's CUDA-graph replay of the same step, for the ratio the target is stated in.

Each part runs ROUNDS rounds of CALLS calls back to back, one synchronize per round, parts in
turns; the median round's time per call is printed, with min and max. Then the host's own time
(the GPU cannot be the limit): HOST_CALLS calls queued behind a spin kernel that holds the stream
longer than they take to issue, median of the rounds.
Environment: PROLOGUE_T (default 1), PROLOGUE_IDT (int32,int64), ROUNDS (7), CALLS (2000)."""

from __future__ import annotations

import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))


def main():
    T = int(os.environ.get("PROLOGUE_T", "1"))
    rounds, calls = int(os.environ.get("ROUNDS", "7")), int(os.environ.get("CALLS", "2000"))
    for idt in os.environ.get("PROLOGUE_IDT", "int32,int64").split(","):
        _one(T, idt, rounds, calls)


def _one(T, idt, rounds, calls):
    import cupy as cp
    from segfuse.compiler.cuda import graphs
    from segfuse.compiler.cuda.arrays import signature
    from segfuse.compiler.cuda.runtime import get_runtime
    from segfuse.compiler.engine import Engine
    from segfuse.compiler.ir import Fusion
    from torch_graphs import E, K, prologue_graph

    f = Fusion.from_json(prologue_graph(idt))
    ids = cp.asarray(cp.random.randint(0, E, (T, K)).astype(idt))
    ins = {"topk_ids": ids}
    engines = {}
    for memo in (False, True):
        keep = graphs.MEMO_BYTES
        graphs.MEMO_BYTES = keep if memo else -1  # read when a run is first remembered
        eng = Engine("cupy", errors="deferred")
        for _ in range(20):
            eng.run(f, ins)
        graphs.MEMO_BYTES = keep
        engines[memo] = eng
    cp.cuda.runtime.deviceSynchronize()
    prepared = {m: next(iter(e._calls.values())) for m, e in engines.items()}
    fast_calls = engines[True]._calls
    st = get_runtime()._tls.st
    graph = next(g for c in st.params.values() for g in getattr(c, "graphs", {}).values())[0]
    stream = st.stream
    parts = {
        "eng.run, memo off": lambda: engines[False].run(f, ins),
        "eng.run, memo on": lambda: engines[True].run(f, ins),
        "prepared call, memo off": lambda: prepared[False](ins),
        "prepared call, memo on": lambda: prepared[True](ins),
        "Graph.launch alone": lambda: graph.launch(stream),
        "the signature alone": lambda: signature(f, ins),
        "signature and lookup": lambda: fast_calls.get(signature(f, ins)),
    }
    parts.update(_torch_parts(T, idt))
    times = {k: [] for k in parts}
    host = {k: [] for k in parts}
    spin = _spin(cp)
    n_host = int(os.environ.get("HOST_CALLS", "400"))
    for _ in range(rounds):
        for name, fn in parts.items():
            for _ in range(50):
                fn()
            cp.cuda.runtime.deviceSynchronize()
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            cp.cuda.runtime.deviceSynchronize()
            times[name].append((time.perf_counter() - t0) / calls * 1e6)
            with stream:  # (the legacy stream torch replays on waits for it too)
                spin((1,), (1,), (cp.uint64(n_host * 40_000),))  # 40 us a call: longer than any issues
            t0 = time.perf_counter()
            for _ in range(n_host):
                fn()
            host[name].append((time.perf_counter() - t0) / n_host * 1e6)
            cp.cuda.runtime.deviceSynchronize()
    print(f"T={T} {idt}: {rounds} rounds of {calls} calls, us per call (median [min, max]); "
          f"host only: {n_host} calls behind a spin kernel")
    for name, ts in times.items():
        print(f"  {name:28s} {statistics.median(ts):7.2f}  [{min(ts):.2f}, {max(ts):.2f}]"
              f"   host only {statistics.median(host[name]):6.2f}")
    torch_t = times.get("torch + CUDA graph replay")
    if torch_t:
        tm = statistics.median(torch_t)
        for name in ("eng.run, memo off", "eng.run, memo on"):
            print(f"  torch + CUDA graph / {name}: {tm / statistics.median(times[name]):.2f}x")
    sys.stdout.flush()


def _spin(cp):
    """A one-thread kernel that waits `ns` nanoseconds of GPU time (the global timer)."""
    return cp.RawKernel(
        'extern "C" __global__ void spin(unsigned long long ns) { unsigned long long t0, t;'
        ' asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));'
        ' do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)); } while (t - t0 < ns); }', "spin")


def _torch_parts(T, idt):
    """torch's replay of the same prologue step (tests/torch_graphs.py), if torch is here."""
    try:
        import torch
        from torch_graphs import E, K, torch_prologue
    except ImportError:
        return {}
    tdt = getattr(torch, idt)
    ids = torch.randint(0, E, (T, K), dtype=tdt, device="cuda")
    for _ in range(3):
        torch_prologue(ids)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        torch_prologue(ids)
    return {"torch + CUDA graph replay": g.replay}


if __name__ == "__main__":
    main()
