"""Runs per GPU host with several server processes: N independent `segfuse serve` processes on one
GPU (shards: each owns its buffers, as the scale-out issue's shards do), each driven by its own
wrk at the same time, the cached MoE histogram of benchmarks/load.py on a resident buffer in each.
Reports the summed rate per N next to the same N servers' summed health ceiling and the
in-process Engine.run baseline, all in one run.

  python3 benchmarks/load_shards.py --backend cupy --servers 1,2,4,8 --mps both --connections 16 --duration 5
  python3 benchmarks/load_shards.py --backend cupy --servers 1,2,4,8 --mps on --route   # + behind the router

The servers are one `segfuse serve --processes N [--mps]` group, as a deployment runs them. Each is a
separate process with its own CUDA context; without MPS the GPU time-slices between the contexts,
with `--mps on` the group's MPS daemon lets their kernels share it; `--mps both` measures the two
one after the other in one run. A shard's clients must send its runs to it (its
buffers live there): here each wrk talks to one shard only."""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
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


def start_group(backend: str, token: str | None, processes: int, mps: bool, route: bool = False,
                extra: tuple = ()) -> tuple[subprocess.Popen, list[str]]:
    """`segfuse serve --processes N [--mps] [--route]` on consecutive free loopback ports: the
    deployment's own way to run several servers on one GPU (cli/serve_group.py), MPS daemon included.
    With route, the first URL is the router's, the shards' follow. `extra`: more of serve's options."""
    base = consecutive_ports(processes + route)
    env = dict(os.environ, SEGFUSE_LOG_LEVEL="warning")
    if token:
        env["SEGFUSE_TOKEN"] = token
    cmd = [sys.executable, "-c", "import sys; from segfuse.cli import main; sys.exit(main())", "serve",
           "--host", "127.0.0.1", "--port", str(base), "--backend", backend, "--max-queued-runs", "4096",
           "--processes", str(processes), *(["--mps"] if mps else []), *(["--route"] if route else []), *extra]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)  # (its session: cpu_share finds its processes)
    urls = [f"http://127.0.0.1:{base + k}" for k in range(processes + route)]
    for url in urls:
        if not load.wait_ready(proc, url, 180, "segfuse serve --processes"):
            proc.kill()
            raise SystemExit(f"{url} did not become ready in 180 s")
    return proc, urls


def consecutive_ports(n: int) -> int:
    for _ in range(100):
        base = load.free_port()
        if base + n <= 65535 and all(_port_free(base + k) for k in range(1, n)):
            return base
    raise SystemExit(f"no {n} consecutive free ports")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def bench(args) -> dict:
    result = {**load.environment(), "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "tokens": args.tokens, "topk": args.topk, "experts": args.experts, "duration_s": args.duration,
              "wrk_version": load_wrk.wrk_version(args.wrk), "wrk_threads_per_server": args.wrk_threads,
              "modes": [], "in_process": None}
    ids = None
    for mps in {"off": [False], "on": [True], "both": [False, True]}[args.mps]:
        mode, ids = _bench(args, mps)
        result["server"] = mode.pop("server")
        if args.route:
            mode["routed"] = _bench_routed(args, mps)
        result["modes"].append(mode)
    # After the groups stopped (and their MPS daemon quit): this process's context is nobody's client.
    result["in_process"] = load.in_process_baseline(result["server"]["backend"], ids, args.experts,
                                                    min(args.duration, 2.0))
    return result


