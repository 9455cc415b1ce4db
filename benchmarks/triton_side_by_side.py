"""segfuse against a real NVIDIA Triton Inference Server, side by side on one machine, serving the same MoE
histogram (counts = zeros(256).scatter_add(0, topk_ids.flatten(), ones), int64 ids [T, 8]).

Triton is the tritonserver 2.51.0 of the `nvidia-pytriton` 0.7.0 wheel from PyPI, in its own venv
(benchmarks/triton_setup.sh lays it out under benchmarks/out/triton), serving benchmarks/triton_models/ (a
Python-backend model). segfuse is `segfuse serve --backend numpy` (or cupy) with the moe_problem_sizes fusion
registered with E=256 experts. Both run at the same time; every request is checked against NumPy on both first.

In alternating rounds (the order of the two servers flips each round) wrk measures, at each connection count:
GET /v2/health/live; infer with binary tensors at T=1 and T=4096 (request and response); infer with JSON at T=4096;
and, for segfuse, infer reading the ids from a resident buffer. The same body files go to both servers
(wrk/post_body.lua). Around each cell the servers' /v2/models/{m}/stats give their own time per request. Then
Triton's perf_analyzer (from the tritonclient 2.51.0 wheel) runs against both at concurrency 1 and 8, over HTTP
and over gRPC (both servers serve KServe v2 gRPC too: segfuse with --grpc-port, Triton with --allow-grpc).

    bash benchmarks/triton_setup.sh                         # once: Triton's venv and layout (PyPI)
    python3 benchmarks/triton_side_by_side.py --duration 5 --rounds 2
    python3 benchmarks/triton_side_by_side.py --segfuse-backend cupy --triton-histogram torch   # GPU host

Prints Markdown tables and writes benchmarks/results/triton_side_by_side-<backend>.json (the latest run).
Exits 1 when a request failed.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import load
import load_wrk
import numpy as np
import triton_report
from triton_server import EXPERTS, MODEL, MODELS, TOPK, start_triton, stop, triton_env

HERE = Path(__file__).resolve().parent
BINARY = "application/octet-stream"


def request_bodies(ids_small: np.ndarray, ids_large: np.ndarray, directory: Path) -> dict:
    """The infer cells' bodies as files: {cell: (path, content type, Inference-Header-Content-Length or "")}."""
    def binary(ids: np.ndarray) -> tuple[bytes, str]:
        head = json.dumps({"inputs": [{"name": "topk_ids", "shape": list(ids.shape), "datatype": "INT64",
                                       "parameters": {"binary_data_size": ids.nbytes}}],
                           "outputs": [{"name": "counts", "parameters": {"binary_data": True}}]}).encode()
        return head + ids.tobytes(), str(len(head))

    def as_json(ids: np.ndarray) -> bytes:
        return json.dumps({"inputs": [{"name": "topk_ids", "shape": list(ids.shape), "datatype": "INT64",
                                       "data": ids.reshape(-1).tolist()}]}).encode()

    bodies = {}
    for key, (body, header) in {"binary_t1": binary(ids_small), "binary_t4096": binary(ids_large),
                                "json_t4096": (as_json(ids_large), "")}.items():
        path = directory / f"{key}.body"
        path.write_bytes(body)
        bodies[key] = (path, BINARY if header else "application/json", header)
    return bodies


def resident_body(directory: Path) -> tuple[Path, str, str]:
    path = directory / "resident_t4096.body"
    path.write_text(json.dumps({"inputs": [{"name": "topk_ids", "parameters": {"buffer": "bench_ids"}}]}))
    return path, "application/json", ""


def response_counts(r: httpx.Response) -> np.ndarray:
    """The counts of an infer response, JSON or binary."""
    r.raise_for_status()
    n = r.headers.get("inference-header-content-length")
    if n is None:
        return np.asarray(r.json()["outputs"][0]["data"], dtype=np.int64)
    head = json.loads(r.content[:int(n)])
    size = head["outputs"][0]["parameters"]["binary_data_size"]
    return np.frombuffer(r.content[int(n):int(n) + size], dtype=np.int64)


