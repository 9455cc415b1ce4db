"""CUDA shared-memory regions end to end on a GPU: a segfuse server on the cupy backend (uvicorn in
this process) and a client in a second process (tests/gpu/cuda_regions_child.py: CUDA IPC handles
cannot be opened by the process that made them) that allocates CuPy arrays and torch tensors,
registers them as CUDA regions, runs the four MoE fusions of examples/ with inputs and outputs in
them, and checks the results in its own memory against NumPy. Also: bad handles (400), unregistering
while a run uses a region (refused, the run lands), and the server's CUDA context staying usable."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest
from helpers.servers import LiveServer
from helpers.service import GatedEngine

CHILD = Path(__file__).with_name("cuda_regions_child.py")
CUDA = "/v2/cudasharedmemory"


@pytest.fixture(scope="module")
def server():
    s = LiveServer(backend="cupy").start()
    yield s
    s.stop()


class Child:
    """The client process, speaking JSON lines."""

    def __init__(self, url: str, scenario: str, *args: str):
        self.proc = subprocess.Popen([sys.executable, str(CHILD), url, scenario, *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait(30)
            raise AssertionError(f"the client process ended ({self.proc.returncode}):\n{self.proc.stderr.read()}")
        return json.loads(line)

    def send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def finish(self) -> list[dict]:
        out, err = self.proc.communicate(timeout=120)
        assert self.proc.returncode == 0, f"client process failed ({self.proc.returncode}):\n{err}"
        return [json.loads(x) for x in out.splitlines() if x.strip()]


def context_is_usable(url: str) -> None:
    """An inline run on the server's GPU after everything else: right answer."""
    ids = np.random.default_rng(9).integers(0, 16, (33, 4))
    r = httpx.post(f"{url}/v2/models/moe_problem_sizes/infer", timeout=60, json={
        "inputs": [{"name": "topk_ids", "shape": [33, 4], "datatype": "INT64", "data": ids.reshape(-1).tolist()}]})
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == np.bincount(ids.reshape(-1), minlength=16).tolist()


def test_moe_fusions_with_inputs_and_outputs_in_cuda_regions(server):
    lines = Child(server.url, "moe").finish()
    assert [(x["T"], x["ok"]) for x in lines] == [(7, True), (4096, True)], lines
    assert httpx.get(f"{server.url}{CUDA}/status").json() == []
    context_is_usable(server.url)


def test_moe_fusions_in_cuda_regions_over_grpc():
    """Triton's gRPC client registers CUDA regions and runs with inputs and outputs in them."""
    pytest.importorskip("tritonclient.grpc")
    s = LiveServer(backend="cupy", grpc_port=0).start()
    try:
        lines = Child(s.url, "grpc", f"127.0.0.1:{s.app.state.grpc_port}").finish()
        assert [(x["T"], x["ok"]) for x in lines] == [(5, True), (3000, True)], lines
        context_is_usable(s.url)
    finally:
        s.stop()


def test_bad_handles_are_400_and_the_context_stays_usable(server):
    assert Child(server.url, "bad").finish() == [{"ok": True}]
    context_is_usable(server.url)


def test_unregister_while_a_run_uses_the_regions(server):
    child = Child(server.url, "hold")
    try:
        info = child.read()
        assert info["ready"], info
        body = {"inputs": [{"name": "topk_ids", "shape": info["ids"]["shape"], "datatype": "INT64", "parameters": {
                    "shared_memory_region": "hold_ids", "shared_memory_byte_size": info["ids"]["byte_size"],
                    "shared_memory_offset": info["ids"]["offset"]}}],
                "outputs": [{"name": "counts", "parameters": {
                    "shared_memory_region": "hold_counts", "shared_memory_byte_size": info["counts"]["byte_size"],
                    "shared_memory_offset": info["counts"]["offset"]}}]}
        rt = server.runtime
        gate = GatedEngine(rt.engine)
        rt.engine = gate
        result = {}
        try:
            t = threading.Thread(target=lambda: result.setdefault("r", httpx.post(
                f"{server.url}/v2/models/moe_problem_sizes/infer", json=body, timeout=60)))
            t.start()
            assert gate.entered.wait(30), "the run did not start"
            r = httpx.post(f"{server.url}{CUDA}/region/hold_ids/unregister")
            assert r.status_code == 400 and "currently in use" in r.json()["error"], r.text
            r = httpx.post(f"{server.url}{CUDA}/unregister")
            assert r.status_code == 400 and "'hold_counts', 'hold_ids'" in r.json()["error"], r.text
            status = httpx.get(f"{server.url}{CUDA}/status").json()
            assert {s["name"]: s["ref_count"] for s in status} == {"hold_counts": 1, "hold_ids": 1}
        finally:
            gate.release.set()
            rt.engine = gate.inner
        t.join(60)
        assert result["r"].status_code == 200, result["r"].text
        assert result["r"].json()["outputs"][0]["parameters"]["shared_memory_region"] == "hold_counts"
        child.send("check")
        assert child.read() == {"ok": True}
        r = httpx.post(f"{server.url}{CUDA}/unregister")
        assert r.status_code == 200 and r.json() == {"unregistered": ["hold_counts", "hold_ids"]}, r.text
        child.send("exit")
        assert child.finish() == []
    finally:
        if child.proc.poll() is None:
            child.proc.kill()
    context_is_usable(server.url)
