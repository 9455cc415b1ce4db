"""The Python side of the load benchmark: httpx clients (the SDK user's view) spread over OS
processes, and a sampler of the `timings_us` that infer responses carry."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time

import httpx
import numpy as np


def percentile(xs, q: float) -> float:
    return float(np.percentile(np.asarray(xs, dtype=float), q)) if len(xs) else float("nan")


def infer_body(output: str, k: int) -> dict:
    """The infer request: reads the resident bench_ids; the counts inline or in a buffer of this client's."""
    body: dict = {"inputs": [{"name": "topk_ids", "parameters": {"buffer": "bench_ids"}}]}
    if output == "buffer":
        body["outputs"] = [{"name": "counts", "parameters": {"buffer": f"bench_counts_{k}", "overwrite": True}}]
    return body


async def _clients(url: str, headers: dict, first: int, count: int, duration: float, path: str,
                   output: str | None) -> dict:
    """`count` concurrent clients (ids first..first+count-1) on one httpx.AsyncClient for `duration`
    seconds. output None: GET `path` (health); else POST the infer body."""
    out = {"latencies": [], "run_us": [], "total_us": [], "errors": 0, "first_error": None}
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=count)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60, limits=limits) as c:
        stop_at = time.perf_counter() + duration

        async def client(k: int) -> None:
            body = infer_body(output, k) if output else None
            while time.perf_counter() < stop_at:
                t0 = time.perf_counter()
                try:
                    r = await (c.post(path, json=body) if body is not None else c.get(path))
                except httpx.HTTPError as e:
                    out["errors"] += 1
                    out["first_error"] = out["first_error"] or f"{type(e).__name__}: {e}"
                    continue
                dt = time.perf_counter() - t0
                if not 200 <= r.status_code < 300:
                    out["errors"] += 1
                    out["first_error"] = out["first_error"] or f"{r.status_code} {r.text[:160]}"
                    continue
                out["latencies"].append(dt)
                if body is not None:
                    timings = r.json()["parameters"]["timings_us"]
                    out["run_us"].append(timings.get("run", float("nan")))
                    out["total_us"].append(timings.get("total", float("nan")))

        await asyncio.gather(*(client(first + k) for k in range(count)))
    return out


def _client_process(job: tuple, barrier, results) -> None:
    """One client process: waits until every process has started (imports done), then runs."""
    try:
        barrier.wait(120)
        results.put(asyncio.run(_clients(*job)))
    except Exception as e:  # reported as errors of the level
        results.put({"latencies": [], "run_us": [], "total_us": [], "errors": 1,
                     "first_error": f"client process: {type(e).__name__}: {e}"})


def run_level(url: str, headers: dict, concurrency: int, duration: float, processes: int, path: str,
              output: str | None) -> dict:
    """Clients spread over up to `processes` OS processes: one Python process with httpx cannot
    drive more than a few hundred requests per second, and the client must not be what is measured.
    The processes start their clocks together, once all of them have started."""
    nproc = max(1, min(processes, concurrency))
    shares = [concurrency // nproc + (1 if i < concurrency % nproc else 0) for i in range(nproc)]
    firsts = [sum(shares[:i]) for i in range(nproc)]
    ctx = multiprocessing.get_context("spawn")
    barrier, queue = ctx.Barrier(nproc), ctx.Queue()
    procs = [ctx.Process(target=_client_process, args=((url, headers, firsts[i], shares[i], duration, path, output),
                                                        barrier, queue), daemon=True) for i in range(nproc)]
    for proc in procs:
        proc.start()
    try:
        results = [queue.get(timeout=duration + 180) for _ in procs]
    finally:
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
    latencies = [x * 1e6 for r in results for x in r["latencies"]]
    run_us = [x for r in results for x in r["run_us"]]
    total_us = [x for r in results for x in r["total_us"]]
    errors = sum(r["errors"] for r in results)
    first = next((r["first_error"] for r in results if r["first_error"]), None)
    elapsed = duration  # every client stops at its stop time (plus one request in flight)
    level = {"client": "python", "concurrency": concurrency, "workers": nproc, "requests": len(latencies),
             "errors": errors, "error_detail": f"{errors} failed (first: {first})" if errors else "",
             "seconds": elapsed, "rps": len(latencies) / elapsed, "p50_us": percentile(latencies, 50),
             "p90_us": percentile(latencies, 90), "p99_us": percentile(latencies, 99),
             "max_us": max(latencies) if latencies else float("nan")}
    if output:
        level.update(server_run_p50_us=percentile(run_us, 50), server_total_p50_us=percentile(total_us, 50))
    return level


class TimingSampler:
    """One request at a time (its own connection) until `count` responses or stop(): the
    `parameters.timings_us` of each and the client's round trip. Runs in a thread, so it can sample
    next to a wrk level."""

    def __init__(self, url: str, headers: dict, fusion_id: str, output: str, count: int, interval: float = 0.0):
        self.url, self.headers, self.path = url, headers, f"/v2/models/{fusion_id}/infer"
        self.body, self.count, self.interval = infer_body(output, 999_999), count, interval
        self.samples: list[dict] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def run(self) -> TimingSampler:
        deadline = time.monotonic() + 120
        with httpx.Client(base_url=self.url, headers=self.headers, timeout=60) as c:
            while len(self.samples) < self.count and not self._stop.is_set() and time.monotonic() < deadline:
                t0 = time.perf_counter()
                r = c.post(self.path, json=self.body)
                rt = (time.perf_counter() - t0) * 1e6
                if r.status_code != 200:
                    self.errors.append(f"{r.status_code} {r.text[:160]}")
                else:
                    self.samples.append({**r.json()["parameters"]["timings_us"], "round_trip": rt})
                if self.interval:
                    self._stop.wait(self.interval)
        return self

    def start(self) -> TimingSampler:
        self._thread = threading.Thread(target=self.run, name="timing-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> TimingSampler:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(130)
        return self

    def summary(self, label: str) -> dict:
        s = self.samples
        col = {k: [x.get(k, float("nan")) for x in s] for k in ("total", "run", "queue", "plan", "round_trip")}
        beyond = [x["total"] - x["run"] for x in s if "total" in x and "run" in x]
        outside = [x["round_trip"] - x["total"] for x in s if "total" in x]
        out = {"label": label, "samples": len(s), "errors": len(self.errors),
               "first_error": self.errors[0] if self.errors else None}
        for k, v in col.items():
            out[f"{k}_p50_us"] = percentile(v, 50)
        out["beyond_run_p50_us"] = percentile(beyond, 50)
        out["beyond_run_p99_us"] = percentile(beyond, 99)
        out["outside_total_p50_us"] = percentile(outside, 50)
        return out
