"""Load benchmark of the REST service: requests per second and p50/p99 latency of a cached MoE
fusion (moe_problem_sizes) on resident buffers, at 1, 8 and 32 concurrent clients.

Starts `segfuse serve` on a free loopback port (or uses --url), registers the fusion, uploads the
top-k ids once, warms the kernel cache, then each client loops POST /v2/models/.../infer reading the
resident buffer and writing its own output buffer (nothing but JSON headers crosses the wire).
The baseline, measured in the same run, is the same fusion called in-process through Engine.run.

    python benchmarks/load.py --quick                 # seconds, NumPy where there is no GPU
    python benchmarks/load.py --backend cupy --tokens 4096 --topk 8 --duration 10

Prints a markdown table and writes JSON to benchmarks/out/.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
EXPERTS = 16
MOE = {
    "format": "segfuse.fusion/1", "name": "moe_problem_sizes",
    "inputs": [{"name": "topk_ids", "dtype": "int64", "shape": ["T", "K"]}],
    "ops": [{"op": "reshape", "out": "flat", "inputs": ["topk_ids"], "shape": [-1]},
            {"op": "full", "out": "zeros", "shape": [EXPERTS], "value": 0, "dtype": "int64"},
            {"op": "full_like", "out": "ones", "inputs": ["flat"], "value": 1},
            {"op": "scatter", "out": "counts", "inputs": ["zeros", "flat", "ones"], "dim": 0, "reduce": "add"}],
    "outputs": ["counts"],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(backend: str, token: str | None, switch_interval: float | None = None) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(os.environ, SEGFUSE_LOG_LEVEL="warning")
    if token:
        env["SEGFUSE_TOKEN"] = token
    prelude = f"sys.setswitchinterval({switch_interval}); " if switch_interval else ""
    cmd = [sys.executable, "-c", f"import sys; {prelude}from segfuse.compiler.cli import main; sys.exit(main())",
           "serve", "--host", "127.0.0.1", "--port", str(port), "--backend", backend,
           "--max-queued-runs", "4096"]
    proc = subprocess.Popen(cmd, env=env)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"segfuse serve exited with status {proc.returncode}")
        try:
            if httpx.get(url + "/v2/health/ready", timeout=2).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise SystemExit("segfuse serve did not become ready in 120 s")


def percentile(xs: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(xs), q)) if xs else float("nan")


async def _clients(url: str, headers: dict, first: int, count: int, stop_at: float, fusion_id: str) -> dict:
    """`count` concurrent clients (ids first..first+count-1) on one httpx.AsyncClient until stop_at."""
    out = {"latencies": [], "run_us": [], "total_us": [], "errors": 0}
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60, limits=limits) as c:
        async def client(k: int) -> None:
            body = {"inputs": [{"name": "topk_ids", "parameters": {"buffer": "bench_ids"}}],
                    "outputs": [{"name": "counts", "parameters": {"buffer": f"bench_counts_{k}", "overwrite": True}}]}
            while time.time() < stop_at:
                t0 = time.perf_counter()
                r = await c.post(f"/v2/models/{fusion_id}/infer", json=body)
                dt = time.perf_counter() - t0
                if r.status_code != 200:
                    out["errors"] += 1
                    continue
                out["latencies"].append(dt)
                timings = r.json()["parameters"]["timings_us"]
                out["run_us"].append(timings.get("run", float("nan")))
                out["total_us"].append(timings.get("total", float("nan")))

        await asyncio.gather(*(client(first + k) for k in range(count)))
    return out


def _client_process(args: tuple) -> dict:
    return asyncio.run(_clients(*args))


def run_level(url: str, headers: dict, concurrency: int, duration: float, fusion_id: str, processes: int) -> dict:
    """Clients spread over up to `processes` OS processes: one Python process with httpx cannot
    drive more than a few hundred requests per second, and the client must not be what is measured."""
    import concurrent.futures
    import multiprocessing

    nproc = max(1, min(processes, concurrency))
    shares = [concurrency // nproc + (1 if i < concurrency % nproc else 0) for i in range(nproc)]
    firsts = [sum(shares[:i]) for i in range(nproc)]
    start_at = time.time() + 1.0  # let every process start before the clock runs
    stop_at = start_at + duration
    jobs = [(url, headers, firsts[i], shares[i], stop_at, fusion_id) for i in range(nproc)]
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(nproc, mp_context=ctx) as pool:
        results = list(pool.map(_client_process, jobs))
    latencies = [x for r in results for x in r["latencies"]]
    run_us = [x for r in results for x in r["run_us"]]
    total_us = [x for r in results for x in r["total_us"]]
    elapsed = stop_at - start_at  # every client stops at stop_at (plus one request in flight)
    return {"concurrency": concurrency, "client_processes": nproc, "requests": len(latencies),
            "errors": sum(r["errors"] for r in results), "seconds": elapsed, "rps": len(latencies) / elapsed,
            "p50_ms": percentile(latencies, 50) * 1e3, "p99_ms": percentile(latencies, 99) * 1e3,
            "server_run_p50_us": percentile(run_us, 50), "server_total_p50_us": percentile(total_us, 50)}


def in_process_baseline(backend: str, ids: np.ndarray, duration: float) -> dict:
    """The same fusion through Engine.run in this process: what HTTP and the queue add to."""
    from segfuse.compiler import Engine, Fusion
    from segfuse.server.backend import resolve

    engine, arrays = resolve(backend, 0, None)
    fusion = Fusion.from_json(MOE)
    dev_ids = arrays.from_host(ids)
    engine.run(fusion, {"topk_ids": dev_ids})  # warm: compile once
    times = []
    stop_at = time.perf_counter() + duration
    while time.perf_counter() < stop_at:
        t0 = time.perf_counter()
        engine.run(fusion, {"topk_ids": dev_ids})
        arrays.synchronize()
        times.append(time.perf_counter() - t0)
    _ = Engine
    return {"calls": len(times), "p50_ms": percentile(times, 50) * 1e3, "p99_ms": percentile(times, 99) * 1e3,
            "backend": arrays.name, "device": arrays.device}


async def bench(args) -> dict:
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    proc = None
    url = args.url
    if url is None:
        proc, url = start_server(args.backend, args.token, args.switch_interval)
    try:
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as c:
            meta = (await c.get("/v2")).json()
            r = await c.post("/v2/fusions", json=MOE)
            r.raise_for_status()
            fusion_id = r.json()["id"]
            rng = np.random.default_rng(0)
            ids = rng.integers(0, EXPERTS, (args.tokens, args.topk), dtype=np.int64)
            r = await c.put("/v2/buffers/bench_ids", content=ids.tobytes(),
                            headers={"content-type": "application/octet-stream"},
                            params={"dtype": "int64", "shape": f"{args.tokens},{args.topk}"})
            r.raise_for_status()
            # warm-up, and one correctness check against NumPy
            r = await c.post(f"/v2/models/{fusion_id}/infer", json={
                "inputs": [{"name": "topk_ids", "parameters": {"buffer": "bench_ids"}}]})
            r.raise_for_status()
            expect = np.bincount(ids.reshape(-1), minlength=EXPERTS).tolist()
            if r.json()["outputs"][0]["data"] != expect:
                raise SystemExit("wrong result from the server")
        levels = []
        for conc in args.concurrency:
            levels.append(await asyncio.to_thread(run_level, url, headers, conc, args.duration, fusion_id,
                                                  args.client_processes))
        async with httpx.AsyncClient(base_url=url, headers=headers, timeout=120) as c:
            for k in range(max(args.concurrency)):
                await c.delete(f"/v2/buffers/bench_counts_{k}")
            await c.delete("/v2/buffers/bench_ids")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    baseline = in_process_baseline(meta["backend"], ids, min(args.duration, 2.0)) if args.url is None else None
    return {"server": meta, "tokens": args.tokens, "topk": args.topk, "experts": EXPERTS, "duration_s": args.duration,
            "levels": levels, "in_process": baseline, "host": platform.node(), "python": platform.python_version(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def table(result: dict) -> str:
    base = result["in_process"]
    lines = [f"moe_problem_sizes T={result['tokens']} K={result['topk']} E={result['experts']}, "
             f"backend {result['server']['backend']} on {result['server']['device']}",
             "",
             "| clients | client procs | requests | errors | req/s | p50 ms | p99 ms | engine run p50 us | server total p50 us "
             "| p50 / in-process |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for lv in result["levels"]:
        ratio = f"{lv['p50_ms'] / base['p50_ms']:.1f}x" if base and base["p50_ms"] > 0 else "n/a"
        lines.append(f"| {lv['concurrency']} | {lv['client_processes']} | {lv['requests']} | {lv['errors']} | {lv['rps']:.0f} | "
                     f"{lv['p50_ms']:.2f} | {lv['p99_ms']:.2f} | {lv['server_run_p50_us']:.0f} | "
                     f"{lv['server_total_p50_us']:.0f} | {ratio} |")
    if base:
        lines += ["", f"in-process Engine.run baseline (same run): p50 {base['p50_ms'] * 1e3:.0f} us, "
                      f"p99 {base['p99_ms'] * 1e3:.0f} us over {base['calls']} calls"]
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="auto", choices=["auto", "cupy", "numpy"])
    p.add_argument("--url", help="benchmark a running server instead of starting one")
    p.add_argument("--token", default=os.environ.get("SEGFUSE_TOKEN"))
    p.add_argument("--tokens", type=int, default=4096, help="T: tokens (rows of topk_ids)")
    p.add_argument("--topk", type=int, default=8, help="K: experts per token")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per concurrency level")
    p.add_argument("--concurrency", default="1,8,32", help="comma-separated client counts")
    p.add_argument("--switch-interval", type=float, help="the server's sys.setswitchinterval (seconds)")
    p.add_argument("--client-processes", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 2)),
                   help="OS processes the clients are spread over (default: half the CPUs, at most 8)")
    p.add_argument("--quick", action="store_true", help="1 s per level, T=256 (a smoke run)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "out"), help="directory for the JSON result")
    args = p.parse_args(argv)
    args.concurrency = [int(x) for x in args.concurrency.split(",") if x.strip()]
    if args.quick:
        args.duration = min(args.duration, 1.0)
        args.tokens = min(args.tokens, 256)
    result = asyncio.run(bench(args))
    print(table(result))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"load-{result['server']['backend']}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
