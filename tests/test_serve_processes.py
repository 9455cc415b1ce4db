"""`segfuse serve --processes N [--mps]`: N independent servers on consecutive ports, stopped as a
group, and NVIDIA's MPS control daemon started before them and quit after them (a stand-in
`nvidia-cuda-mps-control` records what it is asked here; the real one runs on the GPU host,
benchmarks/load_shards.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from helpers.processes import SEGFUSE, free_port
from helpers.waiting import scaled


def consecutive_ports(n: int) -> int:
    """A base of n free ports below the kernel's ephemeral range: a port of that range that is free now
    may be any test's client socket before the group binds it."""
    import random

    try:
        low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(200):
        base = random.randrange(10000, max(low - n, 10001))
        if all(_free(base + k) for k in range(n)):
            return base
    raise RuntimeError("no consecutive free ports")


def _free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def children_of(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return sorted(out)


def start_group(n: int, *extra: str, env: dict | None = None) -> tuple[subprocess.Popen, list[str]]:
    base = consecutive_ports(n)
    full_env = {**os.environ, "SEGFUSE_LOG_LEVEL": "warning", **(env or {})}
    full_env.pop("SEGFUSE_TOKEN", None)
    proc = subprocess.Popen([*SEGFUSE, "serve", "--backend", "numpy", "--port", str(base), "--processes", str(n),
                             *extra], env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    urls = [f"http://127.0.0.1:{base + k}" for k in range(n)]
    deadline = time.monotonic() + scaled(120)
    pending = list(urls)
    while pending and time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the group exited with {proc.returncode}: {proc.stderr.read()}")
        try:
            if httpx.get(pending[0] + "/v2/health/ready", timeout=scaled(2)).status_code == 200:
                pending.pop(0)
                continue
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    assert not pending, f"not ready: {pending}"
    return proc, urls


def stop(proc: subprocess.Popen) -> tuple[int, str]:
    proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=scaled(60))
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return proc.returncode, err


def test_processes_serve_on_consecutive_ports_as_independent_shards_and_stop_together():
    proc, urls = start_group(3)
    try:
        kids = children_of(proc.pid)
        assert len(kids) == 3
        ids = np.arange(8, dtype=np.int64)
        for k, url in enumerate(urls):  # each holds its own buffers
            r = httpx.put(f"{url}/v2/buffers/b", json={"dtype": "int64", "shape": [8], "data": (ids * k).tolist()})
            assert r.status_code in (200, 201), r.text
        for k, url in enumerate(urls):
            got = httpx.get(f"{url}/v2/buffers/b", headers={"Accept": "application/json"}).json()["data"]
            assert got == (ids * k).tolist()
    finally:
        code, err = stop(proc)
    assert code == 0, err
    assert not any(Path(f"/proc/{pid}").exists() and "zombie" not in _state(pid) for pid in kids)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0]
    except (OSError, IndexError):
        return "zombie"


def test_one_process_ending_stops_the_group_with_a_failure():
    proc, _ = start_group(2)
    kids = children_of(proc.pid)
    os.kill(kids[0], signal.SIGKILL)
    try:
        _, err = proc.communicate(timeout=scaled(60))
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert proc.returncode != 0 and "stopping the others" in err, err
    assert not Path(f"/proc/{kids[1]}/status").exists() or _state(kids[1]).strip().startswith("Z")


FAKE_MPS = """#!/bin/sh
# stands in for nvidia-cuda-mps-control: records its arguments, its stdin and the pipe folder
{ echo "args=$*"; echo "pipe=$CUDA_MPS_PIPE_DIRECTORY"; echo "log=$CUDA_MPS_LOG_DIRECTORY"; \
  [ "$1" = "-d" ] || echo "stdin=$(cat)"; } >> "$FAKE_MPS_RECORD"
"""


