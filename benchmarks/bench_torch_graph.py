"""The whole MoE routing prologue inside the caller's CUDA graph: a segfuse.torch op captured in
`torch.cuda.graph` against torch's own ops captured the same way, at T tokens (top-8 of 256 experts).

GPU time per replay: the stream is first held by `torch.cuda._sleep` for longer than the host needs
to queue all replays, so the CUDA events measure the replays back to back, without the host's
launch cost. Both graphs in the same process, checked against each other first. Eager calls too:
the op called (the direct path), the op through the dispatcher (`op.op`), `Engine("cupy",
errors="deferred")` on a CuPy view of the same ids, and torch's eager prologue; wall time per call
of back-to-back calls, interleaved in rounds (the median round). Run on the GPU machine (after
`source benchmarks/device_env.sh`):

    python3 benchmarks/bench_torch_graph.py [--tokens 1 128 4096 65536] [--reps 200] [--json out.jsonl]
        [--eager-only]

Prints one JSON line per measurement and a Markdown table at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import segfuse.torch as sft
import torch
from workloads import E, K, prologue_graph, torch_prologue


def captured(fn, *args):
    """A CUDA graph of `fn(*args)` (warmed up on a side stream first, as torch recommends)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(*args)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = fn(*args)
    return g, outs


def gpu_us_per_replay(g, reps: int) -> float:
    g.replay()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        g.replay()
    torch.cuda.synchronize()
    host_s = time.perf_counter() - t0
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int((host_s * 2 + 2e-3) * 2e9))  # cycles (~2 GHz): longer than queuing takes
    a.record()
    for _ in range(reps):
        g.replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1e3 / reps


def eager_us_per_call(fns: dict, reps: int, rounds: int = 5) -> dict:
    """Wall time per call of back-to-back eager calls of each function, one synchronization per
    round: the host's cost per call where it exceeds the GPU's (small T). The functions take
    turns, `rounds` rounds of reps // rounds calls each; the median round of each is reported."""
    for fn in fns.values():
        for _ in range(10):
            fn()
    torch.cuda.synchronize()
    per = max(reps // rounds, 1)
    times: dict = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(per):
                fn()
            torch.cuda.synchronize()
            times[k].append((time.perf_counter() - t0) / per * 1e6)
    return {k: sorted(v)[len(v) // 2] for k, v in times.items()}


def plan_of(op, ids) -> str:
    """How the op's calls at these ids allocate: 'planned' (outputs made before the launch, the
    rest one arena of N bytes), 'partial', or 'per buffer'."""
    sigs = getattr(getattr(op, "_cuda", None), "sigs", None)
    if not sigs:
        return "per buffer"
    sig = sigs.get(((ids.shape, ids.stride(), ids.dtype),))
    plan = getattr(sig, "plan", None)
    if plan is None:
        return "per buffer"
    return f"{'planned' if plan.complete else 'partial'}, arena {plan.arena_bytes} B"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 128, 4096, 65536])
    p.add_argument("--dtypes", nargs="+", default=["int32", "int64"])
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--json", help="also write the JSON lines here")
    p.add_argument("--eager-only", action="store_true", help="only the eager calls (no graphs)")
    args = p.parse_args(argv)
    rows = []
    sink = open(args.json, "w") if args.json else None

    def emit(**kw):
        line = json.dumps(kw)
        print(line, flush=True)
        if sink:
            sink.write(line + "\n")

    emit(what="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__)
    import cupy as cp
    from segfuse.compiler.engine import Engine

    lazy = Engine("cupy", errors="deferred")
    for idt in args.dtypes:
        op = sft.fusion(prologue_graph(idt))
        for T in args.tokens:
            ids = torch.randint(0, E, (T, K), device="cuda", dtype=getattr(torch, idt))
            row = dict(what="moe_prologue_graph", idt=idt, T=T)
            if not args.eager_only:
                gs, s_outs = captured(op, ids)
                gt, t_outs = captured(torch_prologue, ids)
                ids.copy_(torch.randint(0, E, (T, K), device="cuda", dtype=ids.dtype))  # replays read new contents
                gs.replay()
                gt.replay()
                torch.cuda.synchronize()
                sft.check()
                row["correct"] = all(torch.equal(a.long(), b.long()) for a, b in zip(s_outs, t_outs))
                row.update(segfuse_us=gpu_us_per_replay(gs, args.reps), torch_us=gpu_us_per_replay(gt, args.reps))
                row["speedup"] = row["torch_us"] / row["segfuse_us"]
            else:
                row["correct"] = all(torch.equal(a.long(), b.long()) for a, b in zip(op(ids), torch_prologue(ids)))
            cins = {"topk_ids": cp.from_dlpack(ids)}
            eager = eager_us_per_call({"segfuse": lambda op=op, ids=ids: op(ids),
                                       "dispatch": lambda op=op, ids=ids: op.op(ids),
                                       "engine": lambda op=op, cins=cins: lazy.run(op.fusion, cins),
                                       "torch": lambda ids=ids: torch_prologue(ids)}, args.reps)
            lazy.synchronize()
            sft.check()
            row.update({f"eager_{k}_us": v for k, v in eager.items()})
            row["alloc"] = plan_of(op, ids)
            emit(**row)
            rows.append(row)
    print("\n| ids | T | segfuse op in the graph (us) | torch ops in the graph (us) | speedup | eager segfuse (us/call) "
          "| eager op through the dispatcher | eager Engine deferred, CuPy | eager torch (us/call) | equal |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        g = (f"{r['segfuse_us']:.1f} | {r['torch_us']:.1f} | {r['speedup']:.2f}x" if "segfuse_us" in r else "- | - | -")
        print(f"| {r['idt']} | {r['T']} | {g} | {r['eager_segfuse_us']:.1f} | {r['eager_dispatch_us']:.1f} "
              f"| {r['eager_engine_us']:.1f} | {r['eager_torch_us']:.1f} | {r['correct']} |")
    if sink:
        sink.close()
    return 0 if all(r["correct"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