def check_bodies(urls: dict, bodies: dict, expected: dict) -> None:
    """Every body on every server that serves it gives NumPy's counts."""
    with httpx.Client(timeout=60) as c:
        for cell, (path, ctype, header) in bodies.items():
            headers = {"content-type": ctype, **({"inference-header-content-length": header} if header else {})}
            for server in triton_report.CELL_BY_KEY[cell].servers:
                r = c.post(f"{urls[server]}/v2/models/{MODEL}/infer", content=path.read_bytes(), headers=headers)
                got = response_counts(r)
                if not np.array_equal(got, expected[cell]):
                    raise SystemExit(f"{server}: wrong counts for {cell}")


def model_repository(histogram: str, scratch: Path) -> Path:
    """benchmarks/triton_models, or a copy of it whose model computes with `histogram`."""
    repo = MODELS
    if histogram == "numpy":
        return repo
    copy = scratch / "triton_models"
    shutil.copytree(repo, copy, ignore=shutil.ignore_patterns("__pycache__"))
    config = copy / MODEL / "config.pbtxt"
    config.write_text(config.read_text().replace('string_value: "numpy"', f'string_value: "{histogram}"'))
    return copy


def setup_segfuse(url: str, ids: np.ndarray) -> None:
    with httpx.Client(base_url=url, timeout=120) as c:
        c.post("/v2/fusions", json=load.moe_graph(EXPERTS)).raise_for_status()
        c.put("/v2/buffers/bench_ids", content=ids.tobytes(), headers={"content-type": BINARY},
              params={"dtype": "int64", "shape": f"{ids.shape[0]},{ids.shape[1]}"}).raise_for_status()


def model_stats(url: str) -> dict | None:
    try:
        r = httpx.get(f"{url}/v2/models/{MODEL}/stats", timeout=30)
        return r.json() if r.status_code == 200 else None
    except httpx.HTTPError:
        return None


def measure(args, server: str, url: str, cell: str, bodies: dict, connections: int) -> dict:
    """One wrk level of one cell on one server, with the server's own time per request around it."""
    threads = load_wrk.threads_for(connections, args.wrk_threads)
    before = model_stats(url) if cell != "health" else None
    if cell == "health":
        level = load_wrk.run_wrk(args.wrk, f"{url}/v2/health/live", "health.lua", connections, threads,
                                 args.duration)
    else:
        path, ctype, header = bodies[cell]
        level = load_wrk.run_wrk(args.wrk, f"{url}/v2/models/{MODEL}/infer", "post_body.lua", connections,
                                 threads, args.duration, (path, ctype, header))
    after = model_stats(url) if cell != "health" else None
    return {**level, "server": server, "cell": cell, "connections": connections,
            "server_us": triton_report.stats_delta(before, after)}


def run_rounds(args, urls: dict, bodies: dict) -> list[dict]:
    runs = []
    for rnd in range(args.rounds):
        order = triton_report.SERVERS if rnd % 2 == 0 else triton_report.SERVERS[::-1]
        for cell in args.cells:
            for conns in args.connections:
                for server in order:
                    if server not in triton_report.CELL_BY_KEY[cell].servers:
                        continue
                    run = measure(args, server, urls[server], cell, bodies, conns)
                    runs.append({**run, "round": rnd})
                    print(f"round {rnd + 1}/{args.rounds} {server:8s} {cell:15s} c={conns:<3d} "
                          f"{run['rps']:9,.0f} req/s  p50 {run['p50_us']:8,.0f} us  p99 {run['p99_us']:8,.0f} us"
                          + (f"  {run['errors']} ERRORS: {run['error_detail']}" if run["errors"] else ""), flush=True)
    return runs