def test_mps_daemon_starts_before_the_servers_they_use_it_and_it_quits_after_them(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-cuda-mps-control").write_text(FAKE_MPS)
    (bin_dir / "nvidia-cuda-mps-control").chmod(0o755)
    record = tmp_path / "record"
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_MPS_RECORD": str(record)}
    proc, _ = start_group(2, "--mps", env=env)
    try:
        started = record.read_text().splitlines()
        assert started[0] == "args=-d", started
        pipe = started[1].removeprefix("pipe=")
        assert pipe and Path(pipe).is_dir() and started[2].removeprefix("log=")
        for pid in children_of(proc.pid):  # every server is a client of that daemon
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            assert f"CUDA_MPS_PIPE_DIRECTORY={pipe}".encode() in environ
    finally:
        code, err = stop(proc)
    assert code == 0, err
    lines = record.read_text().splitlines()
    assert lines[3:] == ["args=", f"pipe={pipe}", lines[5], "stdin=quit"], lines
    assert not Path(pipe).exists()  # its private folders are removed


def test_mps_without_the_control_daemon_is_a_clear_error(tmp_path):
    env = {**os.environ, "PATH": str(Path(sys.executable).parent)}  # no nvidia-cuda-mps-control here
    r = subprocess.run([*SEGFUSE, "serve", "--backend", "numpy", "--port", str(free_port()), "--mps"],
                       env=env, capture_output=True, text=True, timeout=scaled(60))
    assert r.returncode == 2 and "--mps needs nvidia-cuda-mps-control" in r.stderr, r.stderr


@pytest.mark.parametrize("n", ["0", "-1"])
def test_processes_must_be_positive(n):
    r = subprocess.run([*SEGFUSE, "serve", "--processes", n], capture_output=True, text=True, timeout=scaled(60))
    assert r.returncode == 2 and "--processes must be at least 1" in r.stderr, r.stderr


@pytest.mark.parametrize("argv, message", [(["--route"], "--route needs --processes 2 or more"),
                                           (["--processes", "2", "--router-busy-poll"], "give --route")])
def test_router_options_without_a_router_are_refused(argv, message):
    r = subprocess.run([*SEGFUSE, "serve", "--backend", "numpy", *argv], capture_output=True, text=True,
                       timeout=scaled(60))
    assert r.returncode == 2 and message in r.stderr, r.stderr


@pytest.mark.skipif(not (os.environ.get("SEGFUSE_HAPROXY") or __import__("shutil").which("haproxy")),
                    reason="no haproxy on PATH (.ci/run installs Debian's)")
def test_route_puts_the_processes_behind_one_port_routed_by_namespace():
    """--route: shards shard-0..N-1 on PORT+1.., the router on PORT: each namespace reaches the shard
    shard_for names (and its own buffers), a registration reaches every shard, /metrics is every
    shard's, and the group still stops as a whole (HAProxy with it)."""
    from helpers.graphs import MOE_PROBLEM_SIZES
    from segfuse.client import Buffer, Client
    from segfuse.scaleout.routing import shard_for

    proc, urls = start_group(3, "--route", "--processes", "2")  # 3 ports: the router's, then the 2 shards'
    assert len(children_of(proc.pid)) == 3  # the shards and HAProxy
    router, ids = urls[0], ["shard-0", "shard-1"]
    try:
        spaces = {s: next(f"t{k}" for k in range(200) if shard_for(f"t{k}", ids) == s) for s in ids}
        with Client(router, namespace=spaces["shard-0"]) as c:
            c.register(MOE_PROBLEM_SIZES)
        rng = np.random.default_rng(3)
        for sid, ns in spaces.items():
            x = rng.integers(0, 16, (32, 4))
            with Client(router, namespace=ns) as c:
                c.put("x", x)
                res = c.run("moe_problem_sizes", inputs={"topk_ids": Buffer("x")})
                np.testing.assert_array_equal(res["counts"], np.bincount(x.ravel(), minlength=16))
            r = httpx.get(f"{router}/v2", headers={"Segfuse-Namespace": ns})
            assert r.headers["Segfuse-Shard"] == r.json()["shard"] == sid
            port = urls[1 + ids.index(sid)]  # the shard's own port: its buffer is there, in its namespace
            assert httpx.get(f"{port}/v2/buffers/x", headers={"Segfuse-Namespace": ns}).status_code == 200
        text = httpx.get(router + "/metrics").text
        assert all(f'shard="{s}"' in text for s in ids)
        assert httpx.get(router + "/v2/health/ready").json() == {"ready": True}
    finally:
        status, err = stop(proc)
    assert status == 0, err
    with pytest.raises(httpx.TransportError):
        httpx.get(router + "/v2/health/live", timeout=2)
