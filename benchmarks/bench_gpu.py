"""GPU benchmarks: segfuse (CuPy backend) against torch eager, torch.compile and CuPy, in one run.

    python benchmarks/bench_gpu.py            # writes benchmarks/out/bench_gpu.{json,md}, prints the table

Times are CUDA-event means of 20 calls (100 for the MoE rows) after 3 warm-ups around the whole call (host work
included), like /work/shared/reference/h200-baselines.md; the garbage collector is paused while calls are timed.
The chain's and the MoE rows' implementations are timed in alternating rounds (see `interleaved`).
"""
# ruff: noqa: B023  (benchmark lambdas are timed inside the loop iteration that defines them)

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

REPS, WARM = 20, 3
MOE_REPS = 100  # small calls: more repetitions, same for every implementation
MOE_ROUNDS = 5  # ... taken in alternating rounds (see interleaved)
CHAIN_ROUNDS = 4  # the chain's implementations alternate too (5 calls a round)
ROUND_WARM = 10  # untimed calls at the start of each round


def timeit(fn, reps=REPS, warm=WARM):
    """Mean CUDA-event time of `fn` over `reps` calls (see samples)."""
    return float(np.mean(samples(fn, reps, warm)))


def samples(fn, reps=REPS, warm=WARM) -> list:
    """CUDA-event times (us) of `reps` calls of `fn`, each from an event recorded before the call to
    one recorded after it returned (host work included). Python's garbage collector is paused
    during the timed calls, for every implementation alike (as the standard library's timeit
    does): one collection of the benchmark's heap costs about a millisecond, which would land on
    whichever call it interrupts."""
    import cupy as cp
    import torch

    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    cp.cuda.Device().synchronize()
    a, b = cp.cuda.Event(), cp.cuda.Event()
    ts = []
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for _ in range(reps):
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(cp.cuda.get_elapsed_time(a, b) * 1000.0)
    finally:
        if was_enabled:
            gc.enable()
    torch.cuda.synchronize()
    return ts


