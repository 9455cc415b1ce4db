"""The restart window of a `segfuse serve-ray` shard: SIGKILL a shard's process (as a crash would) and
record, request by request, what clients of its namespace see until Ray has a new one up: through
the router and on the shard's own route (direct mode), and what the other shard's namespace sees
meanwhile. Each poller sends one request at a time (GET of a buffer the dead shard held), with a
timeout of --timeout seconds; a request is stamped when sent and when answered.

Reports per kill: how long until the first answer of the dead shard's namespace, which answers came
before the documented 404 ("shard shard-1 restarted at ..."), how long until that 404, until a put
and a run work again, the longest wait of one request, and the other shard's worst latency.

    python benchmarks/restart_window.py --kills 3
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import sys
import threading
import time
from pathlib import Path

import httpx
import load_report
import numpy as np
from load_ray import namespaces, shard_pids, start_serve_ray, stop
from segfuse.client import Buffer, Client

ROOT = Path(__file__).resolve().parent.parent
GRAPH = {"format": "segfuse.fusion/1", "name": "hist",
         "inputs": [{"name": "ids", "dtype": "int64", "shape": ["N"]}],
         "ops": [{"op": "full", "out": "z", "shape": [16], "value": 0, "dtype": "int64"},
                 {"op": "full_like", "out": "one", "inputs": ["ids"], "value": 1},
                 {"op": "scatter", "out": "counts", "inputs": ["z", "ids", "one"], "dim": 0, "reduce": "add"}],
         "outputs": ["counts"]}


def kind(answer) -> str:
    """What one request got: a status (404+note: the documented one), or the exception's class."""
    if isinstance(answer, Exception):
        return type(answer).__name__
    if answer.status_code == 404 and "restarted at" in answer.text:
        return "404 restarted"
    return str(answer.status_code)


class Poller(threading.Thread):
    """GET `path` in `namespace`, one request at a time, until stopped; (sent, answered, kind, text)."""

    def __init__(self, url: str, path: str, namespace: str, timeout: float):
        super().__init__(daemon=True)
        self.url, self.path, self.headers, self.timeout = url, path, {"Segfuse-Namespace": namespace}, timeout
        self.log: list[tuple[float, float, str, str]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=self.timeout) as c:
            while not self.halt.is_set():
                sent = time.monotonic()
                try:
                    answer = c.get(self.url + self.path, headers=self.headers)
                    text = answer.text[:200]
                except httpx.HTTPError as e:
                    answer, text = e, str(e)[:200]
                self.log.append((sent, time.monotonic(), kind(answer), text))
                self.halt.wait(0.02)


def one_kill(url: str, session: int, args) -> dict:
    lost_ns, kept_ns = namespaces(2)[1], namespaces(2)[0]  # on shard-1 (killed) and shard-0
    ids = np.arange(32) % 16
    with Client(url, namespace=lost_ns) as a, Client(url, namespace=kept_ns) as b:
        a.register(GRAPH, replace=True)
        a.put("lost", ids)
        b.put("kept", ids)
    pid = shard_pids(session)["shard-1"]
    pollers = {"router": Poller(url, "/v2/buffers/lost", lost_ns, args.timeout),
               "direct": Poller(url + "/shards/shard-1", "/v2/buffers/lost", lost_ns, args.timeout),
               "other shard": Poller(url, "/v2/buffers/kept", kept_ns, args.timeout)}
    for p in pollers.values():
        p.start()
    time.sleep(0.5)
    killed = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    working = None
    deadline = killed + args.limit
    with Client(url, namespace=lost_ns, retries=0, timeout=args.timeout) as a:
        while time.monotonic() < deadline:  # a put and a run in the lost namespace, until both work
            try:
                a.put("again", ids)
                res = a.run("hist", inputs={"ids": Buffer("again")})
                if np.array_equal(res["counts"], np.bincount(ids, minlength=16)):
                    working = time.monotonic() - killed
                    break
            except Exception:  # noqa: BLE001 - what the window gives; the pollers record it
                pass
            time.sleep(0.05)
    time.sleep(0.5)
    for p in pollers.values():
        p.halt.set()
    for p in pollers.values():
        p.join(args.timeout + 5)
    out = {"killed_pid": pid, "working_after_s": working, "pollers": {}}
    for name, p in pollers.items():
        after = [(s - killed, r - killed, k, t) for s, r, k, t in p.log if r >= killed]
        note = next((r for s, r, k, t in after if k == "404 restarted"), None)
        before = [k for s, r, k, t in after if note is None or r < note]
        first = after[0][1] if after else None
        out["pollers"][name] = {
            "first_answer_s": first, "documented_404_s": note,
            "before_404": dict(collections.Counter(before)),
            "longest_wait_s": max((r - s for s, r, k, t in after), default=None),
            "examples": {k: t for s, r, k, t in reversed(after)}, "requests": len(after)}
    return out


def table(result: dict) -> str:
    lines = [f"## Restart window of a serve-ray shard: {result['time']}",
             f"{result['machine']['cpus']} CPUs ({result['machine']['cpu_model']}), commit {result['commit']}; "
             "times in seconds after the SIGKILL", "",
             "| kill | poller | first answer | documented 404 | answers before it | longest wait of one request | "
             "put + run work |", "| ---: | --- | ---: | ---: | --- | ---: | ---: |"]
    for i, k in enumerate(result["kills"], 1):
        for name, p in k["pollers"].items():
            seen = ", ".join(f"{n}x {what}" for what, n in p["before_404"].items())
            lines.append(f"| {i} | {name} | {_s(p['first_answer_s'])} | {_s(p['documented_404_s'])} | {seen} | "
                         f"{_s(p['longest_wait_s'])} | {_s(k['working_after_s']) if name == 'router' else ''} |")
    return "\n".join(lines)


def _s(x) -> str:
    return "never" if x is None else f"{x:.2f}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=3)
    p.add_argument("--timeout", type=float, default=30.0, help="seconds one polling request may take")
    p.add_argument("--limit", type=float, default=120.0, help="seconds to wait for a working shard")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "out"))
    args = p.parse_args(argv)
    import load

    result = {**load.environment(), "time": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "kills": []}
    proc, url = start_serve_ray(2)
    try:
        for _ in range(args.kills):
            result["kills"].append(one_kill(url, proc.pid, args))
            print(table({**result, "kills": result["kills"][-1:]}).splitlines()[-3:], flush=True)
            time.sleep(2)
    finally:
        stop(proc)
    print(table(result))
    load_report.save(result, args.out, "restart-window")
    return 0 if all(k["working_after_s"] is not None for k in result["kills"]) else 1


if __name__ == "__main__":
    sys.exit(main())
