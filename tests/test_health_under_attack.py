"""A bounded load test on a live server (a `segfuse serve` process on the NumPy backend): while a
client attacks it, `/v2/health/live` answers within 1 s, a stored buffer reads back and another
client's small run answers, each within 2 s (all bounds times SEGFUSE_TEST_TIMEOUT_SCALE), the attack's own requests get the 4xx they must, and
the server serves normally afterwards.

Each attack is a parameter: an `Attack` in ATTACKS, whose `send(url)` sends its hostile requests
(concurrently where that is the attack) and returns their statuses. Adding one is one function and
one entry in ATTACKS; nothing else changes.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import helpers.graphs
import httpx
import numpy as np
import pytest
from helpers.processes import SEGFUSE, free_port, stop, wait_ready
from helpers.waiting import scaled

# The bounds are behaviour, not speed: an attack that held the event loop would hold health for
# about PLAN_SECONDS (an attack on the planning budget) or a whole decode. All of them stretch
# together with SEGFUSE_TEST_TIMEOUT_SCALE, so their ratios, which make the check, stay.
HEALTH_WITHIN = scaled(1.0)  # seconds, for /v2/health/live
OTHERS_WITHIN = scaled(2.0)  # seconds, for another client's buffer read and small run
PLAN_SECONDS = scaled(3)  # the server's max_plan_seconds here: attacks on the budget end in about this long
ATTACK_TIMEOUT = scaled(240)  # seconds an attack's request may take before the test fails (a hang guard)


@dataclass
class Attack:
    send: Callable[[str], list[int]]  # sends the hostile requests to the server's URL; their statuses
    expect: set[int]  # the statuses every one of them must get
    prepare: Callable[[str], None] | None = None  # done before the probes start (register a graph)
    info: str = ""
    seen: list = field(default_factory=list)
    run_within: float = OTHERS_WITHIN  # seconds for another client's small run, unless it queues behind the attack


def post_all(url: str, path: str, bodies: list, timeout: float = ATTACK_TIMEOUT) -> list[int]:
    """POST every body at once (a thread each); their statuses."""
    def one(body):
        with httpx.Client(timeout=timeout) as c:
            return c.post(url + path, content=json.dumps(body).encode(),
                          headers={"content-type": "application/json"}).status_code

    with ThreadPoolExecutor(len(bodies)) as pool:
        return list(pool.map(one, bodies))


def graph(name: str, ops: list, outputs: list, inputs: list | None = None) -> dict:
    """A graph over x: int64 [T] unless `inputs` says otherwise."""
    return helpers.graphs.graph(inputs or [("x", "int64", ["T"])], ops, outputs, name)


# ---- the attacks --------------------------------------------------------------------------------
def nested_floor_sizes(url: str) -> list[int]:
    """Graphs of about 300 bytes whose size nests `//` 12 deep: sympy took minutes for each, and six
    at once held buffer I/O and registration for minutes."""
    def nested(k: int) -> dict:
        e = "T"
        for j in range(12):
            e = f"({e}+{j + k + 1})//{j + 2}"
        return graph(f"nested{k}", [{"op": "full", "out": "y", "shape": [e], "value": 0, "dtype": "int64"}], ["y"])

    return [s for rnd in range(3) for s in post_all(url, "/v2/fusions", [nested(6 * rnd + k) for k in range(6)])]


def slow_to_validate(url: str) -> list[int]:
    """Graphs within every size bound, 4,000 ops each with its own size expression: minutes of
    simplification without the budget."""
    def body(k: int) -> dict:
        ops = [{"op": "full", "out": f"y{j}", "shape": [f"((T+{j})//{2 + k}+{j % 7})//3*T"], "value": 0,
                "dtype": "int64"} for j in range(4000)]
        return graph(f"slow{k}", ops, ["y0"])

    return post_all(url, "/v2/fusions", [body(k) for k in range(2)])


CHAIN_OPS = 4000


def register_scatter_chain(url: str) -> None:
    ops = [{"op": "full", "out": "c0", "shape": [16], "value": 0, "dtype": "int64"},
           {"op": "full_like", "out": "ones", "inputs": ["idx"], "value": 1}]
    ops += [{"op": "scatter", "out": f"c{k + 1}", "inputs": [f"c{k}", "idx", "ones"], "dim": 0, "reduce": "add"}
            for k in range(CHAIN_OPS)]
    g = graph("scatter_chain", ops, [f"c{CHAIN_OPS}"], [{"name": "idx", "dtype": "int64", "shape": ["N"]}])
    r = httpx.post(url + "/v2/fusions", json=g, timeout=ATTACK_TIMEOUT)
    assert r.status_code in (200, 201), r.text


def scatter_chain_cold_runs(url: str) -> list[int]:
    """Runs of a 4,000-op scatter chain, each at new sizes: each plans anew (over 900 s, on the one
    run worker, before the budget)."""
    bodies = [{"inputs": [{"name": "idx", "shape": [n], "datatype": "INT64", "data": list(range(n))}]}
              for n in (2, 3, 4)]
    return post_all(url, "/v2/models/scatter_chain/infer", bodies)


def huge_inline_outputs(url: str) -> list[int]:
    """/v2/execute requests of about 400 bytes asking for 2^30 float32 back as JSON (a process grew
    to 7.7 GB and answered 500)."""
    g = graph("huge", [{"op": "full", "out": "a", "shape": [1 << 30], "value": 1.5, "dtype": "float32"},
                       {"op": "add", "out": "y", "inputs": ["a", "x"]}], ["y"],
              [{"name": "x", "dtype": "float32", "shape": [1]}])
    body = {"graph": g, "inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [2.0]}]}
    return post_all(url, "/v2/execute", [body] * 8)


def register_wide_sum(url: str) -> None:
    g = graph("wide_sum", [{"op": "sum", "out": "s", "inputs": ["x"]}], ["s"])
    assert httpx.post(url + "/v2/fusions", json=g, timeout=scaled(60)).status_code in (200, 201)


def large_inline_json_infer(url: str) -> list[int]:
    """60 MB of inline JSON data on /infer (parsed on the event loop, it held every request 8.6 s),
    for a sum: the decoding is the work (a long run would hold the one run worker, which is not the
    point here). The answer must still be right: the ids' sum."""
    ids = np.random.default_rng(7).integers(0, 10, 30_000_000)
    data = np.full(2 * ids.size + 1, ord(","), np.uint8)  # "[d,d,...,d]" without a Python loop
    data[0], data[-1], data[1:-1:2] = ord("["), ord("]"), ids + ord("0")
    body = b'{"inputs": [{"name": "x", "datatype": "INT64", "shape": [%d], "data": ' % ids.size + data.tobytes() + b"}]}"
    r = httpx.post(url + "/v2/models/wide_sum/infer", content=body, timeout=ATTACK_TIMEOUT)
    assert r.status_code != 200 or r.json()["outputs"][0]["data"] == [int(ids.sum())], r.text[:200]
    return [r.status_code]