def interleaved(fns: dict, reps=MOE_REPS, rounds=MOE_ROUNDS) -> dict:
    """{name: (mean, median)} over `reps` calls of each function, taken in `rounds` alternating
    rounds (A B C, A B C, ...), so that the host's drift over seconds (these calls last 10-200 us
    and this machine's Python speed moves by a third between minutes) lands on every implementation
    alike instead of on whichever was timed during a slow stretch. Each round starts with
    ROUND_WARM untimed calls. (Means sit 30-50% above medians for every implementation with 3 or
    10 of them, 15-20% in runs without rounds: occasional slow calls, not the first ones.)"""
    got = {k: [] for k in fns}
    for _ in range(rounds):
        for k, fn in fns.items():
            got[k] += samples(fn, reps // rounds, warm=ROUND_WARM)
    return {k: (float(np.mean(v)), float(np.median(v))) for k, v in got.items()}


def graph(name, inputs, ops, outputs):
    from segfuse.compiler.ir import Fusion

    return Fusion.from_json({"format": "segfuse.fusion/1", "name": name, "inputs": inputs, "ops": ops,
                             "outputs": outputs})


def bench_chain(rows, n=2**28):
    import cupy as cp
    import torch
    from segfuse.compiler.engine import Engine

    f = graph("chain", [{"name": x, "dtype": "float32", "shape": ["N"]} for x in "abc"],
              [{"op": "gt", "out": "p", "inputs": ["a", 0]}, {"op": "mul", "out": "ab", "inputs": ["a", "b"]},
               {"op": "add", "out": "abc", "inputs": ["ab", "c"]}, {"op": "exp", "out": "e", "inputs": ["c"]},
               {"op": "mul", "out": "h", "inputs": ["e", 0.5]}, {"op": "where", "out": "o", "inputs": ["p", "abc", "h"]}],
              ["o"])
    eng = Engine("cupy")
    rng = cp.random.default_rng(0)
    a, b, c = (rng.standard_normal(n, dtype=cp.float32) for _ in range(3))
    ta, tb, tc = (torch.as_tensor(x, device="cuda") for x in (a, b, c))
    out = eng.run(f, {"a": a, "b": b, "c": c}).outputs["o"]
    ref = torch.where(ta > 0, ta * tb + tc, torch.exp(tc) * 0.5)
    assert torch.allclose(torch.as_tensor(out, device="cuda"), ref, rtol=1e-5, atol=1e-6)
    k_us = eng.kernel_time_us(f, {"a": a, "b": b, "c": c})
    prep = eng.prepared(f, {"a": a, "b": b, "c": c})
    rows.append({"bench": "elementwise chain 2^28 f32", "impl": "segfuse kernels only", "us": k_us,
                 "TB/s": 4 * n * 4 / 1e9 / (k_us * 1e-6) / 1e3, "launches": prep.kernels, "plan": _plan_desc(prep)})
    from segfuse.compiler.codegen import segment as segmod
    from segfuse.compiler.segmenter.cache import PlanCache

    saved = segmod.VEC_BLOCKS_PER_SM
    for per_sm in (64, 1024, 1 << 20):  # launch-geometry variants of the same kernel, for the record
        segmod.VEC_BLOCKS_PER_SM = per_sm
        # (a plan cache of its own: a new plan, so a preparation of its own, generated now)
        kv = Engine("cupy", plan_cache=PlanCache()).kernel_time_us(f, {"a": a, "b": b, "c": c})
        rows.append({"bench": "elementwise chain 2^28 f32", "impl": f"segfuse kernels only, {per_sm} blocks/SM",
                     "us": kv, "TB/s": 4 * n * 4 / 1e9 / (kv * 1e-6) / 1e3})
    segmod.VEC_BLOCKS_PER_SM = saved

    def te():
        return torch.where(ta > 0, ta * tb + tc, torch.exp(tc) * 0.5)

    tcomp = torch.compile(te)
    t0 = time.perf_counter()
    tcomp()
    torch.cuda.synchronize()
    first = time.perf_counter() - t0
    ek = cp.ElementwiseKernel("float32 a, float32 b, float32 c", "float32 o",
                              "o = a > 0 ? a * b + c : expf(c) * 0.5f", "chain_ek")
    st = interleaved({"seg": lambda: eng.run(f, {"a": a, "b": b, "c": c}), "eager": te, "comp": tcomp,
                      "cupy": lambda: cp.where(a > 0, a * b + c, cp.exp(c) * 0.5), "ek": lambda: ek(a, b, c)},
                     reps=REPS, rounds=CHAIN_ROUNDS)
    t_seg, t_eager, t_comp, t_cupy, t_ek = (st[k][0] for k in ("seg", "eager", "comp", "cupy", "ek"))
    gb = 4 * n * 4 / 1e9
    for impl, t in (("segfuse", t_seg), ("torch eager", t_eager), ("torch.compile", t_comp), ("CuPy eager", t_cupy),
                    ("CuPy ElementwiseKernel", t_ek)):
        rows.append({"bench": "elementwise chain 2^28 f32", "impl": impl, "us": t, "TB/s": gb / (t * 1e-6) / 1e3})
    rows.append({"bench": "elementwise chain 2^28 f32", "impl": "torch.compile first call", "us": first * 1e6})
    return {"chain_vs_compile": t_comp / t_seg, "chain_vs_eager": t_eager / t_seg}


def bench_scatter(rows, bins, n=2**26):
    import cupy as cp
    import cupyx
    import torch
    from segfuse.compiler.engine import Engine

    f = graph("hist", [{"name": "dst", "dtype": "float32", "shape": ["M"]},
                       {"name": "i", "dtype": "int64", "shape": ["N"]}, {"name": "v", "dtype": "float32", "shape": ["N"]}],
              [{"op": "scatter", "out": "o", "inputs": ["dst", "i", "v"], "dim": 0, "reduce": "add"}], ["o"])
    eng = Engine("cupy")
    rng = cp.random.default_rng(1)
    idx = rng.integers(0, bins, n, dtype=cp.int64)
    src = rng.standard_normal(n, dtype=cp.float32)
    dst = cp.zeros(bins, cp.float32)
    tdst, tidx, tsrc = (torch.as_tensor(x, device="cuda") for x in (dst, idx, src))
    out = eng.run(f, {"dst": dst, "i": idx, "v": src}).outputs["o"]
    ref = torch.zeros(bins, device="cuda").scatter_add_(0, tidx, tsrc)
    assert torch.allclose(torch.as_tensor(out, device="cuda"), ref, rtol=1e-3, atol=1e-2)
    t_seg = timeit(lambda: eng.run(f, {"dst": dst, "i": idx, "v": src}))
    k_us = eng.kernel_time_us(f, {"dst": dst, "i": idx, "v": src})
    prep = eng.prepared(f, {"dst": dst, "i": idx, "v": src})
    t_eager = timeit(lambda: tdst.clone().scatter_add_(0, tidx, tsrc))

    def tc_fn(d, i, s):
        return d.clone().scatter_add_(0, i, s)

    tcomp = torch.compile(tc_fn)
    tcomp(tdst, tidx, tsrc)
    t_comp = timeit(lambda: tcomp(tdst, tidx, tsrc))

    def cpx():
        d = dst.copy()
        cupyx.scatter_add(d, idx, src)
        return d

    t_cupy = timeit(cpx)
    name = f"scatter-add 2^26 f32 -> {bins} bins"
    rows.append({"bench": name, "impl": "segfuse kernels only", "us": k_us, "launches": prep.kernels,
                 "plan": _plan_desc(prep)})
    for impl, t in (("segfuse", t_seg), ("torch eager", t_eager), ("torch.compile", t_comp), ("cupyx.scatter_add", t_cupy)):
        rows.append({"bench": name, "impl": impl, "us": t})
    return {f"scatter_{bins}_vs_eager": t_eager / t_seg}


def _torch_moe(kind, ids, counts, E, K):
    import torch

    if kind == "moe_problem_sizes":
        flat = ids.flatten()
        return torch.zeros(E, dtype=torch.int64, device="cuda").scatter_add_(0, flat.long(), torch.ones_like(flat, dtype=torch.int64))
    if kind == "moe_expert_offsets":
        return torch.nn.functional.pad(torch.cumsum(counts, 0), (1, 0))
    if kind == "moe_blockscale_offsets":
        a = torch.nn.functional.pad(torch.cumsum(counts, 0), (1, 0))
        b = torch.nn.functional.pad(torch.cumsum((counts + 127) // 128 * 128, 0), (1, 0))
        return a, b
    order = torch.argsort(ids.flatten(), dim=0, descending=True, stable=True)
    inp = order // K
    outp = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device="cuda"))
    return inp, outp


def bench_moe(rows, E=256, K=8):
    import cupy as cp
    import torch
    from segfuse.compiler.engine import Engine
    from segfuse.compiler.ir import Fusion
    from workloads import moe_graphs

    eng = Engine("cupy")
    lazy = Engine("cupy", errors="deferred")  # device errors raised by a later call, as torch's
    ratios = {}
    for idt in ("int64", "int32"):
        for g, mk in moe_graphs(E=E, K=K, idt=idt):
            f = Fusion.from_json(g)
            for T in (1, 128, 4096, 65536):
                ins = {k: cp.asarray(v) for k, v in mk(T)(np.random.default_rng(T)).items()}
                tins = {k: torch.as_tensor(v, device="cuda") for k, v in ins.items()}
                res = eng.run(f, ins)
                eng.run(f, ins)  # the second call with this signature sets up the fast path
                ids = tins.get("topk_ids")
                counts = tins.get("tokens_per_expert")
                prep = eng.prepared(f, ins)
                fns = {"seg": lambda: eng.run(f, ins), "eager": lambda: _torch_moe(g["name"], ids, counts, E, K)}
                if prep.may_fail:  # a plan that checks data: also with errors="deferred"
                    lazy.run(f, ins)
                    lazy.run(f, ins)
                    fns["lazy"] = lambda: lazy.run(f, ins)
                stats = interleaved(fns)
                lazy.synchronize()
                (t_eager, p50_eager) = stats["eager"]
                k_us = eng.kernel_time_us(f, ins)
                name = f"{g['name']} T={T} {idt}"
                for key, impl in (("seg", "segfuse Engine.run"), ("lazy", "segfuse Engine.run, errors='deferred'")):
                    if key not in stats:
                        continue
                    t, p50 = stats[key]
                    rows.append({"bench": name, "impl": impl, "us": t, "torch eager us": t_eager,
                                 "speedup": t_eager / t, "p50 us": p50, "torch eager p50 us": p50_eager,
                                 "p50 speedup": p50_eager / p50, "launches": prep.kernels, "kernel us": k_us,
                                 "host overhead us": t - k_us, "plan": _plan_desc(prep),
                                 "fallbacks": "; ".join(prep.fallbacks)})
                    tag = f"{g['name']}_T{T}_{idt}" + ("_deferred" if key == "lazy" else "")
                    ratios[tag] = t_eager / t
                    ratios[tag + "_p50"] = p50_eager / p50
                if T in (128, 4096):  # the multi-launch lowering, for comparison
                    split = _split_engine()
                    split.run(f, ins)
                    rows.append({"bench": name, "impl": "segfuse, one launch per anchor",
                                 "us": timeit(lambda: split.run(f, ins)), "torch eager us": t_eager})
                _ = res
    return ratios


_SPLIT = []


class _SplitPlans:
    """A plan cache whose plans are the reference planner's one launch per anchor."""

    def __init__(self):
        self.plans = {}

    def get(self, fusion, bound):
        from segfuse.compiler.segmenter.reference import simple_plan

        key = (fusion.id, tuple(sorted(bound.env.items())))
        hit = key in self.plans
        if not hit:
            self.plans[key] = simple_plan(fusion, dict(bound.types), small=-1)
        return self.plans[key], hit


def _split_engine():
    from segfuse.compiler.engine import Engine

    if not _SPLIT:
        _SPLIT.append(Engine("cupy", plan_cache=_SplitPlans()))
    return _SPLIT[0]


def _plan_desc(prep) -> str:
    if prep is None:
        return "?"
    return ", ".join(f"{getattr(s.seg.kind, 'value', s.seg.kind)}:{s.kind}" for s in prep.steps)


def bench_compile_and_overhead(rows):
    import cupy as cp
    from segfuse.compiler.engine import Engine

    eng = Engine("cupy")
    eng.start()  # (the runtime: NVRTC's one-time start runs in the background from here)
    backend = eng.device_backend
    f = graph("tiny", [{"name": "x", "dtype": "float32", "shape": [1024]}],
              [{"op": "mul", "out": "y", "inputs": ["x", 2.0]}, {"op": "add", "out": "z", "inputs": ["y", 1.0]}], ["z"])
    from segfuse.compiler.codegen.segment import generate
    from segfuse.compiler.plan import Segment, SegmentKind

    types = f.bind({"x": (1024,)}).types
    mod = generate(f, Segment(0, SegmentKind.pointwise, [0, 1], ["x"], ["z"], "bench"), types)
    backend.compiler_ready(30)  # NVRTC's one-time start runs in the background from runtime creation
    first = backend.compile_stats()["first_compile_s"]
    if first is not None:
        rows.append({"bench": "first NVRTC compile in a process (one-time start; a server does it at start-up)",
                     "impl": "segfuse", "us": first * 1e6})
    colds = []
    for _ in range(3):
        src = mod.source + f"\n// cold-compile nonce {time.time_ns()}\n"
        t0 = time.perf_counter()
        m = backend.load_module(src)
        m.get_function(mod.launches[0].kernel)
        colds.append((time.perf_counter() - t0) * 1e6)
    cold = max(colds)
    rows.append({"bench": "cold compile of one new kernel (NVRTC + load), worst of 3", "impl": "segfuse", "us": cold})
    x = cp.ones(1024, cp.float32)
    eng.run(f, {"x": x})
    t_call = timeit(lambda: eng.run(f, {"x": x}), reps=200)
    t_k = eng.kernel_time_us(f, {"x": x}, reps=200)
    rows.append({"bench": "run on a cache hit (1024 elements)", "impl": "segfuse Engine.run", "us": t_call,
                 "kernel us": t_k, "host overhead us": t_call - t_k})
    k = cp.ElementwiseKernel("float32 x", "float32 z", "z = x * 2.0f + 1.0f", "cupy_tiny")
    k(x)
    rows.append({"bench": "run on a cache hit (1024 elements)", "impl": "CuPy ElementwiseKernel (launch only, no sync)",
                 "us": timeit(lambda: k(x), reps=200)})
    return {"cold_compile_us": cold, "host_overhead_us": t_call - t_k}


def table(rows) -> str:
    keys = ["bench", "impl", "us", "pipelined us", "gpu us", "gpu us min", "gpu us max", "graph calls", "copy limit us", "vs copy limit", "TB/s", "torch eager us", "speedup", "p50 us", "torch eager p50 us", "p50 speedup",
            "launches", "kernel us", "host overhead us", "plan", "fallbacks"]
    used = [k for k in keys if any(k in r for r in rows)]
    out = ["| " + " | ".join(used) + " |", "|" + " --- |" * len(used)]
    for r in rows:
        cells = []
        for k in used:
            v = r.get(k, "")
            cells.append(f"{v:.1f}" if isinstance(v, float) and "speedup" not in k else
                         (f"{v:.2f}x" if isinstance(v, float) else str(v)))
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main():
    import bench_norms  # (benchmarks/: row normalizations, --only norm)
    import bench_prologue  # (the whole MoE prologue in three modes, --only prologue)

    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="chain,scatter,moe,compile",
                    help="comma-separated: chain, scatter, moe, compile, norm (row normalizations, bench_norms.py), "
                         "prologue (the whole MoE prologue, bench_prologue.py)")
    args = ap.parse_args()
    import cupy as cp
    import torch

    rows, summary = [], {}
    which = args.only.split(",")
    steps = [("compile", bench_compile_and_overhead), ("chain", bench_chain),
             ("scatter", lambda r: {**bench_scatter(r, 256), **bench_scatter(r, 2**24)}), ("moe", bench_moe),
             ("norm", lambda r: bench_norms.run(r, samples)), ("prologue", lambda r: bench_prologue.run(r, samples))]
    for name, fn in steps:
        if name not in which:
            continue
        try:
            summary.update(fn(rows))
        except KeyboardInterrupt:  # a time limit's SIGINT: keep what was measured, write it out
            print(f"interrupted in {name}", flush=True)
            break
        except Exception as e:  # report and go on: one broken benchmark must not hide the rest
            import traceback

            traceback.print_exc()
            rows.append({"bench": name, "impl": "segfuse", "us": float("nan"), "fallbacks": f"FAILED: {e}"})
        print(table(rows), flush=True)
    from modes import count_launches  # (torch's profiler last: it slows every later launch)

    count_launches(rows)
    os.makedirs(os.path.join(HERE, "out"), exist_ok=True)
    meta = {"gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(), "torch": torch.__version__,
            "cupy": cp.__version__, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    with open(os.path.join(HERE, "out", "bench_gpu.json"), "w") as fh:
        json.dump({"meta": meta, "rows": rows, "summary": summary}, fh, indent=2)
    md = f"# bench_gpu ({meta['gpu']}, {meta['date']}, torch {meta['torch']}, CuPy {meta['cupy']})\n\n" + table(rows) + \
        "\n\n" + "\n".join(f"- {k}: {v:.2f}" for k, v in summary.items()) + "\n"
    with open(os.path.join(HERE, "out", "bench_gpu.md"), "w") as fh:
        fh.write(md)
    print(md)
    from plot_modes import plot_modes  # one plot per workload measured in the three modes

    for path in plot_modes({"meta": meta, "rows": rows}, Path(HERE) / "out" / "plots"):
        print("plot:", path)


if __name__ == "__main__":
    main()
