"""`segfuse serve-ray`: N segfuse shards on Ray behind the router (scaleout/cluster.py).

    start(shards=2, backend="numpy", port=8000)   # a local Ray cluster, its shards, the router
    start(shards=2, backend="cupy", address="ray://head:10001", host="0.0.0.0")   # join a cluster
    stop()
"""

from __future__ import annotations

_running: dict = {}  # the ShardCluster start() made, for stop()


def check_installed() -> None:
    try:
        import ray  # noqa: F401
    except ImportError as e:
        raise ImportError(f"segfuse serve-ray needs Ray: pip install 'segfuse[ray]' ({e})") from None


def start(shards: int = 2, backend: str = "numpy", host: str = "127.0.0.1", port: int = 8000,
          address: str | None = None, num_cpus: int | None = None, **args):
    """Ray (a local cluster, or join `address`: auto, HOST:PORT, or ray://HOST:10001 from outside the
    cluster), `shards` shard actors and the router on host:port. Returns the ShardCluster (its `wait()`
    blocks until interrupted). Stop with `stop()` (the shards of a joined cluster stay: see cluster.py)."""
    from .cluster import ShardCluster

    cluster = _running["cluster"] = ShardCluster(shards, backend, host, port, **args)
    cluster.start(address=address, num_cpus=num_cpus)
    return cluster


def stop() -> None:
    cluster = _running.pop("cluster", None)
    if cluster is not None:
        cluster.stop()
