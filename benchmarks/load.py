"""Load benchmark of the REST service: a cached MoE histogram (moe_problem_sizes, int64 ids) on a
resident buffer, driven by wrk and/or Python clients, next to the server's own ceiling and the
in-process Engine.run baseline, all in one run against one server.

Starts `segfuse serve` on a free loopback port (or uses --url), registers the fusion, uploads the
top-k ids once and checks one result against NumPy. Then, per client (wrk: benchmarks/wrk/*.lua;
python: httpx over several processes, the SDK user's view), each --concurrency level POSTs
/v2/models/{id}/infer reading the resident buffer; GET /v2/health/live at 1 connection and at the
top level gives the ceiling; a few dozen responses' parameters.timings_us give the server-side
breakdown (idle, and under the top level); a raw-bytes PUT/GET of one big buffer gives GB/s; and
health probes while another process PUTs/GETs a big buffer as JSON show whether the event loop
stalls. --profile DIR records the server with py-spy during extra wrk levels at 1 and at the top
connections and summarises the stacks (benchmarks/profile_summary.py).

    python benchmarks/load.py --quick                       # seconds, NumPy where there is no GPU
    python benchmarks/load.py --backend cupy --duration 10 --profile benchmarks/out/profile

Prints markdown tables and writes JSON to benchmarks/out/. Exits 1 when any request failed.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import load_bytes
import load_python
import load_wrk
import numpy as np
from load_profile import find_py_spy, profiled
from load_report import save, table

ROOT = Path(__file__).resolve().parent.parent
SECTIONS = ("infer", "health", "bytes", "stall")


def moe_graph(experts: int) -> dict:
    return {
        "format": "segfuse.fusion/1", "name": "moe_problem_sizes",
        "inputs": [{"name": "topk_ids", "dtype": "int64", "shape": ["T", "K"]}],
        "ops": [{"op": "reshape", "out": "flat", "inputs": ["topk_ids"], "shape": [-1]},
                {"op": "full", "out": "zeros", "shape": [experts], "value": 0, "dtype": "int64"},
                {"op": "full_like", "out": "ones", "inputs": ["flat"], "value": 1},
                {"op": "scatter", "out": "counts", "inputs": ["zeros", "flat", "ones"], "dim": 0, "reduce": "add"}],
        "outputs": ["counts"],
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(backend: str, token: str | None, switch_interval: float | None = None,
                 extra: tuple = ()) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = dict(os.environ, SEGFUSE_LOG_LEVEL="warning")
    if token:
        env["SEGFUSE_TOKEN"] = token
    prelude = f"sys.setswitchinterval({switch_interval}); " if switch_interval else ""
    cmd = [sys.executable, "-c", f"import sys; {prelude}from segfuse.cli import main; sys.exit(main())",
           "serve", "--host", "127.0.0.1", "--port", str(port), "--backend", backend,
           "--max-queued-runs", "4096", *extra]
    proc = subprocess.Popen(cmd, env=env)
    url = f"http://127.0.0.1:{port}"
    if not wait_ready(proc, url, 120, "segfuse serve"):
        proc.kill()
        raise SystemExit("segfuse serve did not become ready in 120 s")
    return proc, url


def wait_ready(proc: subprocess.Popen, url: str, seconds: float, what: str, poll: float = 0.1) -> bool:
    """Whether `url`/v2/health/ready answered 200 within `seconds`; exits if `proc` ends first."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited with status {proc.returncode}")
        try:
            if httpx.get(url + "/v2/health/ready", timeout=2).status_code == 200:
                return True
        except httpx.TransportError:
            pass
        time.sleep(poll)
    return False


def in_process_baseline(backend: str, ids: np.ndarray, experts: int, duration: float) -> dict:
    """The same fusion through Engine.run in this process: what HTTP and the queue add to."""
    from segfuse.compiler import Fusion
    from segfuse.server.array_backends import resolve

    engine, arrays = resolve(backend, 0, None)
    fusion = Fusion.from_json(moe_graph(experts))
    dev_ids = arrays.from_host(ids)
    engine.run(fusion, {"topk_ids": dev_ids})  # warm: compile once
    times = []
    stop_at = time.perf_counter() + duration
    while time.perf_counter() < stop_at:
        t0 = time.perf_counter()
        engine.run(fusion, {"topk_ids": dev_ids})
        arrays.synchronize()
        times.append((time.perf_counter() - t0) * 1e6)
    return {"calls": len(times), "p50_us": load_python.percentile(times, 50),
            "p99_us": load_python.percentile(times, 99), "backend": arrays.name, "device": arrays.device}