def _bench(args, mps: bool) -> tuple[dict, object]:
    top = max(args.servers)
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    mode = {"mps": mps, "infer": [], "health": []}
    fusion_ids, ids = [], None
    proc, urls = start_group(args.backend, args.token, top, mps)
    try:
        for url in urls:
            mode["server"], fid, ids = load.setup(url, headers, args)  # checks one result against NumPy
            fusion_ids.append(fid)
        c, t = args.connections, load_wrk.threads_for(args.connections, args.wrk_threads)
        for n in args.servers:
            levels = parallel([
                (lambda u=u, f=f: load_wrk.infer_level(args.wrk, u, f, c, t, args.duration, "inline", args.token))
                for u, f in zip(urls[:n], fusion_ids[:n])])
            mode["infer"].append(combined(levels, n, c))
            levels = parallel([(lambda u=u: load_wrk.health_level(args.wrk, u, c, t, args.duration))
                               for u in urls[:n]])
            mode["health"].append(combined(levels, n, c))
            print(f"{'MPS' if mps else 'no MPS'}, {n} server(s): infer {mode['infer'][-1]['rps']:.0f}/s, "
                  f"health {mode['health'][-1]['rps']:.0f}/s", flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    return mode, ids


def _bench_routed(args, mps: bool) -> list[dict]:
    """The same N shards behind the router (`--route`): one wrk per shard, all on the router's port,
    each with a namespace that lands on its shard (the Segfuse-Namespace header)."""
    from segfuse.scaleout import shard_for

    top = max(args.servers)
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    proc, urls = start_group(args.backend, args.token, top, mps, route=True)
    out = []
    try:
        router, ids = urls[0], [f"shard-{k}" for k in range(top)]
        spaces = [next(f"bench-{k}" for k in range(10_000) if shard_for(f"bench-{k}", ids) == s) for s in ids]
        fids = [load.setup(router, {**headers, "Segfuse-Namespace": ns}, args)[1] for ns in spaces]
        c, t = args.connections, load_wrk.threads_for(args.connections, args.wrk_threads)
        for n in args.servers:
            levels = parallel([
                (lambda f=f, ns=ns: load_wrk.run_wrk(args.wrk, f"{router}/v2/models/{f}/infer", "infer_ns.lua", c, t,
                                                     args.duration, ("inline", "bench_ids", 2 * (c // t), ns),
                                                     args.token))
                for f, ns in zip(fids[:n], spaces[:n])])
            out.append(combined(levels, n, c))
            print(f"{'MPS' if mps else 'no MPS'}, {n} shard(s) behind the router: infer {out[-1]['rps']:.0f}/s",
                  flush=True)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    return out


def table(result: dict) -> str:
    base = result["in_process"]
    lines = [f"## Server processes on one host: {result['server']['backend']} on {result['server']['device']}, "
             f"{result['machine']['cpus']} CPUs, {result['time']}",
             f"moe_problem_sizes T={result['tokens']} K={result['topk']} E={result['experts']}, wrk "
             f"{result['wrk_version']}, {result['duration_s']:g} s per level; in-process Engine.run p50 "
             f"{base['p50_us']:.0f} us", "",
             "| MPS | servers | connections each | infer runs/s (sum) | per server | p50 (mean) | p99 (worst) | "
             "health req/s (sum) | infer / health | errors |",
             "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |"]
    for mode in result["modes"]:
        for inf, hl in zip(mode["infer"], mode["health"]):
            lines.append(f"| {'on' if mode['mps'] else 'off'} | {inf['servers']} | {inf['connections_per_server']} | "
                         f"{inf['rps']:,.0f} | {', '.join(f'{r:,}' for r in inf['per_server_rps'])} | "
                         f"{inf['p50_us_mean']:,.0f} us | {inf['p99_us_max'] / 1e3:.1f} ms | {hl['rps']:,.0f} | "
                         f"{inf['rps'] / hl['rps']:.2f} | {inf['errors'] + hl['errors']} |")
    routed = [(m, r, i) for m in result["modes"] for r, i in zip(m.get("routed", []), m["infer"])]
    if routed:
        lines += ["", "Behind the router (`--route`: one port, each wrk's namespace on its shard), next to the "
                  "independent servers above:", "",
                  "| MPS | shards | connections each | runs/s through the router | per shard | p50 (mean) | "
                  "p99 (worst) | / independent servers | errors |",
                  "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
        for mode, r, inf in routed:
            lines.append(f"| {'on' if mode['mps'] else 'off'} | {r['servers']} | {r['connections_per_server']} | "
                         f"{r['rps']:,.0f} | {', '.join(f'{x:,}' for x in r['per_server_rps'])} | "
                         f"{r['p50_us_mean']:,.0f} us | {r['p99_us_max'] / 1e3:.1f} ms | {r['rps'] / inf['rps']:.2f}x | "
                         f"{r['errors']} |")
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="auto", choices=["auto", "cupy", "numpy"])
    p.add_argument("--token", default=os.environ.get("SEGFUSE_TOKEN"))
    p.add_argument("--servers", default="1,2,4", help="comma-separated shard counts (servers started: the largest)")
    p.add_argument("--connections", type=int, default=16, help="wrk connections per server")
    p.add_argument("--wrk-threads", type=int, default=1, help="threads of each server's wrk")
    p.add_argument("--wrk", help="the wrk binary (default: wrk on PATH)")
    p.add_argument("--mps", choices=["off", "on", "both"], default="off",
                   help="servers without MPS, under MPS (`segfuse serve --mps`), or both, one after the other")
    p.add_argument("--route", action="store_true",
                   help="also the same shards behind the router (`segfuse serve --route`), measured next to them")
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
    errors = sum(r["errors"] for m in result["modes"] for r in m["infer"] + m["health"] + m.get("routed", []))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