def run_perf_analyzer(args, env: dict, urls: dict, ids: np.ndarray, scratch: Path) -> tuple[dict, str | None]:
    """perf_analyzer over each of --pa-protocols at each --pa-concurrency against both servers (order
    flipping per level), binary T=4096: {protocol: {server: rows}}. `urls`: {protocol: {server: address}}."""
    pa = args.perf_analyzer or env.get("PERF_ANALYZER") or ""
    if args.pa_concurrency == [] or not pa or not Path(pa).exists():
        return {}, "not run (" + ("--pa-concurrency empty" if args.pa_concurrency == [] else "no binary") + ")"
    data = scratch / "pa_input.json"
    data.write_text(json.dumps({"data": [{"topk_ids": {"content": ids.reshape(-1).tolist(),
                                                       "shape": list(ids.shape)}}]}))
    out: dict = {protocol: {s: [] for s in triton_report.SERVERS} for protocol in args.pa_protocols}
    levels = [(protocol, conc) for protocol in args.pa_protocols for conc in args.pa_concurrency]
    for i, (protocol, conc) in enumerate(levels):
        for server in (triton_report.SERVERS if i % 2 == 0 else triton_report.SERVERS[::-1]):
            csv_path = scratch / f"pa-{protocol}-{server}-{conc}.csv"
            cmd = [pa, "-m", MODEL, "-u", urls[protocol][server].removeprefix("http://"), "-i", protocol, "-b", "1",
                   "--input-data", str(data), "--concurrency-range", f"{conc}:{conc}",
                   "--measurement-interval", str(args.pa_interval_ms), "--stability-percentage", "100",
                   "--max-trials", "5", "-f", str(csv_path)]
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
            if p.returncode != 0 or not csv_path.exists():
                return out, f"failed on {server} over {protocol} at concurrency {conc} (status {p.returncode}): " \
                            f"{(p.stdout + p.stderr)[-400:]}"
            rows = triton_report.parse_perf_csv(csv_path.read_text())
            out[protocol][server] += rows
            print(f"perf_analyzer {protocol:4s} {server:8s} c={conc:<3d} " + ", ".join(
                f"{r['rps']:,.0f} infer/s p50 {r['p50_us']:,.0f} us" for r in rows), flush=True)
    return out, None


def tree_changes() -> list[str]:
    """Files changed against the commit (the numbers are of the working tree)."""
    try:
        out = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=HERE.parent,
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [ln[3:] for ln in out.splitlines() if ln.strip()]


def triton_version(url: str) -> str:
    try:
        return httpx.get(f"{url}/v2", timeout=10).json().get("version", "?")
    except (httpx.HTTPError, ValueError):
        return "?"


