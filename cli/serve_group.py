"""`segfuse serve --processes N [--mps] [--route]`: N server processes on one host, on ports PORT ..
PORT+N-1; with --route, shards shard-0..N-1 on PORT+1 .. PORT+N behind a router on PORT.

One server process is bounded by its event loop (HTTP and Python bookkeeping), not by the GPU, so
a GPU host runs several. Each is a shard with its own buffers and fusions; clients send a buffer's
runs to the process that holds it. Without MPS the processes' CUDA contexts take turns on the GPU;
with `--mps` NVIDIA's MPS control daemon is started first, in private pipe and log folders that
only these processes are told about, and quit after they stopped, so their kernels share the GPU.

The group stops as a whole: SIGTERM or SIGINT stops every process (each drains its admitted runs),
and one process ending on its own stops the rest, so a supervisor (Docker, Kubernetes, systemd)
sees the failure and restarts the group.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from .common import UserError

GRACE_S = 30  # how long processes get to drain after SIGTERM before they are killed
CHILD = "import sys; from segfuse.cli import main; sys.exit(main(['serve']))"


def child_env(settings, port: int, base: dict) -> dict:
    """The environment that gives a child `segfuse serve` these settings on `port` (settings travel
    as SEGFUSE_* variables, which also keeps a token out of `ps`)."""
    env = dict(base)
    for f in dataclasses.fields(settings):
        value = getattr(settings, f.name)
        key = settings.ENV_PREFIX + f.name.upper()
        if f.name == "extra":
            continue
        if value is None:
            env.pop(key, None)
        else:
            env[key] = str(value)
    env[settings.ENV_PREFIX + "PORT"] = str(port)
    return env


class MpsDaemon:
    """NVIDIA's MPS control daemon in private folders; `env` is what its clients need."""

    def __init__(self):
        control = shutil.which("nvidia-cuda-mps-control")
        if control is None:
            raise UserError("--mps needs nvidia-cuda-mps-control on PATH (part of the NVIDIA driver; in a "
                            "container the NVIDIA Container Toolkit mounts it with the 'utility' capability)")
        self.control = control
        self.dir = tempfile.mkdtemp(prefix="segfuse-mps-")
        self.env = {"CUDA_MPS_PIPE_DIRECTORY": os.path.join(self.dir, "pipe"),
                    "CUDA_MPS_LOG_DIRECTORY": os.path.join(self.dir, "log")}
        for d in self.env.values():
            os.makedirs(d)
        r = subprocess.run([control, "-d"], env={**os.environ, **self.env}, capture_output=True, text=True,
                           timeout=30)
        if r.returncode != 0:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise UserError(f"nvidia-cuda-mps-control -d failed ({r.returncode}): {(r.stderr or r.stdout).strip()}")
        print(f"segfuse: MPS control daemon started (pipe {self.env['CUDA_MPS_PIPE_DIRECTORY']})", file=sys.stderr)

    def quit(self) -> None:
        try:
            subprocess.run([self.control], input="quit\n", env={**os.environ, **self.env}, text=True,
                           capture_output=True, timeout=30)
        except subprocess.TimeoutExpired:  # a hung MPS server: its clients are gone, so end it
            subprocess.run(["pkill", "-f", f"nvidia-cuda-mps-.*{self.dir}"], timeout=10, check=False)
        shutil.rmtree(self.dir, ignore_errors=True)
        print("segfuse: MPS control daemon quit", file=sys.stderr)


def _wait_live(children: list, first_port: int, stopped, timeout_s: float = 600) -> None:
    """Until every child answers its liveness probe (a CUDA start may take a while); a child that
    exits or a stop ends the wait."""
    import httpx

    deadline = time.monotonic() + timeout_s
    for k, child in enumerate(children):
        while not stopped() and child.poll() is None and time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{first_port + k}/v2/health/live", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)


def serve_group(settings, processes: int, mps: bool, route: bool = False, router_busy_polling: bool = False) -> int:
    first = settings.port + (1 if route else 0)  # with a router: it on PORT, the shards after it
    if first + processes - 1 > 65535:
        raise UserError(f"--processes {processes} from port {settings.port} runs past port 65535")
    router = None
    if route:
        try:
            from segfuse.scaleout.cluster import haproxy_binary

            haproxy_binary()
        except (ImportError, FileNotFoundError) as e:
            raise UserError(str(e)) from None
    daemon = MpsDaemon() if mps else None
    stopping = []

    def stop(signum, _frame):
        stopping.append(signum)

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    children: list[subprocess.Popen] = []
    status = 0
    try:
        base = {**os.environ, **(daemon.env if daemon else {})}
        for k in range(processes):
            env = child_env(settings, first + k, base)
            if route:
                from segfuse.scaleout.cluster import SHARD_KEEP_ALIVE_S

                # behind the router, which closes a client's idle connection before a shard would
                env.update(SEGFUSE_SHARD_ID=f"shard-{k}", SEGFUSE_HOST="127.0.0.1",
                           SEGFUSE_KEEP_ALIVE_TIMEOUT=str(SHARD_KEEP_ALIVE_S))
            children.append(subprocess.Popen([sys.executable, "-c", CHILD], env=env))
        print(f"segfuse: {processes} server processes on {settings.host}:{first}-{first + processes - 1}"
              f"{' under MPS' if daemon else ''}", file=sys.stderr)
        if route:
            from segfuse.scaleout.cluster import LocalRouter

            _wait_live(children, first, lambda: bool(stopping))  # a shard down at HAProxy's first check stays out a second
            router = LocalRouter({f"shard-{k}": ("127.0.0.1", first + k) for k in range(processes)},
                                 (settings.host, settings.port), settings.keep_alive_timeout,
                                 router_busy_polling)
            print(f"segfuse: the router on {settings.host}:{settings.port} sends each namespace to its shard",
                  file=sys.stderr)
        while not stopping:
            ended = [c for c in children if c.poll() is not None]
            if ended:
                status = ended[0].returncode or 1
                print(f"segfuse: the server on port {settings.port + children.index(ended[0])} exited with "
                      f"{ended[0].returncode}; stopping the others", file=sys.stderr)
                break
            time.sleep(0.2)
    finally:
        if router is not None:
            router.stop()
        for c in children:
            if c.poll() is None:
                c.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + GRACE_S
        for c in children:
            try:
                c.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                c.kill()
                c.wait()
        if daemon:  # after its clients: MPS waits for them
            daemon.quit()
        for s, handler in old.items():
            signal.signal(s, handler)
    return status
