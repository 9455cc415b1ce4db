"""A segfuse server in its own process group, for tests that may crash, SIGKILL or starve it.

`serve(tmp_path, gate=..., **settings)` starts `python3 region_server.py DIR SETTINGS_JSON [gate]`
(uvicorn on a free loopback port, the port written to DIR/port) and yields a `Served`; the whole
process group (the server, its codec helper, multiprocessing's resource tracker) is SIGKILLed at
the end. With `gate`, every run waits in the engine until the test lets it go (`Served.gate`),
the same idea as tests/test_server_live.py's GatedEngine, across a process boundary.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from helpers.waiting import scaled


@dataclass
class Served:
    proc: subprocess.Popen
    url: str
    dir: Path

    def alive(self) -> bool:
        return self.proc.poll() is None

    def wait_entered(self, timeout: float = 30) -> None:
        """Until a run has reached the (gated) engine."""
        deadline = time.monotonic() + scaled(timeout)
        while not (self.dir / "entered").exists():
            assert self.alive(), f"the server exited with {self.proc.returncode}"
            assert time.monotonic() < deadline, "no run reached the engine"
            time.sleep(0.01)

    def open_gate(self) -> None:
        (self.dir / "entered").unlink()
        (self.dir / "go").touch()

    def pids(self) -> list[int]:
        """The server and every process it started (the codec helper among them)."""
        import psutil

        try:
            p = psutil.Process(self.proc.pid)
            return [p.pid, *(c.pid for c in p.children(recursive=True))]
        except psutil.NoSuchProcess:
            return []


@contextlib.contextmanager
def serve(tmp_path: Path, gate: bool = False, nofile: int | None = None, **settings):
    """`nofile`: the server's soft limit of open descriptors (RLIMIT_NOFILE)."""
    settings = {"backend": "numpy", "log_level": "warning", **settings}
    args = [sys.executable, __file__, str(tmp_path), json.dumps(settings), *(["gate"] if gate else [])]

    def limit() -> None:
        import resource

        if nofile is not None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))

    proc = subprocess.Popen(args, start_new_session=True, stdout=subprocess.DEVNULL, preexec_fn=limit,
                            stderr=open(tmp_path / "stderr", "wb"))  # noqa: SIM115 (the child holds it)
    try:
        deadline = time.monotonic() + scaled(60)
        while not (tmp_path / "port").exists():
            assert proc.poll() is None, (tmp_path / "stderr").read_text()[-3000:]
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.02)
        url = f"http://127.0.0.1:{(tmp_path / 'port').read_text()}"
        yield Served(proc, url, tmp_path)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(scaled(30))


def _main(where: str, settings: str, gate: bool) -> None:
    import threading

    import uvicorn
    from segfuse.server import create_app
    from segfuse.server.settings import Settings

    where_ = Path(where)
    app = create_app(Settings(**json.loads(settings)))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    rt = app.state.server_state
    while not rt.ready:
        if rt.init_error:
            raise SystemExit(f"not ready: {rt.init_error}")
        time.sleep(0.01)
    if gate:
        rt.engine = _Gate(rt.engine, where_)
    port = server.servers[0].sockets[0].getsockname()[1]
    (where_ / "port.tmp").write_text(str(port))
    (where_ / "port.tmp").rename(where_ / "port")
    thread.join()


class _Gate:
    def __init__(self, inner, where: Path):
        self.inner, self.where = inner, where

    def is_warm(self, fusion, inputs, bound=None):
        return False  # gated runs go to a run worker

    def run_batch(self, calls, **kw):
        (self.where / "entered").touch()
        deadline = time.monotonic() + scaled(300)  # a hang guard: the test opens the gate
        while not (self.where / "go").exists() and time.monotonic() < deadline:
            time.sleep(0.005)
        (self.where / "go").unlink(missing_ok=True)
        return self.inner.run_batch(calls, **kw)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def get(served: Served, path: str, **kw) -> httpx.Response:
    return httpx.get(served.url + path, timeout=scaled(30), **kw)


def post(served: Served, path: str, **kw) -> httpx.Response:
    return httpx.post(served.url + path, timeout=scaled(30), **kw)


if __name__ == "__main__":
    _main(sys.argv[1], sys.argv[2], len(sys.argv) > 3 and sys.argv[3] == "gate")