def environment() -> dict:
    """What the numbers depend on: the machine, library versions, uvicorn's choice of HTTP parser and loop."""
    def version(*names):
        for n in names:
            try:
                return importlib.metadata.version(n)
            except importlib.metadata.PackageNotFoundError:
                pass
        return None

    libs = {k: version(*names) for k, names in {
        "fastapi": ["fastapi"], "starlette": ["starlette"], "uvicorn": ["uvicorn"], "pydantic": ["pydantic"],
        "httptools": ["httptools"], "uvloop": ["uvloop"], "h11": ["h11"], "orjson": ["orjson"], "httpx": ["httpx"],
        "numpy": ["numpy"], "cupy": ["cupy-cuda13x", "cupy-cuda12x", "cupy"]}.items()}
    cpu_model = "unknown"
    try:
        cpu_model = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                timeout=10).stdout.strip() or "unknown"
    except OSError:
        commit = "unknown"
    return {"machine": {"host": platform.node(), "cpus": os.cpu_count(), "cpu_model": cpu_model,
                        "platform": platform.platform(), "python": platform.python_version()},
            "versions": libs, "commit": commit,
            # uvicorn's "auto": httptools and uvloop when they import (the server runs this Python)
            "server_stack": {"http": "httptools" if libs["httptools"] else "h11",
                             "loop": "uvloop" if libs["uvloop"] else "asyncio"}}


def setup(url: str, headers: dict, args) -> tuple[dict, str, np.ndarray]:
    """Register the fusion, store bench_ids, check one result against NumPy, warm up."""
    with httpx.Client(base_url=url, headers=headers, timeout=120) as c:
        meta = c.get("/v2").json()
        r = c.post("/v2/fusions", json=moe_graph(args.experts))
        r.raise_for_status()
        fusion_id = r.json()["id"]
        ids = np.random.default_rng(0).integers(0, args.experts, (args.tokens, args.topk), dtype=np.int64)
        r = c.put("/v2/buffers/bench_ids", content=ids.tobytes(), headers={"content-type": "application/octet-stream"},
                  params={"dtype": "int64", "shape": f"{args.tokens},{args.topk}"})
        r.raise_for_status()
        body = load_python.infer_body("inline", 0)
        r = c.post(f"/v2/models/{fusion_id}/infer", json=body)
        r.raise_for_status()
        if r.json()["outputs"][0]["data"] != np.bincount(ids.reshape(-1), minlength=args.experts).tolist():
            raise SystemExit("wrong result from the server")
        for _ in range(20):
            c.post(f"/v2/models/{fusion_id}/infer", json=body).raise_for_status()
    return meta, fusion_id, ids


def cleanup(url: str, headers: dict) -> None:
    with httpx.Client(base_url=url, headers=headers, timeout=120) as c:
        for b in c.get("/v2/buffers").json()["buffers"]:
            if b["name"].startswith("bench_"):
                c.delete(f"/v2/buffers/{b['name']}")


def run_clients(args, url: str, headers: dict, fusion_id: str, pid: int | None, result: dict) -> None:
    """Infer levels per client (with a timings sampler next to the top level of the first), the
    health ceiling, and the profiled levels."""
    top = max(args.concurrency)
    cap = args.wrk_threads or load_wrk.default_threads()
    token = args.token

    def infer(client: str, conc: int):
        if client == "wrk":
            return lambda: load_wrk.infer_level(args.wrk, url, fusion_id, conc, cap, args.duration, args.output, token)
        path = f"/v2/models/{fusion_id}/infer"
        return lambda: load_python.run_level(url, headers, conc, args.duration, args.client_processes, path, args.output)

    def health(client: str, conc: int):
        if client == "wrk":
            return lambda: load_wrk.health_level(args.wrk, url, conc, cap, args.duration)
        return lambda: load_python.run_level(url, headers, conc, args.duration, args.client_processes,
                                             "/v2/health/live", None)

    if "infer" in args.only:
        idle = load_python.TimingSampler(url, headers, fusion_id, args.output, args.samples).run()
        result["breakdown"].append(idle.summary("1 connection, nothing else running"))
        for i, client in enumerate(args.clients):
            for conc in args.concurrency:
                sampler = None
                if i == 0 and conc == top:
                    sampler = load_python.TimingSampler(url, headers, fusion_id, args.output, args.samples,
                                                        interval=max(0.02, args.duration / max(1, args.samples)))
                    sampler.start()
                result["infer"].append(infer(client, conc)())
                if sampler is not None:
                    result["breakdown"].append(sampler.stop().summary(f"next to {client} at {conc} connections"))
    if "health" in args.only:
        for client in args.clients:
            for conc in sorted({1, top}):
                result["health"].append(health(client, conc)())
    if args.profile and "infer" in args.only:
        py_spy = find_py_spy(args.py_spy)
        if py_spy is None or pid is None:
            why = "py-spy not found (pip install py-spy, or --py-spy PATH)" if py_spy is None else \
                "no server pid (give --server-pid with --url)"
            result["profiles"].append({"name": "profile", "error": why})
            return
        client = args.clients[0]
        for conc in sorted({1, top}):
            name = f"infer-{client}-c{conc}"
            level, prof = profiled(py_spy, pid, Path(args.profile), name, max(1, round(args.duration)),
                                   args.profile_rate, infer(client, conc), args.profile_native)
            result["infer"].append({**level, "profiled": True})
            result["profiles"].append(prof)