def bench(args) -> dict:
    env = triton_env(args.triton_dir)
    scratch = Path(tempfile.mkdtemp(prefix="triton_side_by_side-"))
    rng = np.random.default_rng(0)
    ids_small = rng.integers(0, EXPERTS, (1, TOPK), dtype=np.int64)
    ids_large = rng.integers(0, EXPERTS, (args.tokens, TOPK), dtype=np.int64)
    bodies = {**request_bodies(ids_small, ids_large, scratch), "resident_t4096": resident_body(scratch)}
    expected = {k: np.bincount((ids_small if k == "binary_t1" else ids_large).reshape(-1), minlength=EXPERTS)
                for k in bodies}
    result = {**load.environment(), "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "segfuse_backend": args.segfuse_backend, "triton_histogram": args.triton_histogram,
              "duration_s": args.duration, "rounds": args.rounds, "connections": args.connections,
              "cells": args.cells, "tokens": args.tokens, "experts": EXPERTS, "topk": TOPK,
              "wrk_version": load_wrk.wrk_version(args.wrk), "tree_changes": tree_changes()}
    triton = segfuse = None
    try:
        log = scratch / "tritonserver.log"
        grpc = {"triton": load.free_port(), "segfuse": load.free_port()}  # (perf_analyzer -i grpc)
        triton, triton_url = start_triton(env, model_repository(args.triton_histogram, scratch), log,
                                          ("--allow-grpc", "true", "--grpc-address", "127.0.0.1",
                                           "--grpc-port", str(grpc["triton"])))
        segfuse, segfuse_url = load.start_server(args.segfuse_backend, None, extra=("--grpc-port", str(grpc["segfuse"])))
        urls = {"triton": triton_url, "segfuse": segfuse_url}
        setup_segfuse(segfuse_url, ids_large)
        check_bodies(urls, bodies, expected)
        result["triton_version"] = triton_version(triton_url)
        for url in urls.values():  # warm both (first runs compile or start the stub's imports)
            with httpx.Client(timeout=60) as c:
                path, ctype, header = bodies["binary_t4096"]
                for _ in range(20):
                    c.post(f"{url}/v2/models/{MODEL}/infer", content=path.read_bytes(),
                           headers={"content-type": ctype, "inference-header-content-length": header})
        result["runs"] = run_rounds(args, urls, bodies)
        result["perf_analyzer"], result["perf_analyzer_note"] = run_perf_analyzer(
            args, env, {"http": urls, "grpc": {s: f"127.0.0.1:{p}" for s, p in grpc.items()}}, ids_large, scratch)
        result["final_stats"] = {s: model_stats(u) for s, u in urls.items()}
    finally:
        stop(segfuse)
        stop(triton, group=True)
        if args.keep_scratch:
            print(f"scratch (bodies, Triton's log, perf_analyzer CSVs): {scratch}")
        else:
            shutil.rmtree(scratch, ignore_errors=True)
    summary = triton_report.summarize(result["runs"])
    result["rows"] = triton_report.compare(summary, args.cells, args.connections)
    result["errors"] = sum(r["errors"] for r in result["runs"])
    return result


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--segfuse-backend", default="numpy", choices=["numpy", "cupy", "auto"],
                   help="segfuse serve --backend (cupy on a GPU host)")
    p.add_argument("--triton-histogram", default="numpy", choices=["numpy", "torch"],
                   help="the Triton model's computation: np.bincount, or torch.bincount on the GPU when torch sees "
                        "one (needs torch in Triton's venv: EXTRA=torch bash benchmarks/triton_setup.sh)")
    p.add_argument("--triton-dir", type=Path, default=HERE / "out" / "triton",
                   help="where benchmarks/triton_setup.sh laid out Triton (default benchmarks/out/triton)")
    p.add_argument("--duration", type=float, default=5.0, help="seconds per cell and server (wrk: whole seconds)")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds (medians over them are reported)")
    p.add_argument("--connections", default="1,8,32", help="comma-separated connection counts")
    p.add_argument("--cells", default=",".join(c.key for c in triton_report.CELLS),
                   help="comma-separated requests to measure, of " + ",".join(c.key for c in triton_report.CELLS))
    p.add_argument("--tokens", type=int, default=4096, help="T of the large requests (the cells keep their names)")
    p.add_argument("--wrk", help="the wrk binary (default: wrk on PATH)")
    p.add_argument("--wrk-threads", type=int, help="at most this many wrk threads (default: a quarter of the CPUs)")
    p.add_argument("--perf-analyzer", help="the perf_analyzer binary (default: the one triton_setup.sh found)")
    p.add_argument("--pa-concurrency", default="1,8", help="perf_analyzer's concurrency levels; empty: skip it")
    p.add_argument("--pa-protocols", default="http,grpc", help="perf_analyzer's protocols (-i): http, grpc or both")
    p.add_argument("--pa-interval-ms", type=int, default=3000, help="perf_analyzer's measurement window")
    p.add_argument("--keep-scratch", action="store_true", help="keep the bodies, Triton's log and the CSVs")
    p.add_argument("--out", type=Path, help="the JSON result (default "
                   "benchmarks/results/triton_side_by_side-<segfuse backend>.json)")
    args = p.parse_args(argv)

    def ints(text: str, flag: str) -> list[int]:
        try:
            values = sorted({int(x) for x in text.split(",") if x.strip()})
        except ValueError:
            p.error(f"{flag} takes comma-separated integers, not {text!r}")
        if values and min(values) < 1:
            p.error(f"{flag} takes positive integers")
        return values

    args.connections = ints(args.connections, "--connections")
    args.pa_concurrency = ints(args.pa_concurrency, "--pa-concurrency")
    args.pa_protocols = [x.strip() for x in args.pa_protocols.split(",") if x.strip()]
    if not args.pa_protocols or set(args.pa_protocols) - {"http", "grpc"}:
        p.error(f"--pa-protocols takes http, grpc or both, not {','.join(args.pa_protocols) or 'nothing'}")
    if not args.connections:
        p.error("--connections needs at least one count")
    args.cells = [c.strip() for c in args.cells.split(",") if c.strip()]
    bad = [c for c in args.cells if c not in triton_report.CELL_BY_KEY]
    if bad or not args.cells:
        p.error(f"--cells takes {','.join(triton_report.CELL_BY_KEY)}, not {','.join(bad) or 'nothing'}")
    if args.rounds < 1 or args.duration <= 0:
        p.error("--rounds and --duration must be positive")
    args.wrk_threads = args.wrk_threads or load_wrk.default_threads()
    args.out = args.out or HERE / "results" / f"triton_side_by_side-{args.segfuse_backend}.json"
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    args.wrk = load_wrk.find_wrk(args.wrk)
    if not args.wrk:
        raise SystemExit("wrk not found: apt-get install -y wrk, or --wrk PATH")
    result = bench(args)
    print()
    print(triton_report.report(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str))
    print(f"\nwrote {args.out}")
    if result["errors"]:
        print(f"\n{result['errors']} failed requests: see the runs in {args.out}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