def gzip_past_the_body_limit(url: str) -> list[int]:
    """Four 1 MB gzip bodies at once that inflate to 1 GiB each, past the 256 MiB body limit
    (inflated on the event loop, each held every request for up to 2 s)."""
    import zlib

    c = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    bomb = b"".join(c.compress(bytes(1 << 20)) for _ in range(1024)) + c.flush()

    def one(_):
        return httpx.post(url + "/v2/models/moe/infer", content=bomb, headers={"content-encoding": "gzip"},
                          timeout=ATTACK_TIMEOUT).status_code

    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(one, range(4)))


ATTACKS = {
    "nested_floor_sizes": Attack(nested_floor_sizes, {400}, info="sizes too complex to simplify"),
    "slow_to_validate": Attack(slow_to_validate, {413}, info="past max_plan_seconds or max_plan_work"),
    "scatter_chain_cold_runs": Attack(scatter_chain_cold_runs, {413}, prepare=register_scatter_chain,
                                      info="planning past max_plan_work or max_plan_seconds"),
    "huge_inline_outputs": Attack(huge_inline_outputs, {413}, info="past max_run_bytes"),
    # its run is real work on the one run worker (--run-workers 1): a small run queued behind it waits
    # for it, while health and buffer reads, which it must not hold up, keep the tight bounds
    "large_inline_json_infer": Attack(large_inline_json_infer, {200}, prepare=register_wide_sum,
                                      info="decoded by the codec process", run_within=10.0),
    "gzip_past_the_body_limit": Attack(gzip_past_the_body_limit, {413}, info="inflates past max_body_bytes"),
}


# ---- the server and the probes -------------------------------------------------------------------
MOE = graph("moe", [{"op": "reshape", "out": "flat", "inputs": ["ids"], "shape": [-1]},
                    {"op": "full", "out": "zeros", "shape": [16], "value": 0, "dtype": "int64"},
                    {"op": "full_like", "out": "ones", "inputs": ["flat"], "value": 1},
                    {"op": "scatter", "out": "counts", "inputs": ["zeros", "flat", "ones"], "dim": 0, "reduce": "add"}],
            ["counts"], [{"name": "ids", "dtype": "int64", "shape": ["T", "K"]}])
