"""Row normalizations written as graphs (issue 20), for `python benchmarks/bench_gpu.py --only norm`:
softmax, log_softmax, RMSNorm and LayerNorm (tests/norm_graphs.py) at [32768, 4096], [32768, 8192],
[8, 4096], [8, 8192], float32 and bfloat16, against torch eager, torch + CUDA graph, torch.compile
(default and reduce-overhead) and the copy-bandwidth limit (a device-to-device copy moving the
input bytes + output bytes), measured in the same run in three modes:

- per call: one call, then a synchronize (CUDA events around the call, host work included);
- pipelined: PIPE calls back to back, one synchronize at the end, wall time per call
  (segfuse with errors="deferred", as a serving loop runs it);
- GPU time: kernels only (segfuse's `kernel_time_us`; torch's CUDA-graph replays with the stream
  held first, so the events see the kernels back to back; the copy's events likewise).

Environment knobs (to fit a short lease): SEGFUSE_NORM_KINDS, SEGFUSE_NORM_SHAPES ("32768x4096,8x4096"),
SEGFUSE_NORM_DTYPES, SEGFUSE_NORM_COMPILE=0 (skip torch.compile, whose compiles take most of the time).
"""

from __future__ import annotations

import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))

PIPE = 200
SHAPES = [(32768, 4096), (32768, 8192), (8, 4096), (8, 8192)]


def _env_list(name, default):
    v = os.environ.get(name)
    return default if not v else v.split(",")


def _pipelined_us(fn, calls=PIPE) -> float:
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def _held_events_us(fn, reps=50) -> float:
    """GPU time of `fn` (which only enqueues work, e.g. a graph replay) with the stream held first."""
    import torch

    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    host = time.perf_counter() - t0
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(int((host * 2 + 2e-3) * 2e9))
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) * 1000.0 / reps


def _graph_of(fn):
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def _torch_launches(fn) -> int:
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def bench_one(rows, kind, dtype, R, D, samples):
    import cupy as cp
    import ml_dtypes
    import numpy as np
    import torch
    from norm_graphs import norm_graph, norm_inputs, torch_norm
    from segfuse.compiler.cuda.runtime import get_runtime
    from segfuse.compiler.engine import Engine

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
    rt = get_runtime()
    prep = rt.prepared_for(f, ins)
    name = f"{kind} [{R}, {D}] {dtype}"
    out_bytes = R * D * (4 if dtype == "float32" else 2)
    in_bytes = sum(int(np.prod(v.shape)) * v.dtype.itemsize for v in ins.values())
    src = torch.empty((in_bytes + out_bytes) // 2, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_us = _held_events_us(lambda: dst.copy_(src))
    impls = {"segfuse": (lambda: eng.run(f, ins), lambda: deferred.run(f, ins), rt.kernel_time_us(f, ins, reps=50),
                         prep.kernels if prep else None)}
    eager = lambda: torch_norm(kind, t_ins)  # noqa: E731
    g = _graph_of(eager)
    impls["torch eager"] = (eager, eager, _held_events_us(g.replay), _torch_launches(eager))
    impls["torch + CUDA graph"] = (g.replay, g.replay, _held_events_us(g.replay), None)
    if os.environ.get("SEGFUSE_NORM_COMPILE", "1") != "0":
        for mode in ("default", "reduce-overhead"):
            c = torch.compile(lambda ti: torch_norm(kind, ti), mode=None if mode == "default" else mode, dynamic=False)
            fn = lambda c=c: c(t_ins)  # noqa: E731
            fn()
            gpu = _held_events_us(_graph_of(fn).replay) if mode == "default" else float("nan")
            impls[f"torch.compile {mode}"] = (fn, fn, gpu, _torch_launches(fn) if mode == "default" else None)
    base = {}
    for impl, (call, pipe, gpu_us, launches) in impls.items():
        per_call = float(np.median(samples(call, reps=30, warm=5)))
        row = {"bench": name, "impl": impl, "us": per_call, "pipelined us": _pipelined_us(pipe),
               "gpu us": gpu_us, "copy limit us": copy_us, "launches": launches}
        base[impl] = row
        rows.append(row)
    s = base["segfuse"]
    for impl, row in base.items():
        if impl != "segfuse":
            row["speedup"] = row["gpu us"] / s["gpu us"] if s["gpu us"] else float("nan")
    s["vs copy limit"] = s["gpu us"] / copy_us
    return {f"{name} gpu us": s["gpu us"], f"{name} / copy limit": s["vs copy limit"]}


def run(rows, samples):
    summary = {}
    kinds = _env_list("SEGFUSE_NORM_KINDS", ["softmax", "log_softmax", "rmsnorm", "layernorm"])
    dtypes = _env_list("SEGFUSE_NORM_DTYPES", ["float32", "bfloat16"])
    shapes = [tuple(int(x) for x in s.split("x")) for s in _env_list("SEGFUSE_NORM_SHAPES", [])] or SHAPES
    for kind in kinds:
        for dtype in dtypes:
            for R, D in shapes:
                summary.update(bench_one(rows, kind, dtype, R, D, samples))
                print(rows[-1]["bench"], {r["impl"]: round(r["gpu us"], 1) for r in rows if r["bench"] == rows[-1]["bench"]},
                      flush=True)
    return summary
