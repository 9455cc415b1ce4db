"""The whole MoE routing prologue as ONE graph (issue 20; benchmarks/workloads.py: counts by
scatter-add, expert offsets by cumsum and pad, the stable argsort, `order // K`, the inverse
permutation by scattering an iota; E = 256, K = 8), for `python benchmarks/bench_gpu.py --only
prologue`: T in {1, 128, 4096, 16384, 65536} x {int32, int64}, against torch eager, torch + CUDA
graph, torch.compile (default and reduce-overhead), in the three modes of benchmarks/modes.py:

- per call: segfuse `Engine("cupy").run` (it synchronizes: the plan checks indices), torch's
  calls followed by a synchronize;
- pipelined: back-to-back calls (segfuse with `errors="deferred"`, as a serving loop runs it);
- GPU time: segfuse's kernels only (`kernel_time_us`) and the segfuse.torch op captured in the
  caller's CUDA graph (what SGLang/vLLM decode replays), torch's CUDA-graph replays.

Also the same prologue written in torch (workloads.torch_prologue), captured by
`segfuse.torch.capture` with T dynamic and run by the Engine, and `torch.compile(backend="segfuse")`
of it (default and reduce-overhead), next to Inductor's.

Each row reports its launches; `speedup` is the other implementation's GPU time over segfuse's
kernels-only time. The targets: one launch at T <= 16384 (<= 2 at 65536), GPU time >= 4x faster
than torch + CUDA graph, pipelined >= 3x faster than torch's graph replay.

Knobs: SEGFUSE_PROLOGUE_T ("1,128,4096"), SEGFUSE_PROLOGUE_IDT, SEGFUSE_PROLOGUE_COMPILE=0.
"""

from __future__ import annotations

import os

from modes import env_list, graph_of, held_events_us, measure, replay_us, stop_compile_workers, torch_launches

TOKENS = [1, 128, 4096, 16384, 65536]


def bench_one(rows, idt, T, samples):
    import cupy as cp
    import torch
    from segfuse.compiler.engine import Engine
    from segfuse.compiler.ir import Fusion
    from workloads import E, K, prologue_graph, torch_prologue

    f = Fusion.from_json(prologue_graph(idt))
    ids_t = torch.randint(0, E, (T, K), device="cuda", dtype=getattr(torch, idt))
    ids = cp.asarray(ids_t)  # (the same memory: __cuda_array_interface__)
    ins = {"topk_ids": ids}
    eng, deferred = Engine("cupy"), Engine("cupy", errors="deferred")
    got = eng.run(f, ins).outputs
    want = torch_prologue(ids_t)
    for name, w in zip(("counts", "offsets", "input_perm", "output_perm"), want):
        assert torch.equal(torch.as_tensor(got[name], device="cuda").long(), w.long()), f"{name} T={T} {idt}"
    prep = eng.prepared(f, ins)
    name = f"moe prologue T={T} {idt}"

    def seg_call():
        eng.run(f, ins)

    def seg_pipe():
        deferred.run(f, ins)

    impls = {"segfuse": (seg_call, seg_pipe, lambda: eng.kernel_time_us(f, ins, reps=50), prep.kernels if prep else None)}
    if T * K > 16384:  # the histogram in a kernel of its own (Capability.fuse_sort_histograms off)
        import dataclasses

        from segfuse.compiler.segmenter.cache import PlanCache
        from segfuse.compiler.segmenter.capability import DEFAULT_CAPABILITY

        cache = PlanCache(cap=dataclasses.replace(DEFAULT_CAPABILITY, fuse_sort_histograms=False))
        hf = Fusion.from_json({**prologue_graph(idt), "name": f"moe_prologue_{idt}_two"})
        he, hd = Engine("cupy", plan_cache=cache), Engine("cupy", errors="deferred", plan_cache=cache)
        hgot = he.run(hf, ins).outputs
        for nm, w in zip(("counts", "offsets", "input_perm", "output_perm"), want):
            assert torch.equal(torch.as_tensor(hgot[nm], device="cuda").long(), w.long()), f"two launches: {nm} T={T} {idt}"
        impls["segfuse, histogram in its own kernel"] = (lambda: he.run(hf, ins), lambda: hd.run(hf, ins),
                                                   lambda: he.kernel_time_us(hf, ins, reps=50),
                                                   he.prepared(hf, ins).kernels)
    try:  # the segfuse.torch op inside the caller's CUDA graph
        import segfuse.torch as sft

        op = sft.fusion(prologue_graph(idt))
        sg = graph_of(lambda: op(ids_t))
        impls["segfuse.torch in a CUDA graph"] = (lambda: (sg.replay(), torch.cuda.synchronize()), sg.replay,
                                                  lambda: held_events_us(sg.replay), prep.kernels if prep else None)
    except Exception as e:  # report and go on
        rows.append({"bench": name, "impl": "segfuse.torch in a CUDA graph", "us": float("nan"),
                     "fallbacks": f"FAILED: {type(e).__name__}: {e}"})
    _captured(impls, rows, name, ids_t, want)
    eager = lambda: torch_prologue(ids_t)  # noqa: E731
    g = graph_of(eager)
    eager_gpu = lambda: held_events_us(g.replay)  # noqa: E731  (one timer: measure times it once a round)
    impls["torch eager"] = (lambda: (eager(), torch.cuda.synchronize()), eager, eager_gpu, torch_launches(eager))
    impls["torch + CUDA graph"] = (lambda: (g.replay(), torch.cuda.synchronize()), g.replay, eager_gpu,
                                   None)  # (eager's kernels, replayed)
    if os.environ.get("SEGFUSE_PROLOGUE_COMPILE", "1") != "0":
        # A fresh Dynamo for each workload: it caches compiled code by the function's code object, and
        # past its recompile limit (8) it silently runs the function eagerly (the 22:23 UTC run's
        # torch.compile rows after the first 8 compiles were eager's)
        torch._dynamo.reset()
        for mode in env_list("SEGFUSE_COMPILE_MODES", ["default", "reduce-overhead"]):
            c = torch.compile(torch_prologue, mode=None if mode == "default" else mode, dynamic=False)
            fn = lambda c=c: c(ids_t)  # noqa: E731
            for _ in range(3):
                fn()
            gpu = replay_us(fn) if mode == "default" else float("nan")
            impls[f"torch.compile {mode}"] = (lambda fn=fn: (fn(), torch.cuda.synchronize()), fn, gpu,
                                              torch_launches(fn) if mode == "default" else None)
        stop_compile_workers()
    base = measure(rows, name, impls, samples, 50)
    tg = base["torch + CUDA graph"]
    out = {}
    for impl in ("segfuse", "segfuse, histogram in its own kernel"):
        s = base.get(impl)
        if s is not None:
            out.update({f"{name} ({impl}): launches": float(s["launches"] or 0),
                        f"{name} ({impl}): GPU time vs torch + CUDA graph": tg["gpu us"] / s["gpu us"],
                        f"{name} ({impl}): pipelined (deferred) vs torch graph replay": tg["pipelined us"] / s["pipelined us"]})
    return out


