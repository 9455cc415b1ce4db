"""Code-generator variants of the row kernels against torch.compile in ONE process (issue 20):
norm_variants.py runs a variant per process, and the H200's GPU time moves by about 3% between
processes, more than the gaps left at a few shapes. Here every variant (norm_variants.py's
NORM_* knobs, applied while its fusion is planned and compiled, then undone; NORM_SPLIT_MIN=N sets
limits.ROW_SPLIT_MIN_LENGTH) is its own fusion (renamed, so it plans and compiles apart), called
through segfuse.torch inside a CUDA graph, timed exactly like torch.compile's graph (default mode):
the graphs' replays in turns over AB_ROUNDS rounds, each round every implementation once
(modes.replay_us: AB_CALLS calls to a graph where the output is at most 32 MiB, else one).

Prints, per workload and implementation: launch shape, median / min / max us a call, and the
paired ratio torch.compile / variant (its median over the rounds, and in how many rounds >= 1).
Every variant's output is checked against torch's first.
`VARIANTS="default NORM_PER_SMALL=8" python benchmarks/norm_ab.py rmsnorm:bfloat16:8x4096 ...`"""

from __future__ import annotations

import contextlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
sys.path.insert(0, HERE)

KNOBS = ("NORM_PER", "NORM_PER_SMALL", "NORM_FASTEXP", "NORM_WEIGHTS", "NORM_MIN_THREADS", "NORM_ROWS_PER_SM",
         "NORM_ONE_BARRIER", "NORM_CACHE", "NORM_SPLIT", "NORM_HINTS", "NORM_SPLIT_MIN", "NORM_LEAD", "NORM_WIDE",
         "NORM_BFLY", "NORM_LATE_W")


def _state():
    """Everything norm_variants._patch may change, to put back after a variant."""
    from segfuse.compiler import limits
    from segfuse.compiler.codegen import row_reduction, segment
    from segfuse.compiler.ops import REGISTRY
    from segfuse.compiler.segmenter import pipeline

    cls = row_reduction.RowReductionKernels
    attrs = [(row_reduction, "row_threads"), (pipeline, "row_threads"), (row_reduction, "ROW_REGISTER_WEIGHTS"),
             (row_reduction, "ROW_MIN_RESIDENT_THREADS"), (row_reduction, "ROW_MIN_RESIDENT_THREADS_2BYTE"),
             (row_reduction, "BLOCK_ROWS_PER_SM"), (row_reduction, "ROW_LOAD_HINTS"), (row_reduction, "ROW_SPLIT_MAX"),
             (row_reduction, "ROW_ONE_BARRIER"), (row_reduction, "ROW_WIDE_2BYTE_VECTORS"),
             (row_reduction, "ROW_REDUCE_BUTTERFLY"), (row_reduction, "ROW_WEIGHTS_AFTER_ROW"), (segment, "PRELUDE"), (cls, "_register_load"),
             (cls, "_row_stores_registers"), (limits, "ROW_SPLIT_MIN_LENGTH")]
    missing = object()
    saved = [(obj, name, obj.__dict__.get(name, missing) if isinstance(obj, type) else getattr(obj, name))
             for obj, name in attrs]
    return saved + [(REGISTRY["exp"], "cuda", REGISTRY["exp"].cuda)], missing


def _restore(saved, missing) -> None:
    for obj, name, value in saved:
        if value is missing:  # (a class attribute the variant added)
            if name in obj.__dict__:
                delattr(obj, name)
        elif isinstance(obj, type) or not hasattr(obj, "__dataclass_fields__"):
            setattr(obj, name, value)
        else:
            object.__setattr__(obj, name, value)  # (the registry's ops are frozen dataclasses)


