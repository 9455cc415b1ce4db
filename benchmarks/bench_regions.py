"""Zero-copy regions against resident buffers and inline binary tensors (issue 13, part 6).

Starts `segfuse serve` as a separate process on a free loopback port (CUDA IPC needs two processes:
this one owns the memory, the server maps it) and registers the MoE histogram (moe_problem_sizes)
and argsort (moe_argsort) fusions with E experts and top-k K. For each fusion, the same ids are fed
three ways, each timed over --calls sequential `Client.run` calls after a warm-up:

- region: the ids and every output in shared-memory regions (CUDA regions of this process's CuPy
  arrays on --backend cupy, POSIX objects made with `SystemRegion` on --backend numpy); the outputs
  land in this process's memory and are read back once, at the end, for the check;
- buffer: the ids stored once with `put`, read as `Buffer(name)`, the outputs stored with
  `Buffer(name, overwrite=True)` (read back once at the end);
- inline: the ids sent with every call in the binary extension, the outputs returned as binary.

Then the same with --threads threads, each with its own Client and its own regions or buffers
(runs/s under concurrency); and one big int64 input (--big-mib, topk_ids [big/(8K), K]) through the
histogram: registered once as a region (per-call time), uploaded with `put` and run on (upload +
run), and sent inline in the infer request. The outputs of the last call of every way are checked
against NumPy written independently (np.bincount, np.argsort(-ids, kind="stable")).

    python benchmarks/bench_regions.py --backend numpy --quick     # seconds, anywhere (CPU smoke mode)
    python benchmarks/bench_regions.py --backend cupy              # T = 4096, E = 256, K = 8, 256 MiB

Prints markdown tables and writes JSON to benchmarks/out/bench_regions-<backend>-<time>.json.
Exits 1 on any failed check or error.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path

import numpy as np
from load import environment, start_server
from load_python import percentile
from segfuse.client import Buffer, Client, SystemRegion
from workloads import moe_graphs

ROOT = Path(__file__).resolve().parent.parent

FUSIONS = {"histogram": "moe_problem_sizes", "argsort": "moe_argsort"}
MODES = ("region", "buffer", "inline")


# ---- the oracle ---------------------------------------------------------------------------------
def oracle(fusion: str, ids: np.ndarray, experts: int) -> dict[str, np.ndarray]:
    """The fusion's outputs in NumPy, written independently of the graphs."""
    flat = ids.reshape(-1)
    if fusion == "histogram":
        return {"counts": np.bincount(flat, minlength=experts).astype(np.int64)}
    order = np.argsort(-flat, kind="stable")
    out_perm = np.empty_like(order)
    out_perm[order] = np.arange(order.size)
    return {"input_permutation": (order // ids.shape[1]).astype(np.int64), "output_permutation": out_perm.astype(np.int64)}


def check(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> str | None:
    """None when every output matches, else what differs."""
    for name, w in want.items():
        g = got.get(name)
        if g is None:
            return f"output '{name}' missing"
        g = np.asarray(g)
        if g.shape != w.shape:
            return f"output '{name}': shape {g.shape}, expected {w.shape}"
        if not np.array_equal(g, w):
            return f"output '{name}': {int(np.count_nonzero(g != w))} of {w.size} elements differ from NumPy"
    return None


# ---- memory the server maps ---------------------------------------------------------------------
class RegionTensor:
    """`host`'s bytes in a new region `name` of this process, registered with `c`: a CUDA region of
    a CuPy array (kind "cuda") or a POSIX shared-memory object (kind "system")."""

    def __init__(self, c: Client, kind: str, name: str, host: np.ndarray):
        self.c, self.kind, self.name = c, kind, name
        if kind == "cuda":
            import cupy as cp

            self.array = cp.asarray(host)
            cp.cuda.Device().synchronize()
            self.region = c.register_cuda_shared_memory(name, self.array)
        else:
            self.shm = SystemRegion.create(f"/segfuse_bench_{os.getpid()}_{name}", host.nbytes)
            self.array = self.shm.array(host.dtype, host.shape)
            self.array[...] = host
            self.region = c.register_system_shared_memory(name, self.shm).tensor(host.dtype, host.shape)

    def read(self) -> np.ndarray:
        if self.kind == "cuda":
            import cupy as cp

            return cp.asnumpy(self.array)
        return self.array.copy()

    def release(self) -> None:
        try:
            if self.kind == "cuda":
                self.c.unregister_cuda_shared_memory(self.name)
            else:
                self.c.unregister_system_shared_memory(self.name)
        finally:
            self.array = None
            if self.kind == "system":
                self.shm.close()
                self.shm.unlink()


class Way:
    """One way of feeding `ids` to a fusion and getting its outputs, set up on client `c`:
    `call()` runs it once, `outputs(last)` reads the outputs of the last call, `release()` frees
    what the setup made (regions, buffers)."""

    def __init__(self, c: Client, kind: str, mode: str, ref, ids: np.ndarray, want: dict, tag: str):
        self.c, self.mode, self.ref, self.names = c, mode, ref, list(want)
        self.made: list[RegionTensor] = []
        self.buffers: list[str] = []
        if mode == "region":
            self.made.append(RegionTensor(c, kind, f"ids_{tag}", ids))
            for n in self.names:
                self.made.append(RegionTensor(c, kind, f"{n}_{tag}", np.full(want[n].shape, -1, np.int64)))
            self.inputs = {"topk_ids": self.made[0].region}
            self.dest = {n: t.region for n, t in zip(self.names, self.made[1:])}
        elif mode == "buffer":
            c.put(f"ids_{tag}", ids)
            self.dest = {n: Buffer(f"{n}_{tag}", overwrite=True) for n in self.names}
            self.buffers = [f"ids_{tag}", *(b.name for b in self.dest.values())]
            self.inputs = {"topk_ids": Buffer(f"ids_{tag}")}
        else:
            self.inputs, self.dest = {"topk_ids": ids}, None

    def call(self):
        return self.c.run(self.ref, inputs=self.inputs, outputs=self.dest)

    def outputs(self, last) -> dict[str, np.ndarray]:
        if self.mode == "region":
            return {n: t.read() for n, t in zip(self.names, self.made[1:])}
        if self.mode == "buffer":
            return {n: self.c.get(b.name) for n, b in self.dest.items()}
        return dict(last.outputs)

    def release(self) -> None:
        for t in self.made:
            t.release()
        for b in self.buffers:
            try:
                self.c.delete(b)
            except Exception:  # an output buffer that no run stored
                pass


# ---- timing -------------------------------------------------------------------------------------
def timed(call, calls: int, warm: int) -> tuple[list[float], list[float], float, object]:
    """(latencies in us, the server's run times in us, wall seconds, last result) of `calls` calls
    after `warm` untimed ones; the garbage collector is paused while calls are timed."""
    for _ in range(warm):
        call()
    lat, server_run, last = [], [], None
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        t_start = time.perf_counter()
        for _ in range(calls):
            t0 = time.perf_counter()
            last = call()
            lat.append((time.perf_counter() - t0) * 1e6)
            server_run.append(float(last.timings_us.get("run", 0.0)))
        wall = time.perf_counter() - t_start
    finally:
        if was:
            gc.enable()
    return lat, server_run, wall, last


def stats(lat: list[float]) -> dict:
    return {"p50_us": percentile(lat, 50), "p90_us": percentile(lat, 90), "p99_us": percentile(lat, 99),
            "mean_us": float(np.mean(lat))}


def sequential(url: str, kind: str, fusion: str, ref, ids, want, mode: str, args) -> dict:
    row = {"fusion": fusion, "mode": mode, "calls": 0, "check": None}
    with Client(url) as c:
        way = Way(c, kind, mode, ref, ids, want, f"seq_{fusion}_{mode}")
        try:
            lat, server_run, wall, last = timed(way.call, args.calls, args.warmup)
            row.update(calls=len(lat), **stats(lat), runs_per_s=len(lat) / wall,
                       server_run_p50_us=percentile(server_run, 50))
            row["check"] = check(way.outputs(last), want) or "ok"
        finally:
            way.release()
    return row


def concurrent(url: str, kind: str, fusion: str, ref, ids, want, mode: str, args) -> dict:
    """`args.threads` threads, each with its own Client and own regions/buffers, each making
    calls // threads calls after its warm-up; runs/s over the wall time of all of them."""
    n = args.threads
    per = max(1, args.calls // n)
    clients = [Client(url) for _ in range(n)]
    ways: list[Way] = []
    lats: list[list[float]] = [[] for _ in range(n)]
    results: list = [None] * n
    errors: list[str] = []
    barrier = threading.Barrier(n + 1)

    def work(i: int) -> None:
        try:
            for _ in range(args.warmup):
                ways[i].call()
        except Exception as e:
            errors.append(f"thread {i} warm-up: {e!r}")
        barrier.wait()
        try:
            for _ in range(per):
                t0 = time.perf_counter()
                results[i] = ways[i].call()
                lats[i].append((time.perf_counter() - t0) * 1e6)
        except Exception as e:
            errors.append(f"thread {i}: {e!r}")

    try:
        for i, c in enumerate(clients):
            ways.append(Way(c, kind, mode, ref, ids, want, f"thr{i}_{fusion}_{mode}"))
        threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
        for t in threads:
            t.start()
        barrier.wait()
        t0 = time.perf_counter()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        lat = [x for ls in lats for x in ls]
        row = {"fusion": fusion, "mode": mode, "threads": n, "calls": len(lat), "errors": errors,
               "runs_per_s": len(lat) / wall if wall > 0 else 0.0, **(stats(lat) if lat else {})}
        bad = [f"thread {i}: {msg}" for i, w in enumerate(ways)
               if (msg := check(w.outputs(results[i]), want) if results[i] is not None else "no result")]
        row["check"] = "; ".join(bad + errors) or "ok"
        return row
    finally:
        for w in ways:
            w.release()
        for c in clients:
            c.close()


# ---- the big input ------------------------------------------------------------------------------
def big_input(url: str, kind: str, ref, args) -> list[dict]:
    """One --big-mib int64 input through the histogram: a region (registered once), an upload
    (put + run on the buffer) and inline binary, --big-reps times each (one big array at a time)."""
    K, E = args.topk, args.experts
    nbytes = args.big_mib * (1 << 20)
    T = nbytes // (8 * K)
    ids = np.random.default_rng(1).integers(0, E, (T, K), dtype=np.int64)
    want = oracle("histogram", ids, E)
    gb = ids.nbytes / 1e9
    rows = []

    def row(way: str, secs: list[float], got, **extra) -> dict:
        p50 = float(np.median(secs))
        return {"way": way, "bytes": ids.nbytes, "tokens": T, "reps": len(secs), "p50_s": p50, "min_s": min(secs),
                "gbps": gb / p50, "check": check(got, want) or "ok", **extra}

    with Client(url, timeout=600) as c:
        # (a) a region: registered once, then runs on it
        t0 = time.perf_counter()
        r_ids = RegionTensor(c, kind, "big_ids", ids)
        register_s = time.perf_counter() - t0
        r_counts = RegionTensor(c, kind, "big_counts", np.full(E, -1, np.int64))
        try:
            lat, _, _, _ = timed(lambda: c.run(ref, inputs={"topk_ids": r_ids.region},
                                               outputs={"counts": r_counts.region}), args.big_reps, 1)
            rows.append(row("region", [x / 1e6 for x in lat], {"counts": r_counts.read()},
                            register_s=register_s))
        finally:
            r_ids.release()
            r_counts.release()
            if kind == "cuda":
                import cupy as cp

                cp.get_default_memory_pool().free_all_blocks()
        # (b) an upload: put the bytes, run on the buffer (the counts come back inline)
        secs, put_secs, last = [], [], None
        try:
            for _ in range(args.big_reps + 1):  # the first is the warm-up
                t0 = time.perf_counter()
                c.put("big_ids", ids)
                t1 = time.perf_counter()
                last = c.run(ref, inputs={"topk_ids": Buffer("big_ids")}, outputs=["counts"])
                secs.append(time.perf_counter() - t0)
                put_secs.append(t1 - t0)
                c.delete("big_ids")
        finally:
            if "big_ids" in {b["name"] for b in c.buffers()}:
                c.delete("big_ids")
        rows.append(row("upload", secs[1:], last.outputs, put_p50_s=float(np.median(put_secs[1:]))))
        # (c) inline binary in the infer request
        lat, _, _, last = timed(lambda: c.run(ref, inputs={"topk_ids": ids}, outputs=["counts"]), args.big_reps, 1)
        rows.append(row("inline", [x / 1e6 for x in lat], last.outputs))
    return rows


# ---- the report ---------------------------------------------------------------------------------
def table(r: dict) -> str:
    m, v, s = r["machine"], r["versions"], r["server"]
    lines = [f"## bench_regions, backend {r['backend']} ({r['time']})", "",
             f"- machine: {m['host']}, {m['cpus']} CPUs ({m['cpu_model']}), {m['platform']}, Python {m['python']}",
             f"- server: backend {s.get('backend', '?')} on {s.get('device', '?')}, segfuse {s.get('version', '?')}, "
             f"commit {r['commit']}",
             "- versions: " + ", ".join(f"{k} {val}" for k, val in v.items() if val),
             f"- T = {r['tokens']}, K = {r['topk']}, E = {r['experts']}; {r['calls']} sequential calls per way after "
             f"{r['warmup']} warm-up; regions are {r['region_kind']} shared memory", ""]
    lines += ["| fusion | mode | calls | p50 us | p90 us | p99 us | runs/s | server run p50 us | check |",
              "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for x in r["sequential"]:
        lines.append(f"| {x['fusion']} | {x['mode']} | {x['calls']} | " + (
            f"{x['p50_us']:.0f} | {x['p90_us']:.0f} | {x['p99_us']:.0f} | {x['runs_per_s']:.0f} | "
            f"{x['server_run_p50_us']:.0f} | {x['check']} |" if x["calls"] else f"- | - | - | - | - | {x['check']} |"))
    if r["concurrent"]:
        lines += ["", "| fusion | mode | threads | calls | p50 us | p99 us | runs/s | check |",
                  "|---|---|---:|---:|---:|---:|---:|---|"]
        for x in r["concurrent"]:
            lines.append(f"| {x['fusion']} | {x['mode']} | {x.get('threads', '-')} | {x['calls']} | "
                         + (f"{x['p50_us']:.0f} | {x['p99_us']:.0f} | {x['runs_per_s']:.0f} | " if x["calls"]
                            else "- | - | - | ") + f"{x['check']} |")
    if r["big"]:
        lines += ["", f"Big input: {r['big_mib']} MiB of int64 ids through the histogram",
                  "", "| way | tokens | reps | p50 s | min s | GB/s | check | notes |",
                  "|---|---:|---:|---:|---:|---:|---|---|"]
        for x in r["big"]:
            note = (f"registered once in {x['register_s']:.3f} s" if "register_s" in x else
                    f"of which put {x['put_p50_s']:.3f} s" if "put_p50_s" in x else "ids in the request body")
            lines.append(f"| {x['way']} | {x['tokens']} | {x['reps']} | {x['p50_s']:.4f} | {x['min_s']:.4f} | "
                         f"{x['gbps']:.2f} | {x['check']} | {note} |")
    if r["errors"]:
        lines += ["", "ERRORS:", *(f"- {e}" for e in r["errors"])]
    return "\n".join(lines)


def failures(r: dict) -> list[str]:
    rows = r["sequential"] + r["concurrent"] + r["big"]
    return r["errors"] + [f"{x.get('fusion', 'big')} {x.get('mode', x.get('way'))}: {x['check']}"
                          for x in rows if x["check"] != "ok"]


def bench(args) -> dict:
    kind = "cuda" if args.backend == "cupy" else "system"
    if kind == "cuda":
        import cupy  # noqa: F401  (fail here, before the server starts, when CuPy is missing)
    # an inline big input is a body of --big-mib plus its header: above the server's 256M default
    os.environ.setdefault("SEGFUSE_MAX_BODY_BYTES", f"{max(512, 2 * args.big_mib)}M")
    proc, url = start_server(args.backend, None)
    result = {**environment(), "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "backend": args.backend,
              "region_kind": kind, "tokens": args.tokens, "topk": args.topk, "experts": args.experts,
              "calls": args.calls, "warmup": args.warmup, "threads": args.threads, "big_mib": args.big_mib,
              "big_reps": args.big_reps, "server": {}, "sequential": [], "concurrent": [], "big": [], "errors": []}
    try:
        with Client(url) as c:
            result["server"] = c.metadata()
            graphs = {g["name"]: g for g, _ in moe_graphs(E=args.experts, K=args.topk)}
            refs = {f: c.register(graphs[name]) for f, name in FUSIONS.items()}
        ids = np.random.default_rng(0).integers(0, args.experts, (args.tokens, args.topk), dtype=np.int64)
        for fusion, ref in refs.items():
            want = oracle(fusion, ids, args.experts)
            for mode in MODES:
                for section, fn, on in (("sequential", sequential, True),
                                        ("concurrent", concurrent, args.threads > 1)):
                    if not on:
                        continue
                    try:
                        result[section].append(fn(url, kind, fusion, ref, ids, want, mode, args))
                    except Exception as e:
                        traceback.print_exc()
                        result[section].append({"fusion": fusion, "mode": mode, "calls": 0, "check": f"error: {e!r}"})
        if args.big_mib > 0:
            try:
                result["big"] = big_input(url, kind, refs["histogram"], args)
            except Exception as e:
                traceback.print_exc()
                result["errors"].append(f"big input: {e!r}")
    finally:
        proc.terminate()
        proc.wait(30)
    return result


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="cupy", choices=["cupy", "numpy"],
                   help="cupy: CUDA regions (needs a GPU); numpy: system shared-memory regions (anywhere)")
    p.add_argument("--tokens", type=int, help="T (default 4096; 256 with --quick)")
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--calls", type=int, help="timed sequential calls per way (default 300; 20 with --quick)")
    p.add_argument("--warmup", type=int, help="untimed calls first (default 20; 3 with --quick)")
    p.add_argument("--threads", type=int, help="threads of the concurrent runs, 0 or 1 for none (default 8; 2 with "
                                               "--quick)")
    p.add_argument("--big-mib", type=int, help="MiB of the big input, 0 for none (default 256; 4 with --quick)")
    p.add_argument("--big-reps", type=int, help="timed calls of each big way (default 5; 2 with --quick)")
    p.add_argument("--quick", action="store_true", help="small sizes, few calls (a smoke test)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "out"))
    args = p.parse_args(argv)
    defaults = {"tokens": (4096, 256), "calls": (300, 20), "warmup": (20, 3), "threads": (8, 2),
                "big_mib": (256, 4), "big_reps": (5, 2)}
    for name, (full, quick) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if args.calls < 1 or args.tokens < 1 or args.topk < 1 or args.experts < 1:
        p.error("--calls, --tokens, --topk and --experts must be at least 1")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    result = bench(args)
    result["failures"] = failures(result)
    print(table(result))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"bench_regions-{args.backend}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"\nwrote {path}")
    if result["failures"]:
        print(f"\n{len(result['failures'])} FAILURE(S):", *result["failures"], sep="\n- ", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