def _captured(impls, rows, name, ids_t, want):
    """The prologue written in torch (workloads.torch_prologue) captured by `segfuse.torch.capture`
    (T dynamic) and run by the Engine, and `torch.compile(backend="segfuse")` of it in both modes."""
    import cupy as cp
    import segfuse.torch as sft
    import torch
    from segfuse.compiler.engine import Engine
    from workloads import torch_prologue

    try:
        fused = sft.capture(torch_prologue, ids_t, dynamic={"ids": {0: "T"}}).fusion()
        ins = {"ids": cp.asarray(ids_t)}
        eng, deferred = Engine("cupy"), Engine("cupy", errors="deferred")
        got = eng.run(fused, ins).outputs
        for k, w in enumerate(want):
            assert torch.equal(torch.as_tensor(got[f"output_{k}"], device="cuda").long(), w.long()), f"captured {k}"
        impls["segfuse, captured from torch"] = (lambda: eng.run(fused, ins), lambda: deferred.run(fused, ins),
                                                 lambda: eng.kernel_time_us(fused, ins, reps=50),
                                                 eng.prepared(fused, ins).kernels)
    except Exception as e:  # report and go on
        rows.append({"bench": name, "impl": "segfuse, captured from torch", "us": float("nan"),
                     "fallbacks": f"FAILED: {type(e).__name__}: {e}"})
    if os.environ.get("SEGFUSE_PROLOGUE_COMPILE", "1") == "0":
        return
    torch._dynamo.reset()
    for mode in env_list("SEGFUSE_COMPILE_MODES", ["default", "reduce-overhead"]):
        impl = f"torch.compile segfuse backend {mode}"
        try:
            c = torch.compile(torch_prologue, backend="segfuse", mode=None if mode == "default" else mode,
                              dynamic=False)
            fn = lambda c=c: c(ids_t)  # noqa: E731
            for _ in range(3):
                out = fn()
            for k, w in enumerate(want):
                assert torch.equal(out[k].long(), w.long()), f"{impl}: output {k}"
            gpu = replay_us(fn) if mode == "default" else float("nan")
            impls[impl] = (lambda fn=fn: (fn(), torch.cuda.synchronize()), fn, gpu,
                           torch_launches(fn) if mode == "default" else None)
        except Exception as e:  # report and go on
            rows.append({"bench": name, "impl": impl, "us": float("nan"), "fallbacks": f"FAILED: {type(e).__name__}: {e}"})


def run(rows, samples):
    summary = {}
    tokens = [int(t) for t in env_list("SEGFUSE_PROLOGUE_T", [])] or TOKENS
    for idt in env_list("SEGFUSE_PROLOGUE_IDT", ["int32", "int64"]):
        for T in tokens:
            summary.update(bench_one(rows, idt, T, samples))
            last = rows[-1]["bench"]
            print(last, {r["impl"]: round(r.get("gpu us", float("nan")), 1) for r in rows if r["bench"] == last},
                  flush=True)
    return summary
