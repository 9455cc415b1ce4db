"""segfuse as a user runs it: the console script in a subprocess, and a server process on a free
loopback port."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

import httpx

from helpers.waiting import scaled, wait_until

ROOT = Path(__file__).resolve().parents[2]
_SCRIPT = Path(sysconfig.get_path("scripts")) / "segfuse"
# The installed console script where there is one (what a user runs), else the same entry point.
SEGFUSE = [str(_SCRIPT)] if _SCRIPT.exists() else [
    sys.executable, "-c", "import sys; from segfuse.cli import main; sys.exit(main())"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def segfuse(*args, server: str | None = None, cwd=None, check: int | None = 0,
            columns: int = 120) -> subprocess.CompletedProcess:
    """Run `segfuse *args`; assert it exits `check` (None: any status). A server only where the
    test names one (SEGFUSE_SERVER and SEGFUSE_TOKEN of the calling shell are dropped)."""
    env = {**os.environ, "COLUMNS": str(columns)}
    env.pop("SEGFUSE_TOKEN", None)
    env.pop("SEGFUSE_SERVER", None)
    if server:
        env["SEGFUSE_SERVER"] = server
    r = subprocess.run([*SEGFUSE, *map(str, args)], capture_output=True, text=True, env=env, cwd=cwd,
                       timeout=scaled(120))
    if check is not None:
        assert r.returncode == check, f"exit {r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r


def is_ready(url: str) -> bool:
    try:
        return httpx.get(url + "/v2/health/ready", timeout=scaled(2)).status_code == 200
    except httpx.TransportError:
        return False


def wait_ready(url: str, proc: subprocess.Popen, seconds: float = 120) -> None:
    """Until the server at `url` answers ready; RuntimeError with its stderr if it exits first."""
    def ready() -> bool:
        if proc.poll() is not None:
            out = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError(f"server exited with {proc.returncode}:\n{out}")
        return is_ready(url)

    wait_until(ready, seconds, f"server at {url} ready", poll=0.1)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM, then SIGKILL if it has not exited after a (scaled) grace period."""
    proc.terminate()
    try:
        proc.wait(scaled(10))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def server_process(cmd: list[str] | None = None, env: dict | None = None, token: str | None = None):
    """Start a segfuse server on a free 127.0.0.1 port with the NumPy backend; yield its URL.

    `cmd` defaults to uvicorn on the app factory; settings travel as SEGFUSE_* variables so a
    caller can pass the exact command line of the container image.
    """
    port = free_port()
    full_env = {**os.environ, "SEGFUSE_BACKEND": "numpy", "SEGFUSE_PORT": str(port), "SEGFUSE_HOST": "127.0.0.1",
                "SEGFUSE_LOG_LEVEL": "warning", **(env or {})}
    full_env.pop("SEGFUSE_TOKEN", None)
    if token:
        full_env["SEGFUSE_TOKEN"] = token
    cmd = cmd or [sys.executable, "-m", "uvicorn", "--factory", "segfuse.server:create_app",
                  "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    proc = subprocess.Popen(cmd, env=full_env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc)
        yield url
    finally:
        stop(proc)


@dataclass
class Logged:
    url: str
    output: str = ""  # what the server printed, stdout and stderr together; complete once it stopped


@contextlib.contextmanager
def serve_logged(*flags: str):
    """`segfuse serve --backend numpy` with `flags` on a free loopback port, ready; yields a Logged
    whose output is filled in once the block ends and the server has stopped (a file, not a pipe:
    a chatty server never blocks on a full pipe)."""
    port = free_port()
    env = {**os.environ}
    env.pop("SEGFUSE_TOKEN", None)
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen([*SEGFUSE, "serve", "--backend", "numpy", "--host", "127.0.0.1", "--port", str(port),
                                 *flags], env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        served = Logged(f"http://127.0.0.1:{port}")
        try:
            wait_ready(served.url, proc)
            yield served
        finally:
            stop(proc)
            log.seek(0)
            served.output = log.read()
