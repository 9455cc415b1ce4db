"""`segfuse serve-ray`: N segfuse shards on Ray, routed by namespace.

    start(shards=2, backend="numpy", port=8000)  # ray.init (local unless an address), the shards as
                                                 # Ray actors behind HAProxy (scaleout/cluster.py)
    config(shards=2, backend="numpy")      # the Ray Serve form, for a KubeRay RayService's
                                           # serveConfigV2 (docker/rayservice.yaml) and `serve run`

The Ray Serve form has N + 1 Ray Serve applications: `segfuse` (the ingress, route `/`, built by `build_ingress`) and
`segfuse-shard-<i>` (shard i, route `/shards/shard-<i>`, built by `build_shard`), each shard one
deployment `shard` with one replica (see ingress.py for why) and one GPU (`num_gpus=1`, backend cupy)
or none (backend numpy). Settings other than the backend reach the shards as Settings.from_env
overrides (`settings`), or as SEGFUSE_* variables in the replicas' environment.
"""

from __future__ import annotations

import copy
from typing import Any

from .cluster import _count, _number, _settings, shard_resources
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
_running: dict = {}  # the ShardCluster start() made, for stop()


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


def start(shards: int = 2, backend: str = "numpy", host: str = "127.0.0.1", port: int = 8000,
          address: str | None = None, num_cpus: int | None = None, blocking: bool = False, **args):
    """`segfuse serve-ray`: Ray (a local cluster, or join `address`), `shards` shard actors and the
    router on host:port (scaleout/cluster.py). Returns the ShardCluster; `blocking` waits until
    interrupted. Stop with `stop()`."""
    from .cluster import ShardCluster

    _check(args, {"shard_cpus", "shard_gpus", "settings", "max_namespaces", "env"}, "serve-ray")
    cluster = _running["cluster"] = ShardCluster(shards, backend, host, port, **args)
    cluster.start(address=address, num_cpus=num_cpus)
    if blocking:
        cluster.wait()
    return cluster


def stop() -> None:
    cluster = _running.pop("cluster", None)
    if cluster is not None:
        cluster.stop()