@contextlib.contextmanager
def variant(spec: str):
    """norm_variants.py's knobs of `spec` ("default" or "A=1+B=2") in force inside the block."""
    import norm_variants
    from segfuse.compiler import limits

    (saved, missing), env = _state(), {k: os.environ.pop(k) for k in KNOBS if k in os.environ}
    knobs = dict(kv.split("=", 1) for kv in spec.split("+")) if spec != "default" else {}
    os.environ.update({k: v for k, v in knobs.items() if k != "NORM_SPLIT_MIN"})
    try:
        norm_variants._patch()
        if "NORM_SPLIT_MIN" in knobs:
            limits.ROW_SPLIT_MIN_LENGTH = int(knobs["NORM_SPLIT_MIN"])
        yield
    finally:
        _restore(saved, missing)
        for k in knobs:
            os.environ.pop(k, None)
        os.environ.update(env)


def main(argv):
    import numpy as np
    import segfuse.torch as sft
    import torch
    from modes import replay_us, stop_compile_workers
    from norm_graphs import norm_graph, norm_inputs, torch_norm
    from segfuse.compiler.cuda.prepare import modules_without_device
    from segfuse.compiler.ir import Fusion
    from segfuse.compiler.segmenter.cache import PlanCache

    variants = os.environ.get("VARIANTS", "default").split()
    rounds, calls_small = int(os.environ.get("AB_ROUNDS", "9")), int(os.environ.get("AB_CALLS", "20"))
    sm = torch.cuda.get_device_properties(0).multi_processor_count
    for spec in argv:
        kind, dtype, shape = spec.split(":")
        R, D = (int(v) for v in shape.split("x"))
        base = norm_graph(kind, dtype)
        host = norm_inputs(kind, R, D, dtype, seed=1)
        tdt = torch.float32 if dtype == "float32" else torch.bfloat16
        t_ins = {k: torch.from_numpy(np.asarray(v).astype(np.float32)).to(tdt).cuda() for k, v in host.items()}
        want = torch_norm(kind, t_ins).float()
        calls = calls_small if R * D * (4 if dtype == "float32" else 2) <= 32 << 20 else 1
        tol = 2e-2 if dtype == "bfloat16" else 1e-4
        timers, launch = {}, {}
        for i, v in enumerate(variants):
            with variant(v):
                f = Fusion.from_json({**base.to_json(), "name": f"{base.name}_ab{i}"})
                b = f.bind({k: tuple(t.shape) for k, t in t_ins.items()})
                plan = PlanCache().get(f, b)[0]
                launch[v] = "; ".join(f"grid {la.grid} x {la.block}" for _, m in modules_without_device(f, plan, b, sm)
                                      for la in m.launches if la.vector_of is None) or "-"
                op = sft.fusion(f)
                got = op(**t_ins).float()
                assert torch.allclose(got, want, rtol=tol, atol=tol, equal_nan=True), f"{spec} [{v}] differs from torch"
                timers[v] = replay_us(lambda op=op, t_ins=t_ins: op(**t_ins), calls)
        torch._dynamo.reset()
        compiled = torch.compile(lambda ti, kind=kind: torch_norm(kind, ti), dynamic=False)
        compiled(t_ins)
        stop_compile_workers()
        timers["torch.compile"] = replay_us(lambda c=compiled, t_ins=t_ins: c(t_ins), calls)
        times = {k: [] for k in timers}
        for _ in range(rounds):
            for k, fn in timers.items():
                times[k].append(fn())
        tc = np.array(times["torch.compile"])
        print(f"{spec} ({calls} calls a graph, {rounds} rounds)", flush=True)
        for k, ts in times.items():
            ts = np.array(ts)
            line = f"  {k:28s} median {np.median(ts):8.2f} us  min {ts.min():8.2f}  max {ts.max():8.2f}"
            if k != "torch.compile":
                ratios = tc / ts
                line += (f"  vs torch.compile {np.median(ratios):.3f}x (paired; >= 1 in {int((ratios >= 1).sum())}"
                         f"/{rounds})  [{launch[k]}]")
            print(line, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
