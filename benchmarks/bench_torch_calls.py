"""The host cost of a `segfuse.torch` eager call against `Engine("cupy", errors="deferred")` on the
same tensors (the target: the wrapper costs at most ~10 us more), for the MoE prologue
(benchmarks/workloads.py: one graph, E = 256, K = 8) at T in {1, 128, 4096, 65536}.

Three ways to call the same graph on the same ids, none waiting for the device per call (as a
serving loop runs them; the prologue's plan checks its indices, so the Engine defers that check):
- `Engine("cupy", errors="deferred").run(f, {"topk_ids": cupy view of the ids})`;
- `segfuse.torch` eager: `op(ids)` (the op's implementation without the dispatcher);
- through the dispatcher: `op.op(ids)` (`torch.ops.segfuse.f_<id>`, as torch.compile's graphs call it).
Each round times CALLS calls back to back and one synchronize, wall time per call; the ways take
turns in each round and the median of ROUNDS rounds is reported, with the differences to the
Engine in us and the ratios.

    python benchmarks/bench_torch_calls.py [--tokens 1,128,4096,65536] [--idt int64,int32]
                                           [--calls 200] [--rounds 7] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

TOKENS = (1, 128, 4096, 65536)
TARGET_US = 10.0  # the target: an eager call within this of the Engine's


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)), help="comma-separated T values")
    ap.add_argument("--idt", default="int64", help="comma-separated index dtypes of topk_ids (int64, int32)")
    ap.add_argument("--calls", type=int, default=200, help="calls per round, back to back")
    ap.add_argument("--rounds", type=int, default=7, help="rounds (the ways take turns in each)")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows to this file")
    return ap.parse_args(argv)


def per_call_us(fn, calls: int, sync) -> float:
    """Wall time per call of `calls` calls back to back and one synchronize."""
    sync()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - t0) / calls * 1e6


def bench_one(idt: str, T: int, calls: int, rounds: int) -> dict:
    import cupy as cp
    import segfuse.torch as sft
    import torch
    from segfuse.compiler.engine import Engine
    from segfuse.compiler.ir import Fusion
    from workloads import E, K, prologue_graph, torch_prologue

    graph = prologue_graph(idt)
    f = Fusion.from_json(graph)
    gen = torch.Generator(device="cuda").manual_seed(T)
    ids_t = torch.randint(0, E, (T, K), device="cuda", dtype=getattr(torch, idt), generator=gen)
    ins = {"topk_ids": cp.asarray(ids_t)}  # (the same memory: __cuda_array_interface__)
    eng = Engine("cupy", errors="deferred")
    op = sft.fusion(graph)
    want = torch_prologue(ids_t)
    names = ("counts", "offsets", "input_perm", "output_perm")
    for _ in range(3):  # prepared, fast path set up, allocations recorded
        got_e = eng.run(f, ins).outputs
        got_t = op(ids_t)
        op.op(ids_t)
    eng.synchronize()
    sft.check()
    for name, w, t in zip(names, want, got_t):
        assert torch.equal(torch.as_tensor(got_e[name], device="cuda").long(), w.long()), f"Engine {name} T={T}"
        assert torch.equal(t.long(), w.long()), f"segfuse.torch {name} T={T}"

    def sync():
        torch.cuda.synchronize()
        eng.synchronize()

    ways = {"engine": lambda: eng.run(f, ins), "torch eager": lambda: op(ids_t),
            "torch dispatcher": lambda: op.op(ids_t)}
    times = {w: [] for w in ways}
    for _ in range(rounds):
        for w, fn in ways.items():
            times[w].append(per_call_us(fn, calls, sync))
    sft.check()  # (no call failed on the device)
    med = {w: statistics.median(ts) for w, ts in times.items()}
    return {"T": T, "idt": idt, "engine us": med["engine"], "torch eager us": med["torch eager"],
            "torch dispatcher us": med["torch dispatcher"],
            "eager - engine us": med["torch eager"] - med["engine"],
            "dispatcher - engine us": med["torch dispatcher"] - med["engine"],
            "eager / engine": med["torch eager"] / med["engine"],
            "dispatcher / engine": med["torch dispatcher"] / med["engine"]}


def table(rows: list) -> str:
    keys = ["T", "idt", "engine us", "torch eager us", "torch dispatcher us", "eager - engine us",
            "dispatcher - engine us", "eager / engine", "dispatcher / engine"]
    out = ["| " + " | ".join(keys) + " |", "|" + " --- |" * len(keys)]
    for r in rows:
        out.append("| " + " | ".join(f"{r[k]:.2f}" if isinstance(r[k], float) and "/" in k else
                                     f"{r[k]:.1f}" if isinstance(r[k], float) else str(r[k]) for k in keys) + " |")
    return "\n".join(out)


def main(argv=None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # (workloads.py)
    import torch

    rows = []
    for idt in args.idt.split(","):
        for T in (int(t) for t in args.tokens.split(",")):
            rows.append(bench_one(idt.strip(), T, args.calls, args.rounds))
            r = rows[-1]
            print(f"T={T} {idt}: engine {r['engine us']:.1f} us, eager {r['torch eager us']:.1f} us "
                  f"({r['eager - engine us']:+.1f}), dispatcher {r['torch dispatcher us']:.1f} us "
                  f"({r['dispatcher - engine us']:+.1f})", flush=True)
    print()
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; target: eager within {TARGET_US:.0f} us "
          "of the engine")
    print(table(rows))
    if args.json is not None:
        args.json.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
