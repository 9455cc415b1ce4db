"""A real Triton Inference Server laid out by benchmarks/triton_setup.sh: its environment, starting it on a free
loopback port with benchmarks/triton_models/, and stopping it. Shared by benchmarks/triton_side_by_side.py and the
conformance suite (tests/test_triton_conformance.py)."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

from load import free_port
from load import wait_ready as _wait_ready

HERE = Path(__file__).resolve().parent
MODELS = HERE / "triton_models"
MODEL = "moe_problem_sizes"
EXPERTS, TOPK = 256, 8  # the Triton model's config.pbtxt says the same


def triton_env(triton_dir: Path) -> dict:
    """The environment of triton_setup.sh's env.sh (PATH, LD_LIBRARY_PATH, TRITON_DIST, PERF_ANALYZER)."""
    env_sh = Path(triton_dir) / "env.sh"
    if not env_sh.exists():
        raise FileNotFoundError(f"{env_sh} not found: run `bash benchmarks/triton_setup.sh` first")
    out = subprocess.run(["bash", "-c", f'source "{env_sh}" && env -0'], capture_output=True, check=True)
    return dict(kv.split("=", 1) for kv in out.stdout.decode().split("\0") if "=" in kv)


def wait_ready(proc: subprocess.Popen, url: str, seconds: float, what: str) -> None:
    """load.wait_ready, failing with RuntimeError (the conformance suite's fixtures catch it; SystemExit
    would end pytest)."""
    try:
        ready = _wait_ready(proc, url, seconds, what)
    except SystemExit as e:
        raise RuntimeError(str(e)) from None
    if not ready:
        raise RuntimeError(f"{what} did not become ready in {seconds:.0f} s")


def start_triton(env: dict, repo: Path, log: Path, extra: tuple[str, ...] = (),
                 seconds: float = 180) -> tuple[subprocess.Popen, str]:
    """tritonserver with HTTP on a free 127.0.0.1 port (no gRPC, no metrics unless `extra` asks); its URL."""
    port = free_port()
    dist = Path(env["TRITON_DIST"])
    cmd = [str(dist / "bin" / "tritonserver"), "--model-repository", str(repo),
           "--backend-directory", str(dist / "backends"), "--cache-directory", str(dist / "caches"),
           "--http-address", "127.0.0.1", "--http-port", str(port), "--allow-grpc", "false",
           "--allow-metrics", "false", "--log-verbose", "0", *extra]
    # its own process group: the Python stub processes are its children and go with it
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(proc, url, seconds, f"tritonserver (log: {log})")
    except BaseException:
        stop(proc, group=True)
        raise
    return proc, url


def stop(proc: subprocess.Popen | None, group: bool = False) -> None:
    """SIGTERM (to its process group with `group`), SIGKILL after 30 s."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM) if group else proc.terminate()
        proc.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL) if group else proc.kill()
        proc.wait(10)
