"""Where one request's server time goes: py-spy's collapsed stacks of a load level (load.py
--profile) cut into cost centres, in microseconds per request from the level's rate.

    python benchmarks/profile_costs.py benchmarks/out/profile/infer-wrk-c1.txt --rps 3689

--rps is the rate of the same level without the profiler: py-spy pauses the server for every
sample (load.py's profiled levels run at a quarter to a fifth of the rate), which stretches all
Python alike, so the shares hold but the profiled level's own rate would overstate every cost.

A sample goes to the cost centre of its innermost frame that names one (CENTRES, in order): time
in C code counts for the Python function that called it (py-spy without --native), so the socket
write is uvicorn's `send`, the CUDA driver calls are the runtime's launch functions. Per request:
share x busy / rps, where busy is the event loop thread's working fraction (py-spy leaves out the
samples where it waits in epoll)."""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from profile_summary import read_stacks

# (cost centre, predicate on (function, file)); a frame names the first centre whose predicate holds
CENTRES = [
    ("result copy to the host (CuPy, pinned memory)", lambda f, p: f.startswith("CupyArrayBackend.to_host")),
    ("GPU launch and completion (segfuse.compiler, CuPy)", lambda f, p: "/compiler/" in p or "/cupy" in p),
    ("socket write (uvicorn's send)", lambda f, p: f == "RequestResponseCycle.send"),
    ("HTTP parsing and connection (uvicorn/httptools)", lambda f, p: "/uvicorn/" in p or "/httptools" in p),
    ("request decoding and checks", lambda f, p: f in {
        "decode_request", "validate_json", "BaseModel.model_validate_json", "parse_request", "check_request",
        "ParsedRequests.get", "ParsedRequests.key", "ParsedRequests.put"} and ("/server/" in p or "/pydantic" in p)),
    ("response encoding", lambda f, p: f in {"response", "dumps", "json_array", "join_body"}
        and "/server/" in p),
    ("metrics and statistics", lambda f, p: "/server/metrics.py" in p or "/server/stats.py" in p
        or "/prometheus_client/" in p),
    ("run admission, pins, batching, commit (server/runs.py ...)", lambda f, p: any(
        m in p for m in ("/server/runs.py", "/server/launch.py", "/server/run_records.py", "/server/executors.py",
                         "/server/state.py", "/server/worker.py", "/server/buffers.py"))),
    ("middleware and routing (guard, compression, fast lane)", lambda f, p: "/server/" in p),
    ("event loop (uvloop, asyncio)", lambda f, p: "/asyncio/" in p or "/uvloop/" in p),
]


def centre_of(frames: list[tuple[str, str]]) -> str:
    for func, path in reversed(frames):  # innermost first
        for name, pred in CENTRES:
            if pred(func, path):
                return name
    return "other"


def costs(path: str | Path, thread: str = "MainThread") -> tuple[Counter, int]:
    """(samples per cost centre, samples) of one thread's working samples."""
    out, total = Counter(), 0
    for name, frames, n in read_stacks(path):
        if name != thread:
            continue
        out[centre_of(frames)] += n
        total += n
    return out, total


def markdown(path: str | Path, rps: float, rate: int, seconds: float, thread: str = "MainThread") -> str:
    c, total = costs(path, thread)
    busy = min(1.0, total / (rate * seconds)) if rate and seconds else 1.0
    per_request = 1e6 / rps * busy
    lines = [f"{Path(path).name}: {total} samples of {thread}, busy {busy:.0%}, {rps:,.0f} requests/s: "
             f"{per_request:.0f} us of its time per request", "",
             "| cost centre | share | us per request |", "|---|---:|---:|"]
    for name, n in c.most_common():
        lines.append(f"| {name} | {100 * n / total:.1f}% | {per_request * n / total:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("profile")
    p.add_argument("--rps", type=float, required=True, help="the profiled level's requests per second")
    p.add_argument("--rate", type=int, default=1000, help="py-spy's samples per second")
    p.add_argument("--seconds", type=float, default=0, help="how long py-spy recorded (for the busy share)")
    p.add_argument("--thread", default="MainThread")
    a = p.parse_args(argv)
    print(markdown(a.profile, a.rps, a.rate, a.seconds, a.thread))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
