"""The wrk side of the load benchmark: finding wrk, choosing its threads, running one level with
benchmarks/wrk/{infer,health}.lua and reading the JSON line their `done` hook prints."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

WRK_DIR = Path(__file__).resolve().parent / "wrk"
MARK = "SEGFUSE_WRK "


def find_wrk(path: str | None) -> str | None:
    """The wrk to use: `path` if given (it must run), else the one on PATH, else None."""
    if path:
        if shutil.which(path) is None:
            raise SystemExit(f"--wrk {path}: not an executable")
        return shutil.which(path)
    return shutil.which("wrk")


def wrk_version(wrk: str) -> str:
    try:
        out = subprocess.run([wrk, "-v"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({e})"
    first = (out.stdout or out.stderr).strip().splitlines()
    return first[0].split(" [")[0].removeprefix("wrk ") if first else "unknown"


def default_threads(cpus: int | None = None) -> int:
    """A quarter of the CPUs (1 on this 2-core machine, 4 on a 16-core one): the rest stay with the
    server, whose event loop and run thread need a core each."""
    return max(1, (cpus or os.cpu_count() or 2) // 4)


def threads_for(connections: int, cap: int) -> int:
    """The most threads <= cap that divide `connections`: wrk gives each thread
    connections // threads connections and drops the remainder."""
    t = max(1, min(cap, connections))
    while connections % t:
        t -= 1
    return t


def run_wrk(wrk: str, url: str, script: str, connections: int, threads: int, duration: float,
            script_args: tuple = (), token: str | None = None) -> dict:
    """One wrk run; the level's numbers, in the same shape as the Python client's."""
    seconds = max(1, round(duration))  # wrk takes whole seconds
    cmd = [wrk, "-t", str(threads), "-c", str(connections), "-d", f"{seconds}s", "--timeout", "30s",
           "-s", str(WRK_DIR / script), url]
    if script_args:
        cmd += ["--", *map(str, script_args)]
    env = dict(os.environ)
    env.pop("SEGFUSE_TOKEN", None)
    if token:
        env["SEGFUSE_TOKEN"] = token
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 60, env=env)
    except subprocess.TimeoutExpired:
        raise SystemExit(f"wrk did not finish in {seconds + 60} s: {' '.join(cmd)}") from None
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith(MARK)), None)
    if out.returncode != 0 or line is None:
        raise SystemExit(f"wrk failed (status {out.returncode}): {' '.join(cmd)}\n{out.stdout}\n{out.stderr}")
    return level_from_report(json.loads(line[len(MARK):]), connections)


def level_from_report(rep: dict, connections: int) -> dict:
    lat, sock = rep["latency_us"], rep["socket_errors"]
    seconds = rep["duration_us"] / 1e6
    ok = rep["requests"] - rep["non_2xx"]
    errors = rep["non_2xx"] + sum(sock.values())
    detail = []
    if rep["non_2xx"]:
        detail.append(f"{rep['non_2xx']} non-2xx (first: {rep['first_bad']})")
    detail += [f"{n} {kind} errors" for kind, n in sock.items() if n]
    return {"client": "wrk", "concurrency": connections, "workers": rep["threads"], "requests": ok,
            "errors": errors, "error_detail": "; ".join(detail), "seconds": seconds,
            "rps": ok / seconds if seconds > 0 else 0.0, "p50_us": float(lat["p50"]), "p90_us": float(lat["p90"]),
            "p99_us": float(lat["p99"]), "max_us": float(lat["max"]), "mean_us": float(lat["mean"]),
            "bytes": rep["bytes"]}


def infer_level(wrk: str, url: str, fusion_id: str, connections: int, cap: int, duration: float,
                output: str, token: str | None) -> dict:
    threads = threads_for(connections, cap)
    pool = 2 * (connections // threads)
    return run_wrk(wrk, f"{url}/v2/models/{fusion_id}/infer", "infer.lua", connections, threads, duration,
                   (output, "bench_ids", pool), token)


def health_level(wrk: str, url: str, connections: int, cap: int, duration: float) -> dict:
    return run_wrk(wrk, f"{url}/v2/health/live", "health.lua", connections, threads_for(connections, cap),
                   duration)
