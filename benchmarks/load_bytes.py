"""Big bodies in the load benchmark: raw-bytes PUT/GET throughput of one buffer, and the stall test
(health latency while another process PUTs and GETs a big buffer as JSON).

Both use a minimal HTTP/1.1 client over one keep-alive socket (sendall from the array's memory,
recv_into a preallocated buffer), so the client copies each byte at most once and is not what is
measured."""

from __future__ import annotations

import json
import multiprocessing
import socket
import statistics
import time
from urllib.parse import urlsplit

import numpy as np


class RawHTTP:
    """HTTP/1.1 on one keep-alive connection; responses must carry Content-Length (uvicorn's do)."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 120.0):
        u = urlsplit(url)
        self.host, self.port = u.hostname, u.port or 80
        self.auth = f"Authorization: Bearer {token}\r\n" if token else ""
        self.sock = socket.create_connection((self.host, self.port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.pending = b""
        self._buf = bytearray(0)  # reused for response bodies: a fresh one per response page-faults in

    def close(self) -> None:
        self.sock.close()

    def request(self, method: str, path: str, body=b"", headers: dict | None = None) -> tuple[int, dict, memoryview]:
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n{self.auth}"
        for k, v in (headers or {}).items():
            head += f"{k}: {v}\r\n"
        body = memoryview(body).cast("B")
        if method in ("PUT", "POST") or len(body):
            head += f"Content-Length: {len(body)}\r\n"
        self.sock.sendall((head + "\r\n").encode("latin-1"))
        if len(body):
            self.sock.sendall(body)
        return self._response()

    def _response(self) -> tuple[int, dict, memoryview]:
        data = self.pending
        while b"\r\n\r\n" not in data:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the server closed the connection")
            data += chunk
        head, _, rest = data.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {}
        for ln in lines[1:]:
            k, _, v = ln.partition(":")
            headers[k.strip().lower()] = v.strip()
        if "content-length" not in headers:
            raise ConnectionError(f"response {status} without Content-Length: {headers}")
        n = int(headers["content-length"])
        if len(self._buf) < n:
            self._buf = bytearray(n)
        view = memoryview(self._buf)[:n]
        have = min(n, len(rest))
        view[:have] = rest[:have]
        self.pending = rest[have:]
        while have < n:
            got = self.sock.recv_into(view[have:], min(n - have, 1 << 22))
            if not got:
                raise ConnectionError("the server closed the connection mid-body")
            have += got
        return status, headers, view


def _check(status: int, body: memoryview, what: str) -> None:
    if not 200 <= status < 300:
        raise SystemExit(f"{what}: HTTP {status}: {bytes(body[:300]).decode(errors='replace')}")


def transfer(url: str, token: str | None, nbytes: int, repeat: int) -> dict:
    """Median time of `repeat` raw-bytes PUTs, then GETs, of one int64 buffer of nbytes."""
    n = max(1, nbytes // 8)
    data = np.random.default_rng(1).integers(0, 1 << 40, n, dtype=np.int64)
    c = RawHTTP(url, token)
    put_s, get_s = [], []
    path = f"/v2/buffers/bench_bytes?dtype=int64&shape={n}"
    try:
        for _ in range(repeat):
            t0 = time.perf_counter()
            status, _, body = c.request("PUT", path, data, {"Content-Type": "application/octet-stream"})
            put_s.append(time.perf_counter() - t0)
            _check(status, body, "raw PUT")
        for i in range(repeat):
            t0 = time.perf_counter()
            status, _, body = c.request("GET", "/v2/buffers/bench_bytes", headers={"Accept": "application/octet-stream"})
            get_s.append(time.perf_counter() - t0)
            _check(status, body, "raw GET")
            if i == 0 and not np.array_equal(np.frombuffer(body, dtype="<i8"), data):
                raise SystemExit("raw GET returned other bytes than were PUT")
        c.request("DELETE", "/v2/buffers/bench_bytes")
    finally:
        c.close()
    nb = n * 8
    return {"bytes": nb, "repeat": repeat,
            "put_median_s": statistics.median(put_s), "get_median_s": statistics.median(get_s),
            "put_gbps": nb / statistics.median(put_s) / 1e9, "get_gbps": nb / statistics.median(get_s) / 1e9,
            "put_s": put_s, "get_s": get_s}


def _json_traffic(url: str, token: str | None, nbytes: int, seconds: float, started, result) -> None:
    """In its own process: PUT then GET one buffer as JSON, alternately, until `seconds` have passed
    (at least one of each). The body is encoded before the clock starts."""
    n = max(1, nbytes // 8)
    rng = np.random.default_rng(2)
    data = rng.integers(0, 256, n, dtype=np.int64)
    body = json.dumps({"dtype": "int64", "shape": [n], "data": data.tolist()}).encode()
    c = RawHTTP(url, token, timeout=600)
    puts, gets, err, get_bytes = [], [], None, 0
    started.set()
    stop_at = time.perf_counter() + seconds
    try:
        while not puts or not gets or time.perf_counter() < stop_at:
            t0 = time.perf_counter()
            status, _, resp = c.request("PUT", "/v2/buffers/bench_json", body, {"Content-Type": "application/json"})
            puts.append(time.perf_counter() - t0)
            if not 200 <= status < 300:
                err = f"JSON PUT: HTTP {status}: {bytes(resp[:200]).decode(errors='replace')}"
                break
            t0 = time.perf_counter()
            status, _, resp = c.request("GET", "/v2/buffers/bench_json", headers={"Accept": "application/json"})
            gets.append(time.perf_counter() - t0)
            if not 200 <= status < 300:
                err = f"JSON GET: HTTP {status}: {bytes(resp[:200]).decode(errors='replace')}"
                break
            get_bytes = len(resp)
        c.request("DELETE", "/v2/buffers/bench_json")
    except Exception as e:  # reported in the result, loudly, by the caller
        err = f"{type(e).__name__}: {e}"
    finally:
        c.close()
    result.put({"puts": puts, "gets": gets, "error": err, "put_body_bytes": len(body),
                "get_body_bytes": get_bytes})


def probe_health(url: str, interval: float, until) -> dict:
    """GET /v2/health/live every `interval` seconds until until() is true. A probe that fell due
    while the previous one was still waiting for the server counts its latency from when it was due,
    so a stall shows in the percentiles, not just in the max (no coordinated omission); a probe sent
    on time counts its round trip. The plain round trips are kept too."""
    c = RawHTTP(url)
    due_lat, rtt = [], []
    t_next = t_done = time.perf_counter()
    try:
        while not until():
            behind = t_done > t_next  # the last response came after this probe was due
            now = time.perf_counter()
            if now < t_next:
                time.sleep(t_next - now)
            t_send = time.perf_counter()
            status, _, body = c.request("GET", "/v2/health/live")
            t_done = time.perf_counter()
            _check(status, body, "health probe")
            due_lat.append((t_done - (t_next if behind else t_send)) * 1e6)
            rtt.append((t_done - t_send) * 1e6)
            t_next += interval
            if t_next < t_done - 1.0:  # far behind after a stall: probe on from now
                t_next = t_done
    finally:
        c.close()
    return {"probes": len(rtt), "interval_ms": interval * 1e3,
            "p50_us": _pct(due_lat, 50), "p99_us": _pct(due_lat, 99), "max_us": max(due_lat, default=float("nan")),
            "rtt_p50_us": _pct(rtt, 50), "rtt_p99_us": _pct(rtt, 99), "rtt_max_us": max(rtt, default=float("nan"))}


def _pct(xs: list, q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def stall(url: str, token: str | None, nbytes: int, seconds: float, interval: float) -> dict:
    """Health probes while nothing else runs (`idle`), then while JSON bodies go through (`busy`)."""
    t_end = time.perf_counter() + min(1.0, seconds)
    idle = probe_health(url, interval, lambda: time.perf_counter() > t_end)
    ctx = multiprocessing.get_context("spawn")
    started, result = ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_json_traffic, args=(url, token, nbytes, seconds, started, result), daemon=True)
    proc.start()
    try:
        if not started.wait(300):
            raise SystemExit("the JSON client did not start in 300 s")
        busy = probe_health(url, interval, lambda: not proc.is_alive() or not result.empty())
        traffic = result.get(timeout=600)
    finally:
        proc.join(30)
        if proc.is_alive():
            proc.kill()
    return {"buffer_bytes": max(1, nbytes // 8) * 8, "idle": idle, "busy": busy, "json_puts": len(traffic["puts"]),
            "json_gets": len(traffic["gets"]), "json_put_median_s": _median(traffic["puts"]),
            "json_get_median_s": _median(traffic["gets"]), "put_body_bytes": traffic["put_body_bytes"],
            "get_body_bytes": traffic["get_body_bytes"], "error": traffic["error"]}


def _median(xs: list) -> float:
    return statistics.median(xs) if xs else float("nan")
