"""The three ways a serving stack calls GPU work, measured alike for segfuse and its alternatives
(benchmarks/bench_norms.py, benchmarks/bench_prologue.py): per call (a call, then a synchronize),
pipelined (PIPE calls back to back, one synchronize at the end, wall time per call; the median of
PIPE_ROUNDS rounds, taken in turns) and GPU time
(work that only enqueues, such as a CUDA-graph replay, timed by CUDA events with the stream held
first, so the events see the kernels back to back, not the host's launch cost; the median of
GPU_ROUNDS rounds, taken in turns as well, for each implementation that gives its GPU time as a
function)."""

from __future__ import annotations

import json
import os
import time

PIPE = 200
PIPE_ROUNDS = int(os.environ.get("SEGFUSE_PIPE_ROUNDS", "5"))
# GPU time moves by a few percent between minutes and processes on the H200 (torch.compile's own
# RMSNorm kernel: 250.7 to 263.6 us on 2026-12-02), so GPU times are taken in turns too
GPU_ROUNDS = int(os.environ.get("SEGFUSE_GPU_ROUNDS", "7"))


def measure(rows: list, bench: str, impls: dict, samples, reps: int, **extra) -> dict:
    """Time each implementation in the three modes and append its row: `impls` maps a name to
    (call, pipelined call, GPU us, launches); `samples(fn, reps, warm)` gives per-call times (host
    work and a synchronize included). Pipelined times are the median of PIPE_ROUNDS rounds, the
    implementations taking turns in each round, so a slow phase of the host (the H200 machine's
    varies by 1.5x from minute to minute) weighs on all of them alike. "GPU us" given as a function
    (returning us) is the median of GPU_ROUNDS rounds taken the same way, with its smallest and
    largest in "gpu us min"/"gpu us max". `speedup`: the row's GPU time over segfuse's. Returns the
    rows by implementation."""
    import numpy as np

    base = {}
    for impl, (call, _pipe, gpu_us, launches) in impls.items():
        base[impl] = {"bench": bench, "impl": impl, "us": float(np.median(samples(call, reps=reps, warm=5))),
                      "pipelined us": None, "gpu us": None if callable(gpu_us) else gpu_us, **extra,
                      "launches": launches}
    rounds = {impl: [] for impl in impls}
    for _ in range(PIPE_ROUNDS):
        for impl, (_call, pipe, _gpu, _launches) in impls.items():
            rounds[impl].append(pipelined_us(pipe))
    timed = {impl: [] for impl, v in impls.items() if callable(v[2])}
    for _ in range(GPU_ROUNDS if timed else 0):
        once: dict = {}  # a timer shared by two rows (torch eager and its graph replay) runs once a round
        for impl in timed:
            fn = impls[impl][2]
            if id(fn) not in once:
                once[id(fn)] = fn()
            timed[impl].append(once[id(fn)])
    for impl, row in base.items():
        row["pipelined us"] = float(np.median(rounds[impl]))
        if impl in timed:
            row["gpu us"] = float(np.median(timed[impl]))
            row["gpu us min"], row["gpu us max"] = float(min(timed[impl])), float(max(timed[impl]))
        rows.append(row)
    s = base["segfuse"]
    for impl, row in base.items():
        if impl != "segfuse":
            row["speedup"] = row["gpu us"] / s["gpu us"] if s["gpu us"] else float("nan")
        # each row as soon as it is measured: a time limit may end the process before its JSON
        print("row:", json.dumps(row, default=str), flush=True)
    return base


def env_list(name, default):
    v = os.environ.get(name)
    return default if not v else v.split(",")


def pipelined_us(fn, calls=PIPE) -> float:
    """Wall time per call of `calls` calls back to back, one synchronize at the end."""
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


def held_events_us(fn, reps=50) -> float:
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


def graph_of(fn, calls: int = 1):
    """A torch.cuda.CUDAGraph capturing `calls` calls of `fn` (after three warm-up calls on a side
    stream)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    return g


def replay_us(fn, calls: int = 1):
    """A function giving the GPU time of one call of `fn` inside a CUDA graph of `calls` calls,
    the graph's replays back to back (`held_events_us`): with `calls` > 1 a kernel of a few
    microseconds is timed the way a model's graph runs it (between other kernels of the same
    graph), not behind a graph launch of its own."""
    g = graph_of(fn, calls)
    return lambda: held_events_us(g.replay) / calls


class Launches:
    """Kernels (and copies) one call of a torch callable runs on the GPU, counted by torch's profiler
    only once the process's timing is done (`count_launches`): the profiler leaves CUPTI running
    after it ends (pytorch/pytorch#144455), which made every later CUDA launch of the process
    slower (torch eager's pipelined T = 1 prologue took 344 us in bench_gpu of 16:03 UTC
    2026-12-02 against 146 us without the profiler; segfuse's 11-16 us against 8)."""

    def __init__(self, fn):
        self.fn, self.count = fn, None
        _LATER.append(self)

    def __str__(self) -> str:
        return str(self.count) if self.count is not None else "(counted last)"

    __repr__ = __str__


_LATER: list = []


def torch_launches(fn) -> Launches:
    """The launch count of `fn`, for a row's "launches" (see `Launches`)."""
    return Launches(fn)


def count_launches(rows: list) -> None:
    """Count every pending `Launches` with torch's profiler and put the numbers into `rows`
    (call it after the last timing of the process: later launches run slower)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for later in _LATER:
        try:
            later.fn()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                later.fn()
                torch.cuda.synchronize()
            later.count = sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)
        except Exception as e:  # a count is not worth the run's JSON: a torch.compile function whose
            # compile a time limit interrupted recompiled here into Inductor's closed worker pool (2026-12-06 17:21 UTC)
            print(f"launch count failed: {type(e).__name__}: {e}", flush=True)
        later.fn = None  # (its inputs can go)
    _LATER.clear()
    for r in rows:
        if isinstance(r.get("launches"), Launches):
            r["launches"] = r["launches"].count


def stop_compile_workers() -> None:
    """Shut Inductor's compile worker processes down before timing (a later compile starts them
    again), so that only the timed work runs on the host: the T = 1 prologue, bound by the host,
    pipelined at 8.0 us a call in the run with torch.compile's workers alive against 6.1 us in the
    run without torch.compile (2026-12-02 17:10 and 16:14 UTC; whether the workers or the lent
    host made that difference was not measured). Nothing in the timing needs them."""
    try:
        from torch._inductor.async_compile import shutdown_compile_workers
    except ImportError:  # (an older torch: nothing to stop)
        return
    shutdown_compile_workers()
