"""Runs/s and latency of the router on loopback (NumPy shards; CuPy with --backend cupy): `segfuse
serve --processes N --route` (plain processes) and `segfuse serve-ray` (Ray actors) through it, the
latter also in the SDK's direct sharded mode (each client on its shard's own route,
/shards/shard-<i>), each with and without the router's busy polling, next to a direct `segfuse
serve`, all in one run. The cached MoE histogram of benchmarks/load.py on a resident
buffer, driven by wrk (benchmarks/wrk/infer_ns.lua: the namespace in a header).

Each configuration is started as a user would (`segfuse serve --processes N --route`, for N of 2
and more; `segfuse serve-ray --shards N`, its own local Ray cluster), gets one namespace per shard (each with the fusion and its own `bench_ids`,
one result checked against NumPy), then two levels: 1 connection (one namespace), and
--connections spread over the namespaces (one wrk per namespace, at once; so with 2 shards both
shards serve). --profile DIR records shard-0's process with py-spy during the second level of each
configuration through the router and summarises the stacks (profile_summary.py). Every
second level also records the CPU time of each process (benchmarks/cpu_share.py): where a run's
time goes when the machine's cores are the limit.

    python benchmarks/load_ray.py --shards 1,2 --duration 5     # the router with and without busy polling
    python benchmarks/load_ray.py --shards 2 --profile benchmarks/out/profile-ray
    python benchmarks/load_ray.py --shards 2,8 --backend cupy --no-ray   # a GPU host without Ray (its shards under MPS)

Prints a markdown table and writes JSON to benchmarks/out/. Exits 1 when any request failed.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import cpu_share
import load
import load_report
import load_wrk
from load_profile import find_py_spy, profiled
from load_shards import parallel, start_group
from segfuse.client import Client
from segfuse.scaleout import shard_for

ROOT = Path(__file__).resolve().parent.parent


def start_serve_ray(shards: int, backend: str = "numpy", shard_gpus: float = 1,
                    busy_poll: bool = False) -> tuple[subprocess.Popen, str]:
    """`segfuse serve-ray` as a user starts it, on a free port; (process, URL) once ready."""
    port = load.free_port()
    env = dict(os.environ, SEGFUSE_LOG_LEVEL="warning")
    cmd = [sys.executable, "-c", "import sys; from segfuse.cli import main; sys.exit(main())", "serve-ray",
           "--shards", str(shards), "--port", str(port), "--backend", backend,
           "--max-queued-runs", "4096", "--shard-gpus", str(shard_gpus)] + (["--router-busy-poll"] if busy_poll else [])
    log_path = ROOT / "benchmarks" / "out" / f"serve-ray-{shards}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "wb") as log:  # (the child keeps its own descriptor)
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        ready = load.wait_ready(proc, url, 240, "segfuse serve-ray", poll=0.5)
    except SystemExit:
        print(f"--- the last lines of {log_path}:", *log_path.read_text(errors="replace").splitlines()[-40:], sep="\n")
        raise
    if not ready:
        stop(proc)
        raise SystemExit(f"segfuse serve-ray did not become ready in 240 s (its output: {log_path})")
    return proc, url


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM, as `docker stop` would: the command stops the router, the shards and its local Ray cluster."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def namespaces(shards: int) -> list[str]:
    """One namespace per shard, the i-th on shard-i (by the router's own hash)."""
    ids = [f"shard-{i}" for i in range(shards)]
    return [next(f"bench-{k}" for k in range(10_000) if shard_for(f"bench-{k}", ids) == s) for s in ids]


def shard_pids(session: int) -> dict[str, int]:
    """Shard id -> pid of its process, in the cluster of `session` (Ray titles an actor's process
    ray::ShardHost; segfuse serve-ray gives each SEGFUSE_SHARD_ID)."""
    found = {}
    for pid, title, _ in cpu_share.processes({session}):
        if title.startswith("ray::ShardHost"):
            try:
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            sid = next((e.split(b"=", 1)[1].decode() for e in env if e.startswith(b"SEGFUSE_SHARD_ID=")), None)
            if sid:
                found[sid] = pid
    return found


def levels(args, targets: list[tuple[str, str, str]], session: int, profile: tuple | None = None,
           servers: set[int] = frozenset()) -> list[dict]:
    """The two levels over `targets` ((url, fusion id, namespace) each): 1 connection on the first,
    then --connections split over all of them at once (with each process's CPU time)."""
    def one(url, fid, ns, c):
        return load_wrk.run_wrk(args.wrk, f"{url}/v2/models/{fid}/infer", "infer_ns.lua", c,
                                load_wrk.threads_for(c, args.wrk_threads), args.duration,
                                ("inline", "bench_ids", 2 * c, ns))

    out = [one(*targets[0], 1)]
    share = max(1, args.connections // len(targets))

    def top():
        return parallel([(lambda t=t: one(*t, share)) for t in targets])

    before, t0 = cpu_share.snapshot({session}, servers), time.monotonic()
    if profile is None:
        tops = top()
    else:
        tops, profiles = _profiled(args, profile, session, top)
        out[0]["profiles"] = profiles
    seconds, after = time.monotonic() - t0, cpu_share.snapshot({session}, servers)
    out.append(load_shards_combined(tops, share))
    out[1]["cpu"] = cpu_share.delta(before, after, out[1]["requests"], seconds)
    return out


def load_shards_combined(tops: list[dict], share: int) -> dict:
    req = sum(t["requests"] for t in tops)
    return {"concurrency": share * len(tops), "connections_each": share, "requests": req,
            "errors": sum(t["errors"] for t in tops),
            "error_detail": "; ".join(t["error_detail"] for t in tops if t["error_detail"]),
            "rps": sum(t["rps"] for t in tops), "p50_us": sum(t["p50_us"] for t in tops) / len(tops),
            "p99_us": max(t["p99_us"] for t in tops), "per_namespace_rps": [round(t["rps"]) for t in tops]}


def _profiled(args, profile: tuple, session: int, level_fn) -> tuple:
    """level_fn() with py-spy on every shard's process."""
    name, py_spy = profile
    pids = sorted(shard_pids(session).items())
    seconds, summaries = max(2, round(args.duration)), []
    def wrap(inner, who, pid):  # py-spy on `pid` while `inner` runs (nested: all record at once)
        return lambda: _keep(profiled(py_spy, pid, Path(args.profile), f"{name}-{who}", seconds, args.rate, inner),
                             summaries)

    fn = level_fn
    for who, pid in pids:
        fn = wrap(fn, who, pid)
    return fn(), summaries


def _keep(result: tuple, summaries: list):
    level, summary = result
    summaries.append({k: v for k, v in summary.items() if k != "summary"})
    return level


def bench(args) -> dict:
    result = {**load.environment(), "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "tokens": args.tokens, "topk": args.topk, "experts": args.experts, "duration_s": args.duration,
              "connections": args.connections, "wrk_version": load_wrk.wrk_version(args.wrk), "backend": args.backend,
              "shard_gpus": args.shard_gpus, "rows": []}
    py_spy = find_py_spy(None) if args.profile else None

    proc, url = load.start_server(args.backend, None)
    try:
        _, fid, _ = load.setup(url, {}, args)
        result["rows"].append({"target": f"segfuse serve --backend {args.backend}", "shards": 1, "levels":
                               levels(args, [(url, fid, "default")], -1, servers={proc.pid})})
        print(_line(result["rows"][-1]), flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
    for n, busy in [(n, b) for n in args.shards if n >= 2 for b in args.busy_poll]:
        extra = ("--router-busy-poll",) if busy else ()
        proc, urls = start_group(args.backend, None, n, args.backend == "cupy", route=True, extra=extra)
        try:
            spaces = namespaces(n)
            fids = [load.setup(urls[0], {"Segfuse-Namespace": ns}, args)[1] for ns in spaces]
            result["rows"].append({"target": f"serve --processes {n}{' --mps' if args.backend == 'cupy' else ''} --route"
                                             f"{' --router-busy-poll' if busy else ''}",
                                   "shards": n, "levels": levels(args, [(urls[0], f, ns) for f, ns in zip(fids, spaces)],
                                                                 proc.pid)})
            print(_line(result["rows"][-1]), flush=True)
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)
    for n, busy in [(n, b) for n in args.shards if args.ray for b in args.busy_poll]:
        proc, url = start_serve_ray(n, args.backend, args.shard_gpus, busy)
        polling = ", busy-polling" if busy else ""
        try:
            spaces = namespaces(n)
            fids = [load.setup(url, {"Segfuse-Namespace": ns}, args)[1] for ns in spaces]
            via = [(url, f, ns) for f, ns in zip(fids, spaces)]
            profile = (f"{n}shards{'-busy' if busy else ''}", py_spy) if py_spy else None
            result["rows"].append({"target": f"serve-ray, through the router{polling}", "shards": n,
                                   "levels": levels(args, via, proc.pid, profile)})
            print(_line(result["rows"][-1]), flush=True)
            urls = [f"{url}/shards/shard-{i}" for i in range(n)]
            direct = []
            for f, ns in zip(fids, spaces):
                with Client(shards=urls, namespace=ns) as c:
                    direct.append((c.url, f, ns))
            result["rows"].append({"target": f"serve-ray, direct mode (/shards/shard-i){polling}", "shards": n,
                                   "levels": levels(args, direct, proc.pid)})
            print(_line(result["rows"][-1]), flush=True)
        finally:
            stop(proc)
    return result


def _line(row: dict) -> str:
    a, b = row["levels"]
    return (f"{row['target']}, {row['shards']} shard(s): 1 conn {a['rps']:.0f}/s p50 {a['p50_us'] / 1e3:.1f} ms; "
            f"{b['concurrency']} conn {b['rps']:.0f}/s p99 {b['p99_us'] / 1e3:.1f} ms")


def table(result: dict) -> str:
    m = result["machine"]
    gpus = f" ({result['shard_gpus']:g} GPU each)" if result["backend"] == "cupy" else ""
    lines = [f"## segfuse serve-ray on loopback: {result['backend']} shards{gpus}, {m['cpus']} CPUs ({m['cpu_model']}), "
             f"{result['time']}",
             f"moe_problem_sizes T={result['tokens']} K={result['topk']} E={result['experts']} on a resident buffer, "
             f"wrk {result['wrk_version']}, {result['duration_s']:g} s per level, commit {result['commit']}", "",
             f"| target | shards | 1 connection: runs/s, p50, p99 | {result['connections']} connections over the "
             "shards' namespaces: runs/s (per namespace), p50, p99 | errors |",
             "| --- | ---: | --- | --- | ---: |"]
    base = result["rows"][0]["levels"][0]  # `segfuse serve` at 1 connection: the ratios' denominator
    for row in result["rows"]:
        a, b = row["levels"]
        ratio = f" ({a['rps'] / base['rps']:.2f}x, p50 {a['p50_us'] / base['p50_us']:.2f}x)" if a is not base else ""
        lines.append(f"| {row['target']} | {row['shards']} | {a['rps']:,.0f}, {a['p50_us'] / 1e3:.2f} ms, "
                     f"{a['p99_us'] / 1e3:.1f} ms{ratio} | {b['rps']:,.0f} ({', '.join(map(str, b['per_namespace_rps']))}), "
                     f"{b['p50_us'] / 1e3:.1f} ms, {b['p99_us'] / 1e3:.1f} ms | {a['errors'] + b['errors']} |")
    groups = list(dict.fromkeys(g for row in result["rows"] for g in row["levels"][1]["cpu"]))
    lines += ["", f"CPU time per run at {result['connections']} connections, by process (us; cores busy in "
              "brackets; the machine has " + str(m["cpus"]) + "):", "",
              "| target | shards | " + " | ".join(groups) + " |", "| --- | ---: |" + " ---: |" * len(groups)]
    for row in result["rows"]:
        cpu = row["levels"][1]["cpu"]
        cells = [f"{cpu[g]['us_per_request']:,.0f} ({cpu[g]['cores']:.2f})" if g in cpu else "" for g in groups]
        lines.append(f"| {row['target']} | {row['shards']} | " + " | ".join(cells) + " |")
    for row in result["rows"]:
        for p in row["levels"][0].get("profiles", []):
            lines += ["", p.get("markdown") or f"{p['name']}: {p.get('error')}"]
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="numpy", choices=["numpy", "cupy"],
                   help="of the shards and the direct server (cupy: a GPU per shard, so N shards need N GPUs)")
    p.add_argument("--shard-gpus", type=float, default=1,
                   help="GPUs per CuPy shard (0.5: two shards on one GPU, as on a one-GPU machine)")
    p.add_argument("--shards", default="1,2", help="comma-separated shard counts (default 1,2)")
    p.add_argument("--connections", type=int, default=8, help="wrk connections of the second level, in all")
    p.add_argument("--ray", action=argparse.BooleanOptionalAction, default=True,
                   help="the serve-ray rows (--no-ray: `segfuse serve --processes N --route` only, no Ray needed)")
    p.add_argument("--router-busy-poll", dest="busy_poll", choices=["off", "on", "both"], default="both",
                   help="the router's busy polling (serve-ray --router-busy-poll); both: each, one after the other")
    p.add_argument("--wrk-threads", type=int, default=1, help="threads of each wrk")
    p.add_argument("--wrk", help="the wrk binary (default: wrk on PATH)")
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--topk", type=int, default=8)
    p.add_argument("--experts", type=int, default=256)
    p.add_argument("--duration", type=float, default=5.0, help="seconds per level (whole seconds)")
    p.add_argument("--profile", help="folder for py-spy profiles of the shards' processes")
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "out"))
    args = p.parse_args(argv)
    args.shards = sorted({int(x) for x in args.shards.split(",") if x.strip()})
    if not args.shards or min(args.shards) < 1:
        p.error("--shards takes positive integers")
    args.busy_poll = {"off": [False], "on": [True], "both": [False, True]}[args.busy_poll]
    args.wrk = load_wrk.find_wrk(args.wrk)
    if not args.wrk:
        p.error("needs wrk on PATH or --wrk PATH (Debian: apt-get install wrk)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    result = bench(args)
    print(table(result))
    load_report.save(result, args.out, "load-ray")
    errors = sum(lv["errors"] for row in result["rows"] for lv in row["levels"])
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
