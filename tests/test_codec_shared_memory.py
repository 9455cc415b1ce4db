"""The JSON codec's shared memory (server/codec.py) is out of every client's reach and outlives no
process: while a large request body is being received and a large JSON response being sent, no
shared-memory object mapped by the server or its helper can be registered as a region (a client
once read another client's body that way), and after SIGKILL of the whole process group mid-body
nothing the server had in /dev/shm remains. The server runs in its own process group
(tests/region_server.py)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from helpers.waiting import scaled
from region_server import Served, serve

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self") or not os.path.isdir("/dev/shm"),
                                reason="Linux: /proc and /dev/shm")

SYS = "/v2/systemsharedmemory"
N = 500_000  # int64s of 16 digits: 8.5 MB of JSON either way, more than loopback sockets buffer
_SHM = re.compile(r"\s(/dev/shm/\S+|/memfd:.*)$")


def _shared_mappings(pids: list[int]) -> list[str]:
    """The shared-memory files the processes map: '/dev/shm/NAME', '/dev/shm/NAME (deleted)' or
    '/memfd:NAME (deleted)', one entry per mapping."""
    found = []
    for pid in pids:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                m = _SHM.search(line)
                if m:
                    found.append(m.group(1))
    return found


def _named(mappings: list[str]) -> set[str]:
    """The objects among them that still have a name a client could give as a key."""
    return {m[len("/dev/shm/"):] for m in mappings if m.startswith("/dev/shm/") and not m.endswith("(deleted)")}


@contextlib.contextmanager
def _bodies_in_flight(served: Served):
    """A large body half sent and a large JSON response half read, both held open; yields the shared
    mappings of the server's processes once both are under way."""
    ids = np.random.default_rng(0).integers(10 ** 15, 10 ** 16, N)
    body = json.dumps({"dtype": "int64", "shape": [N], "data": ids.tolist()}).encode()
    r = httpx.put(served.url + "/v2/buffers/big", content=body, headers={"content-type": "application/json"},
                  timeout=scaled(60))
    assert r.status_code == 201, r.text  # the codec's helper process is up
    host, port = served.url.removeprefix("http://").split(":")
    put = socket.create_connection((host, int(port)))
    get = socket.socket()
    get.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the response cannot all sit in buffers
    get.connect((host, int(port)))
    try:
        put.sendall(b"PUT /v2/buffers/slow HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\n\r\n" % len(body) + body[:len(body) // 2])
        get.sendall(b"GET /v2/buffers/big HTTP/1.1\r\nHost: t\r\nAccept: application/json\r\n\r\n")
        assert get.recv(4096).startswith(b"HTTP/1.1 200")
        deadline = time.monotonic() + scaled(30)
        while True:  # the body's segment (a spare one, reused) and the response's are mapped by now or soon
            maps = _shared_mappings(served.pids())
            if len(maps) >= 2:
                break
            assert time.monotonic() < deadline, f"the codec's segments never showed: {maps}"
            time.sleep(0.05)
        yield maps
    finally:
        put.close()
        get.close()


def test_no_codec_segment_can_be_registered_while_bodies_are_in_flight(tmp_path):
    with serve(tmp_path) as served, _bodies_in_flight(served) as maps:
        for name in sorted(_named(maps)):  # what an attacker sees in /dev/shm and tries
            r = httpx.post(f"{served.url}{SYS}/region/stolen/register", json={"key": "/" + name, "byte_size": 1},
                           timeout=scaled(30))
            assert r.status_code == 400 and "server's own" in r.json()["error"], (name, r.text)
        assert httpx.get(f"{served.url}{SYS}/status", timeout=scaled(30)).json() == []


def test_sigkill_mid_body_leaves_no_shared_memory_behind(tmp_path):
    with serve(tmp_path) as served:
        with _bodies_in_flight(served) as maps:
            named = _named(maps)
            pids = served.pids()
            assert len(pids) >= 2  # the server and its codec helper at least
            os.killpg(served.proc.pid, signal.SIGKILL)  # the server, its helper, the resource tracker
            served.proc.wait(scaled(30))
        deadline = time.monotonic() + scaled(30)
        while any(Path(f"/proc/{pid}").exists() and _alive(pid) for pid in pids):
            assert time.monotonic() < deadline, "a process of the killed server lingers"
            time.sleep(0.05)
    left = sorted(n for n in named if Path("/dev/shm", n).exists())
    assert left == [], f"left in /dev/shm after SIGKILL: {left}"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie holds no memory
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
