"""`segfuse serve-ray`: N segfuse shards on Ray Serve behind a namespace-routing ingress (issue 18).

    build_app({"shards": 2, "backend": "numpy"})  # a Ray Serve Application (also `serve run`'s builder)
    start(shards=2, backend="numpy", port=8000)  # ray.init (local unless an address), serve.run

Each shard is its own deployment `shard-<i>` with one replica (see ingress.py for why) and one GPU
(`num_gpus=1`, backend cupy) or none (backend numpy). Settings other than the backend reach the shards
as Settings.from_env overrides (`settings`), or as SEGFUSE_* variables in the replicas' environment.
"""

from __future__ import annotations

import signal
from typing import Any

APP_NAME = "segfuse"
# Requests a replica takes at once. Ray's default (5) would queue in Ray what the segfuse runtime
# itself batches and bounds (max_queued_runs, then 429).
MAX_ONGOING = 1024


def check_installed() -> None:
    _serve()


def _serve():
    try:
        from ray import serve
    except ImportError as e:
        raise ImportError(f"segfuse serve-ray needs Ray Serve: pip install 'segfuse[ray]' ({e})") from None
    return serve


def build_app(args: dict[str, Any]):
    """The application: `args` takes shards (default 2), backend ("numpy" or "cupy"; default numpy),
    shard_cpus (CPUs reserved per shard, default 1), ingress_cpus (default 0: it waits on the shards),
    settings (dict of Settings overrides for every shard). A `serve run` config names it as its
    import_path."""
    serve = _serve()
    from .ingress import Ingress
    from .shard import Shard

    known = {"shards", "backend", "shard_cpus", "ingress_cpus", "settings"}
    unknown = set(args) - known
    if unknown:
        raise ValueError(f"unknown serve-ray arguments {sorted(unknown)}; known: {sorted(known)}")
    n = int(args.get("shards", 2))
    backend = args.get("backend", "numpy")
    if n < 1:
        raise ValueError(f"shards must be at least 1, not {n}")
    if backend not in ("numpy", "cupy"):
        raise ValueError(f"backend must be numpy or cupy (a shard owns one GPU or none), not {backend!r}")
    settings = {**dict(args.get("settings") or {}), "backend": backend}
    if backend == "cupy":
        settings["device"] = 0  # Ray sets CUDA_VISIBLE_DEVICES to the replica's one GPU
    actor = {"num_cpus": float(args.get("shard_cpus", 1)), "num_gpus": 1 if backend == "cupy" else 0}
    shard = serve.deployment(Shard)
    shards = {f"shard-{i}": shard.options(name=f"shard-{i}", num_replicas=1, max_ongoing_requests=MAX_ONGOING,
                                          ray_actor_options=actor).bind(f"shard-{i}", settings)
              for i in range(n)}
    ingress = serve.deployment(Ingress).options(
        name="ingress", max_ongoing_requests=MAX_ONGOING,
        ray_actor_options={"num_cpus": float(args.get("ingress_cpus", 0))})
    return ingress.bind(shards)


def start(shards: int = 2, backend: str = "numpy", host: str = "127.0.0.1", port: int = 8000,
          address: str | None = None, num_cpus: int | None = None, blocking: bool = False, **args):
    """Start Ray (a local cluster, or join `address`), Serve's HTTP proxy on host:port and the app.
    Returns the ingress's DeploymentHandle; `blocking` waits until interrupted. Stop with `stop()`."""
    import ray

    serve = _serve()
    app = build_app({"shards": shards, "backend": backend, **args})  # bad arguments fail before Ray starts
    if not ray.is_initialized():
        ray.init(address=address, num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    if blocking:
        # SIGTERM (docker stop, kubectl, kill) ends the wait as Ctrl-C does, so the caller's stop()
        # runs; Ray's own driver handler (set by ray.init) exits and leaves the local cluster's agents.
        signal.signal(signal.SIGTERM, _interrupt)
    serve.start(http_options={"host": host, "port": port})
    return serve.run(app, name=APP_NAME, route_prefix="/", blocking=blocking)


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def stop() -> None:
    import ray

    _serve().shutdown()
    ray.shutdown()