STORED = np.arange(1000, dtype=np.int64)


@pytest.fixture(scope="module")
def server():
    port = free_port()
    cmd = [*SEGFUSE, "serve", "--backend", "numpy", "--host", "127.0.0.1", "--port", str(port)]
    env = {**os.environ, "SEGFUSE_LOG_LEVEL": "warning", "SEGFUSE_MAX_PLAN_SECONDS": str(PLAN_SECONDS)}
    env.pop("SEGFUSE_TOKEN", None)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        assert httpx.post(url + "/v2/fusions", json=MOE, timeout=scaled(60)).status_code == 201
        r = httpx.put(url + "/v2/buffers/stored", content=STORED.tobytes(), params={"dtype": "int64", "shape": "1000"},
                      headers={"content-type": "application/octet-stream"}, timeout=scaled(60))
        assert r.status_code == 201, r.text
        yield url, proc
    finally:
        stop(proc)


class Probes:
    """Health, a buffer read and a small run, one after another on one connection each, until
    stopped; the slowest answer of each kind and every wrong one."""

    def __init__(self, url: str):
        self.url, self.stop, self.slowest, self.wrong, self.rounds = url, threading.Event(), {}, [], 0
        self.thread = threading.Thread(target=self.loop, daemon=True)

    def timed(self, c: httpx.Client, what: str, check: Callable[[httpx.Response], bool], *args, **kw) -> None:
        t0 = time.perf_counter()
        try:
            r = c.request(*args, **kw)
            ok = check(r)
        except httpx.HTTPError as e:
            ok, r = False, e
        self.slowest[what] = max(self.slowest.get(what, 0.0), time.perf_counter() - t0)
        if not ok:
            self.wrong.append((what, getattr(r, "status_code", r)))

    def loop(self) -> None:
        ids = np.array([[1, 5], [5, 9]], np.int64)
        counts = np.bincount(ids.ravel(), minlength=16).tolist()
        run = {"inputs": [{"name": "ids", "shape": [2, 2], "datatype": "INT64", "data": ids.ravel().tolist()}]}
        with httpx.Client(timeout=scaled(60)) as h, httpx.Client(timeout=scaled(60)) as b, \
                httpx.Client(timeout=scaled(60)) as r:
            while not self.stop.is_set():
                self.timed(h, "health", lambda x: x.status_code == 200, "GET", self.url + "/v2/health/live")
                self.timed(b, "buffer", lambda x: x.status_code == 200 and x.content == STORED.tobytes(), "GET",
                           self.url + "/v2/buffers/stored", headers={"accept": "application/octet-stream"})
                self.timed(r, "run", lambda x: x.status_code == 200 and x.json()["outputs"][0]["data"] == counts,
                           "POST", self.url + "/v2/models/moe/infer", json=run)
                self.rounds += 1
                time.sleep(0.05)

    def __enter__(self) -> Probes:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join(scaled(120))


@pytest.mark.parametrize("name", ATTACKS)
def test_health_buffers_and_runs_answer_while_the_server_is_attacked(server, name):
    url, proc = server
    attack = ATTACKS[name]
    if attack.prepare is not None:
        attack.prepare(url)
    t0 = time.perf_counter()
    with Probes(url) as probes:
        time.sleep(0.2)  # probed before the attack as well
        statuses = attack.send(url)
        time.sleep(0.2)
    took = time.perf_counter() - t0
    assert set(statuses) <= attack.expect, (name, attack.info, statuses)
    assert proc.poll() is None, "the server died"
    assert probes.wrong == [], probes.wrong
    assert probes.rounds >= 2, probes.rounds
    assert probes.slowest["health"] < HEALTH_WITHIN, (probes.slowest, took)
    assert probes.slowest["buffer"] < OTHERS_WITHIN and probes.slowest["run"] < attack.run_within, (probes.slowest, took)
    # and afterwards it serves as before
    assert httpx.get(url + "/v2/health/ready", timeout=scaled(30)).status_code == 200
    assert httpx.post(url + "/v2/fusions", json=graph(f"after_{name}", [
        {"op": "add", "out": "y", "inputs": ["x", 1]}], ["y"]), timeout=scaled(60)).status_code == 201