def error_lines(result: dict) -> list[str]:
    out = []
    for kind in ("infer", "health"):
        for lv in result[kind]:
            if lv["errors"]:
                out.append(f"{kind} {lv['client']} at {lv['concurrency']} connections: {lv['errors']} errors: "
                           f"{lv['error_detail']}")
    for b in result["breakdown"]:
        if b["errors"]:
            out.append(f"timings sampler ({b['label']}): {b['errors']} errors: {b['first_error']}")
    if result.get("stall") and result["stall"]["error"]:
        out.append(f"stall test: {result['stall']['error']}")
    for p in result["profiles"]:
        if p.get("error"):
            out.append(f"profile {p['name']}: {p['error']}")
    return out


def ratios(result: dict) -> list[dict]:
    out = []
    base = result.get("in_process")
    for client in args_clients(result):
        one = next((lv for lv in result["infer"] if lv["client"] == client and lv["concurrency"] == 1
                    and not lv.get("profiled")), None)
        h1 = next((h for h in result["health"] if h["client"] == client and h["concurrency"] == 1), None)
        if one and h1 and h1["rps"]:
            out.append({"what": f"{client}: infer / health rate at 1 connection",
                        "value": f"{one['rps']:.0f} / {h1['rps']:.0f} = {one['rps'] / h1['rps']:.2f}"})
        if one and base and base["p50_us"] > 0:
            out.append({"what": f"{client}: p50 at 1 connection / in-process p50",
                        "value": f"{one['p50_us']:.0f} / {base['p50_us']:.0f} us = {one['p50_us'] / base['p50_us']:.1f}x"})
    return out


def args_clients(result: dict) -> list[str]:
    return list(dict.fromkeys(lv["client"] for lv in result["infer"] + result["health"]))


def bench(args) -> dict:
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    proc, url = (None, args.url.rstrip("/")) if args.url else start_server(args.backend, args.token,
                                                                            args.switch_interval)
    pid = proc.pid if proc is not None else args.server_pid
    result = {**environment(), "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "tokens": args.tokens,
              "topk": args.topk, "experts": args.experts, "output": args.output, "duration_s": args.duration,
              "concurrency": args.concurrency, "clients": args.clients, "sections": args.only,
              "wrk_version": load_wrk.wrk_version(args.wrk) if "wrk" in args.clients else None,
              "infer": [], "health": [], "breakdown": [], "profiles": [], "bytes": None, "stall": None}
    try:
        result["server"], fusion_id, ids = setup(url, headers, args)
        run_clients(args, url, headers, fusion_id, pid, result)
        if "bytes" in args.only:
            result["bytes"] = load_bytes.transfer(url, args.token, args.bytes_size, args.bytes_repeat)
        if "stall" in args.only:
            result["stall"] = load_bytes.stall(url, args.token, args.stall_size, args.stall_seconds,
                                               args.stall_interval_ms / 1e3)
        cleanup(url, headers)
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(30)
    if "infer" in args.only:
        result["in_process"] = in_process_baseline(result["server"]["backend"], ids, args.experts,
                                                   min(args.duration, 2.0))
    result["ratios"] = ratios(result)
    result["error_lines"] = error_lines(result)
    return result


