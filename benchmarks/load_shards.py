"""Runs per GPU host with several server processes: N independent `segfuse serve` processes on one
GPU (shards: each owns its buffers, as the scale-out issue's shards do), each driven by its own
wrk at the same time, the cached MoE histogram of benchmarks/load.py on a resident buffer in each.
Reports the summed rate per N next to the same N servers' summed health ceiling and the
in-process Engine.run baseline, all in one run.

  python3 benchmarks/load_shards.py --backend cupy --servers 1,2,4 --connections 16 --duration 5

Each shard is a separate process with its own CUDA context; without MPS the GPU time-slices
between the contexts, which this measures too. A shard's clients must send its runs to it (its
buffers live there): here each wrk talks to one shard only."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import load
import load_report
import load_wrk

ROOT = Path(__file__).resolve().parent.parent


def parallel(fns: list) -> list:
    """Runs the blocking calls at once (one thread each); their results in order."""
    out: list = [None] * len(fns)
    errors: list = []

    def call(k, fn):
        try:
            out[k] = fn()
        except BaseException as e:  # re-raised below, after every level ended
            errors.append(e)

    threads = [threading.Thread(target=call, args=(k, fn)) for k, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return out


def combined(levels: list[dict], servers: int, connections: int) -> dict:
    """One row for N shards: summed requests and rate, the worst p99 and max, the mean p50."""
    req = sum(lv["requests"] for lv in levels)
    return {"servers": servers, "connections_per_server": connections, "requests": req,
            "errors": sum(lv["errors"] for lv in levels),
            "error_detail": "; ".join(lv["error_detail"] for lv in levels if lv["error_detail"]),
            "rps": sum(lv["rps"] for lv in levels),
            "p50_us_mean": sum(lv["p50_us"] for lv in levels) / len(levels),
            "p99_us_max": max(lv["p99_us"] for lv in levels), "max_us": max(lv["max_us"] for lv in levels),
            "per_server_rps": [round(lv["rps"]) for lv in levels]}


@contextlib.contextmanager
def mps_daemon(enabled: bool):
    """With `enabled`: NVIDIA's MPS control daemon for the servers started inside, its pipe and log
    folders in a fresh temporary folder (the servers find it through the environment), quit at
    the end. MPS lets the shards' kernels share the GPU instead of time-slicing between their
    contexts. It changes no setting of the GPU (compute mode, clocks) and ends with the block."""
    if not enabled:
        yield None
        return
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        raise SystemExit("--mps: nvidia-cuda-mps-control is not on PATH")
    with tempfile.TemporaryDirectory(prefix="segfuse-mps-") as d:
        env = {"CUDA_MPS_PIPE_DIRECTORY": os.path.join(d, "pipe"), "CUDA_MPS_LOG_DIRECTORY": os.path.join(d, "log")}
        for v in env.values():
            os.makedirs(v)
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        subprocess.run([control, "-d"], check=True, timeout=30)
        try:
            yield control
        finally:
            try:
                subprocess.run([control], input="quit\n", text=True, timeout=20)
            except subprocess.TimeoutExpired:  # a hung MPS server: end it rather than wait
                subprocess.run(["pkill", "-f", "nvidia-cuda-mps"], timeout=10)
            for log in sorted(Path(env["CUDA_MPS_LOG_DIRECTORY"]).glob("*.log")):
                print(f"--- {log.name} (last lines)\n" + "\n".join(log.read_text().splitlines()[-8:]), flush=True)
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def bench(args) -> dict:
    with mps_daemon(args.mps):
        result, ids = _bench(args)
    result["mps"] = args.mps
    # After the daemon quit: a CUDA context of this process would be an MPS client it waits for.
    result["in_process"] = load.in_process_baseline(result["server"]["backend"], ids, args.experts,
                                                    min(args.duration, 2.0))
    return result


def _bench(args) -> tuple[dict, object]:
    top = max(args.servers)
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    procs, urls, fusion_ids, ids = [], [], [], None
    result = {**load.environment(), "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "tokens": args.tokens, "topk": args.topk, "experts": args.experts, "duration_s": args.duration,
              "wrk_version": load_wrk.wrk_version(args.wrk), "wrk_threads_per_server": args.wrk_threads,
              "infer": [], "health": [], "in_process": None}
    try:
        for _ in range(top):
            proc, url = load.start_server(args.backend, args.token)
            procs.append(proc)
            urls.append(url)
        for url in urls:
            result["server"], fid, ids = load.setup(url, headers, args)  # checks one result against NumPy
            fusion_ids.append(fid)
        c, t = args.connections, load_wrk.threads_for(args.connections, args.wrk_threads)
        for n in args.servers:
            levels = parallel([
                (lambda u=u, f=f: load_wrk.infer_level(args.wrk, u, f, c, t, args.duration, "inline", args.token))
                for u, f in zip(urls[:n], fusion_ids[:n])])
            result["infer"].append(combined(levels, n, c))
            levels = parallel([(lambda u=u: load_wrk.health_level(args.wrk, u, c, t, args.duration))
                               for u in urls[:n]])
            result["health"].append(combined(levels, n, c))
            print(f"{n} server(s): infer {result['infer'][-1]['rps']:.0f}/s, "
                  f"health {result['health'][-1]['rps']:.0f}/s", flush=True)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)
    return result, ids


def table(result: dict) -> str:
    base = result["in_process"]
    lines = [f"## Shards on one host: {result['server']['backend']} on {result['server']['device']}, "
             f"{result['machine']['cpus']} CPUs, {'MPS, ' if result['mps'] else ''}{result['time']}",
             f"moe_problem_sizes T={result['tokens']} K={result['topk']} E={result['experts']}, wrk "
             f"{result['wrk_version']}, {result['duration_s']:g} s per level; in-process Engine.run p50 "
             f"{base['p50_us']:.0f} us", "",
             "| servers | connections each | infer runs/s (sum) | per server | p50 (mean) | p99 (worst) | "
             "health req/s (sum) | infer / health | errors |",
             "| ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for inf, hl in zip(result["infer"], result["health"]):
        lines.append(f"| {inf['servers']} | {inf['connections_per_server']} | {inf['rps']:,.0f} | "
                     f"{', '.join(f'{r:,}' for r in inf['per_server_rps'])} | {inf['p50_us_mean']:,.0f} us | "
                     f"{inf['p99_us_max'] / 1e3:.1f} ms | {hl['rps']:,.0f} | {inf['rps'] / hl['rps']:.2f} | "
                     f"{inf['errors'] + hl['errors']} |")
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="auto", choices=["auto", "cupy", "numpy"])
    p.add_argument("--token", default=os.environ.get("SEGFUSE_TOKEN"))
    p.add_argument("--servers", default="1,2,4", help="comma-separated shard counts (servers started: the largest)")
    p.add_argument("--connections", type=int, default=16, help="wrk connections per server")
    p.add_argument("--wrk-threads", type=int, default=1, help="threads of each server's wrk")
    p.add_argument("--wrk", help="the wrk binary (default: wrk on PATH)")
    p.add_argument("--mps", action="store_true",
                   help="run the servers under an MPS control daemon started (and quit) by this script")
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--duration", type=float, default=5.0, help="seconds per level (whole seconds)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "out"))
    args = p.parse_args(argv)
    args.servers = sorted({int(x) for x in args.servers.split(",") if x.strip()})
    if not args.servers or min(args.servers) < 1:
        p.error("--servers takes positive integers")
    args.wrk = load_wrk.find_wrk(args.wrk)
    if not args.wrk:
        p.error("needs wrk on PATH or --wrk PATH (Debian: apt-get install wrk)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    result = bench(args)
    print(table(result))
    load_report.save(result, args.out, f"load-shards-{result['server']['backend']}")
    errors = sum(r["errors"] for r in result["infer"] + result["health"])
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
