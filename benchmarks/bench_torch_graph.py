"""The whole MoE routing prologue inside the caller's CUDA graph: a segfuse.torch op captured in
`torch.cuda.graph` against torch's own ops captured the same way, at T tokens (top-8 of 256 experts).

GPU time per replay: the stream is first held by `torch.cuda._sleep` for longer than the host needs
to queue all replays, so the CUDA events measure the replays back to back, without the host's
launch cost. Both graphs in the same process, checked against each other first. Run on the GPU
machine (after `source benchmarks/device_env.sh`):

    python3 benchmarks/bench_torch_graph.py [--tokens 1 128 4096 65536] [--reps 200] [--json out.jsonl]

Prints one JSON line per measurement and a Markdown table at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import segfuse.torch as sft  # noqa: E402
from torch_graphs import E, K, prologue_graph, torch_prologue  # noqa: E402


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


def eager_us_per_call(fn, arg, reps: int) -> float:
    """Wall time per call of back-to-back eager calls, one synchronization at the end: the host's
    cost per call where it exceeds the GPU's (small T)."""
    for _ in range(10):
        fn(arg)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn(arg)
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps * 1e6


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[1, 128, 4096, 65536])
    p.add_argument("--dtypes", nargs="+", default=["int32", "int64"])
    p.add_argument("--reps", type=int, default=200)
    p.add_argument("--json", help="also write the JSON lines here")
    args = p.parse_args(argv)
    rows = []
    sink = open(args.json, "w") if args.json else None

    def emit(**kw):
        line = json.dumps(kw)
        print(line, flush=True)
        if sink:
            sink.write(line + "\n")

    emit(what="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__)
    for idt in args.dtypes:
        op = sft.fusion(prologue_graph(idt))
        for T in args.tokens:
            ids = torch.randint(0, E, (T, K), device="cuda", dtype=getattr(torch, idt))
            gs, s_outs = captured(op, ids)
            gt, t_outs = captured(torch_prologue, ids)
            ids.copy_(torch.randint(0, E, (T, K), device="cuda", dtype=ids.dtype))  # replays read new contents
            gs.replay()
            gt.replay()
            torch.cuda.synchronize()
            sft.check()
            ok = all(torch.equal(a.long(), b.long()) for a, b in zip(s_outs, t_outs))
            row = dict(what="moe_prologue_graph", idt=idt, T=T, correct=ok,
                       segfuse_us=gpu_us_per_replay(gs, args.reps), torch_us=gpu_us_per_replay(gt, args.reps))
            row["speedup"] = row["torch_us"] / row["segfuse_us"]
            row["eager_segfuse_us"] = eager_us_per_call(op, ids, args.reps)
            row["eager_torch_us"] = eager_us_per_call(torch_prologue, ids, args.reps)
            sft.check()
            emit(**row)
            rows.append(row)
    print("\n| ids | T | segfuse op in the graph (us) | torch ops in the graph (us) | speedup | eager segfuse (us/call) "
          "| eager torch (us/call) | equal |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        print(f"| {r['idt']} | {r['T']} | {r['segfuse_us']:.1f} | {r['torch_us']:.1f} | {r['speedup']:.2f}x "
              f"| {r['eager_segfuse_us']:.1f} | {r['eager_torch_us']:.1f} | {r['correct']} |")
    if sink:
        sink.close()
    return 0 if all(r["correct"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