def _size(text: str) -> int:
    from segfuse.server.settings import parse_size

    return parse_size(text)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="auto", choices=["auto", "cupy", "numpy"])
    p.add_argument("--url", help="benchmark a running server instead of starting one")
    p.add_argument("--server-pid", type=int, help="with --url and --profile: the server's process id")
    p.add_argument("--token", default=os.environ.get("SEGFUSE_TOKEN"))
    p.add_argument("--tokens", type=int, default=4096, help="T: tokens (rows of topk_ids)")
    p.add_argument("--topk", type=int, default=8, help="K: experts per token")
    p.add_argument("--experts", type=int, default=256, help="E: experts (histogram bins)")
    p.add_argument("--duration", type=float, default=10.0, help="seconds per level (wrk: whole seconds)")
    p.add_argument("--concurrency", default="1,8,32,64", help="comma-separated connection counts")
    p.add_argument("--client", choices=["wrk", "python", "both"],
                   help="load generator (default: both when wrk is found, else python)")
    p.add_argument("--wrk", help="the wrk binary (default: wrk on PATH)")
    p.add_argument("--wrk-threads", type=int, help="at most this many wrk threads (default: a quarter of the CPUs)")
    p.add_argument("--output", choices=["inline", "buffer"], default="inline",
                   help="inline: counts in the JSON response; buffer: stored under a name per client/thread")
    p.add_argument("--switch-interval", type=float, help="the server's sys.setswitchinterval (seconds)")
    p.add_argument("--client-processes", type=int, default=max(1, min(8, (os.cpu_count() or 2) // 2)),
                   help="OS processes the Python clients are spread over (default: half the CPUs, at most 8)")
    p.add_argument("--samples", type=int, default=48, help="responses sampled for the timings breakdown")
    p.add_argument("--bytes-size", type=_size, default="64M", help="raw PUT/GET buffer size (default 64M)")
    p.add_argument("--bytes-repeat", type=int, default=5, help="PUTs and GETs each; the median counts")
    p.add_argument("--stall-size", type=_size, default="64M", help="the buffer sent as JSON in the stall test")
    p.add_argument("--stall-seconds", type=float, help="stall test length (default: --duration; at least one PUT+GET)")
    p.add_argument("--stall-interval-ms", type=float, default=5.0, help="health probe interval in the stall test")
    p.add_argument("--only", default=",".join(SECTIONS), help=f"sections to run, of {','.join(SECTIONS)}")
    p.add_argument("--profile", metavar="DIR", help="py-spy the server during extra wrk levels at 1 and top connections")
    p.add_argument("--py-spy", help="the py-spy binary (default: on PATH or next to this Python)")
    p.add_argument("--profile-rate", type=int, default=1000, help="py-spy samples per second")
    p.add_argument("--profile-native", action="store_true", help="py-spy --native: C frames too")
    p.add_argument("--quick", action="store_true", help="1 s per level, T=256, 1 MiB bodies (a smoke run)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "out"), help="directory for the JSON result")
    args = p.parse_args(argv)
    args.concurrency = sorted({int(x) for x in args.concurrency.split(",") if x.strip()})
    args.only = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = [s for s in args.only if s not in SECTIONS]
    if bad:
        p.error(f"--only takes {','.join(SECTIONS)}, not {','.join(bad)}")
    if not args.concurrency or min(args.concurrency) < 1:
        p.error("--concurrency takes positive integers")
    if args.quick:
        args.duration = min(args.duration, 1.0)
        args.tokens = min(args.tokens, 256)
        args.bytes_size = min(args.bytes_size, 1 << 20)
        args.stall_size = min(args.stall_size, 1 << 20)
        args.bytes_repeat = min(args.bytes_repeat, 3)
        args.samples = min(args.samples, 12)
    if args.stall_seconds is None:
        args.stall_seconds = args.duration
    args.wrk = load_wrk.find_wrk(args.wrk)
    client = args.client or ("both" if args.wrk else "python")
    if client != "python" and not args.wrk:
        p.error("--client wrk needs wrk on PATH or --wrk PATH (Debian: apt-get install wrk)")
    args.clients = {"both": ["wrk", "python"], "wrk": ["wrk"], "python": ["python"]}[client]
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    result = bench(args)
    print(table(result))
    save(result, args.out, f"load-{result['server']['backend']}")
    if result["error_lines"]:
        print(f"\n{len(result['error_lines'])} ERROR(S): see the list at the top of the tables", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
