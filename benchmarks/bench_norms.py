"""Row normalizations written as graphs (issue 20), for `python benchmarks/bench_gpu.py --only norm`:
softmax, log_softmax, RMSNorm and LayerNorm (benchmarks/workloads.py) at [32768, 4096], [32768, 8192],
[8, 4096], [8, 8192], float32 and bfloat16, against torch eager, torch + CUDA graph, torch.compile
(default and reduce-overhead) and the copy-bandwidth limit (a device-to-device copy moving the
input bytes + output bytes), measured in the same run in three modes:

- per call: one call, then a synchronize (CUDA events around the call, host work included);
- pipelined: PIPE calls back to back, one synchronize at the end, wall time per call
  (segfuse with errors="deferred", as a serving loop runs it);
- GPU time: kernels only (segfuse's `kernel_time_us`; torch's CUDA-graph replays with the stream
  held first, so the events see the kernels back to back; the copy's events likewise), and
  segfuse's kernels captured in a CUDA graph through segfuse.torch, timed exactly as torch's rows
  are. Each implementation's GPU time is the median of modes.GPU_ROUNDS rounds taken in turns.
  Where the output is at most GRAPH_CALLS_BYTES, every graph holds GRAPH_CALLS calls (per-call
  time = replay / calls): an 8-row kernel of 2-3 us is then timed between kernels of its own
  graph, as a model's graph runs it, not behind a graph launch of its own.

Environment knobs (to fit a short lease): SEGFUSE_NORM_KINDS, SEGFUSE_NORM_SHAPES ("32768x4096,8x4096"),
SEGFUSE_NORM_DTYPES, SEGFUSE_NORM_COMPILE=0 (skip torch.compile, whose compiles take most of the time),
SEGFUSE_COMPILE_MODES ("default" to skip reduce-overhead), SEGFUSE_GRAPH_CALLS (20).
"""

from __future__ import annotations

import os

from modes import env_list, graph_of, held_events_us, measure, replay_us, stop_compile_workers, torch_launches

SHAPES = [(32768, 4096), (32768, 8192), (8, 4096), (8, 8192)]
GRAPH_CALLS = int(os.environ.get("SEGFUSE_GRAPH_CALLS", "20"))
GRAPH_CALLS_BYTES = 32 << 20  # (bigger outputs: one call a graph; 20 would hold 20 outputs)


def bench_one(rows, kind, dtype, R, D, samples):
    import cupy as cp
    import ml_dtypes
    import numpy as np
    import segfuse.torch as sft
    import torch
    from segfuse.compiler.engine import Engine
    from workloads import norm_graph, norm_inputs, torch_norm

    f = norm_graph(kind, dtype)
    host = norm_inputs(kind, R, D, dtype, seed=1)
    tdt = torch.float32 if dtype == "float32" else torch.bfloat16
    t_ins = {k: torch.from_numpy(np.asarray(v).astype(np.float32)).to(tdt).cuda() for k, v in host.items()}
    # (CuPy has no bfloat16: segfuse takes and returns its bits as uint16)
    ins = {k: cp.asarray(v.view(np.uint16) if dtype == "bfloat16" else v) for k, v in host.items()}
    eng, deferred = Engine("cupy"), Engine("cupy", errors="deferred")
    got = cp.asnumpy(eng.run(f, ins).outputs["y"])
    got = (got.view(ml_dtypes.bfloat16) if dtype == "bfloat16" else got).astype(np.float32)
    want = torch_norm(kind, t_ins).float().cpu().numpy()
    tol = 2e-2 if dtype == "bfloat16" else 1e-4
    assert np.allclose(got, want, rtol=tol, atol=tol, equal_nan=True), f"{kind} {dtype} {R}x{D} differs from torch"
    prep = eng.prepared(f, ins)
    name = f"{kind} [{R}, {D}] {dtype}"
    out_bytes = R * D * (4 if dtype == "float32" else 2)
    in_bytes = sum(int(np.prod(v.shape)) * v.dtype.itemsize for v in ins.values())
    src = torch.empty((in_bytes + out_bytes) // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_us = sorted(held_events_us(lambda: dst.copy_(src)) for _ in range(3))[1]
    calls = GRAPH_CALLS if out_bytes <= GRAPH_CALLS_BYTES else 1
    impls = {"segfuse": (lambda: eng.run(f, ins), lambda: deferred.run(f, ins),
                         lambda: eng.kernel_time_us(f, ins, reps=50), prep.kernels if prep else None)}
    op = sft.fusion(f)  # the same kernels inside the caller's CUDA graph, timed as torch's rows are
    sg = graph_of(lambda: op(**t_ins))
    impls["segfuse.torch in a CUDA graph"] = (sg.replay, sg.replay, replay_us(lambda: op(**t_ins), calls),
                                              prep.kernels if prep else None)
    eager = lambda: torch_norm(kind, t_ins)  # noqa: E731
    g = graph_of(eager)
    eager_gpu = replay_us(eager, calls)
    impls["torch eager"] = (eager, eager, eager_gpu, torch_launches(eager))
    impls["torch + CUDA graph"] = (g.replay, g.replay, eager_gpu, None)  # (the same kernels, replayed)
    if os.environ.get("SEGFUSE_NORM_COMPILE", "1") != "0":
        # A fresh Dynamo for each workload: it caches compiled code by the function's code object, and
        # past its recompile limit (8) it silently runs the function eagerly (the 22:23 UTC run's
        # torch.compile rows after the first 8 compiles were eager's)
        torch._dynamo.reset()
        for mode in env_list("SEGFUSE_COMPILE_MODES", ["default", "reduce-overhead"]):
            c = torch.compile(lambda ti: torch_norm(kind, ti), mode=None if mode == "default" else mode, dynamic=False)
            fn = lambda c=c: c(t_ins)  # noqa: E731
            fn()
            gpu = replay_us(fn, calls) if mode == "default" else float("nan")
            impls[f"torch.compile {mode}"] = (fn, fn, gpu, torch_launches(fn) if mode == "default" else None)
        stop_compile_workers()
    base = measure(rows, name, impls, samples, 30, **{"copy limit us": copy_us, "graph calls": calls})
    s, sg_row = base["segfuse"], base["segfuse.torch in a CUDA graph"]
    s["vs copy limit"] = s["gpu us"] / copy_us
    out = {f"{name} gpu us": s["gpu us"], f"{name} / copy limit": s["vs copy limit"]}
    for other in ("torch eager", "torch.compile default"):
        if other in base:  # like for like: both in a CUDA graph, timed the same way
            out[f"{name} in a CUDA graph, vs {other}"] = base[other]["gpu us"] / sg_row["gpu us"]
    return out


def run(rows, samples):
    summary = {}
    kinds = env_list("SEGFUSE_NORM_KINDS", ["softmax", "log_softmax", "rmsnorm", "layernorm"])
    dtypes = env_list("SEGFUSE_NORM_DTYPES", ["float32", "bfloat16"])
    shapes = [tuple(int(x) for x in s.split("x")) for s in env_list("SEGFUSE_NORM_SHAPES", [])] or SHAPES
    for kind in kinds:
        for dtype in dtypes:
            for R, D in shapes:
                summary.update(bench_one(rows, kind, dtype, R, D, samples))
                print(rows[-1]["bench"], {r["impl"]: round(r["gpu us"], 1) for r in rows if r["bench"] == rows[-1]["bench"]},
                      flush=True)
    return summary
