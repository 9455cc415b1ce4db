"""The two servers the conformance suite compares, serving the same MoE histogram under one model name:
tritonserver 2.51.0 with benchmarks/triton_models/ (a Python-backend model), and `segfuse serve --backend numpy`
with the moe_problem_sizes fusion (E = 256) in its fusion repository. Each on a free loopback port, per pytest
process (xdist workers each have their own pair).

Triton runs with `--model-control-mode explicit` (its repository load/unload API answers only then); both serve
their metrics on a port of their own (`--metrics-port`), as Triton users run it, and the KServe v2 gRPC protocol on
another (`--grpc-port`; Triton with `--allow-grpc true`)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import triton_server
from load import moe_graph

from helpers.processes import SEGFUSE, free_port, stop, wait_ready

MODEL = triton_server.MODEL
EXPERTS, TOPK = triton_server.EXPERTS, triton_server.TOPK
SERVERS = ("triton", "segfuse")


@dataclass(frozen=True)
class Target:
    """One server under test: which one, its HTTP URL, where its Prometheus metrics are, the model's name, its
    gRPC address (host:port)."""
    kind: str
    url: str
    metrics_url: str
    model: str = MODEL
    grpc_address: str = ""

    @property
    def address(self) -> str:  # what tritonclient takes
        return self.url.removeprefix("http://")


def _start_segfuse(scratch: Path) -> tuple[subprocess.Popen, str, str, str]:
    repo = scratch / "fusions"
    repo.mkdir()
    (repo / f"{MODEL}.json").write_text(json.dumps(moe_graph(EXPERTS)))
    port, metrics_port, grpc_port = free_port(), free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("SEGFUSE_TOKEN", "SEGFUSE_SERVER")}
    log = (scratch / "segfuse.log").open("w")
    proc = subprocess.Popen([*SEGFUSE, "serve", "--backend", "numpy", "--host", "127.0.0.1", "--port", str(port),
                             "--metrics-port", str(metrics_port), "--grpc-port", str(grpc_port), "--fusion-dir", str(repo), "--cache-dir", str(scratch / "cache"), "--log-level",
                             "warning"], env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    log.close()
    return proc, f"http://127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}", f"127.0.0.1:{grpc_port}"


def _start_triton(layout: Path, scratch: Path) -> tuple[subprocess.Popen, str, str, str]:
    repo = scratch / "triton_models"
    shutil.copytree(triton_server.MODELS, repo, ignore=shutil.ignore_patterns("__pycache__"))
    env = triton_server.triton_env(layout)
    last: Exception | None = None
    for attempt in range(3):  # a free port can be taken by someone else before tritonserver binds it
        metrics_port, grpc_port = free_port(), free_port()
        extra = ("--allow-grpc", "true", "--grpc-address", "127.0.0.1", "--grpc-port", str(grpc_port),
                 "--model-control-mode", "explicit", "--load-model", MODEL, "--allow-metrics", "true",
                 "--allow-gpu-metrics", "false", "--allow-cpu-metrics", "false", "--metrics-port", str(metrics_port))
        try:
            proc, url = triton_server.start_triton(env, repo, scratch / f"tritonserver-{attempt}.log", extra)
            return proc, url, f"http://127.0.0.1:{metrics_port}", f"127.0.0.1:{grpc_port}"
        except RuntimeError as e:
            last = e
    log = (scratch / "tritonserver-2.log").read_text(errors="replace")[-3000:]
    raise RuntimeError(f"tritonserver did not start: {last}\n{log}") from last


@contextlib.contextmanager
def server_pair(layout: Path, scratch: Path):
    """{"triton": Target, "segfuse": Target}, both ready; both stopped when the block ends."""
    segfuse, segfuse_url, segfuse_metrics, segfuse_grpc = _start_segfuse(scratch)
    triton = None
    try:
        triton, triton_url, triton_metrics, triton_grpc = _start_triton(layout, scratch)
        try:
            wait_ready(segfuse_url, segfuse, 120)
        except RuntimeError as e:
            raise RuntimeError(f"{e}\n{(scratch / 'segfuse.log').read_text()[-2000:]}") from None
        yield {"triton": Target("triton", triton_url, triton_metrics, grpc_address=triton_grpc),
               "segfuse": Target("segfuse", segfuse_url, segfuse_metrics, grpc_address=segfuse_grpc)}
    finally:
        stop(segfuse)
        triton_server.stop(triton, group=True)


def perf_analyzer(layout: Path) -> tuple[str, dict]:
    """The perf_analyzer binary of the layout and the environment it runs in."""
    env = triton_server.triton_env(layout)
    return env.get("PERF_ANALYZER") or str(layout / "venv" / "bin" / "perf_analyzer"), env

