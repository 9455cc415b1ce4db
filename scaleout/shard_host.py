"""A shard's own HTTP server: uvicorn serving a `ShardApp` on a port of its own, which the router
(scaleout/router.py) sends the shard's namespaces to.

`ShardHost` is the Ray actor that runs one (`segfuse serve-ray`): Ray places it (its CPUs and GPU
share), and restarts it when its process dies; each start is a new incarnation on a new port, which
`address()` reports and the router follows (scaleout/serve_ray.py). The server runs in a thread of
the actor's process, so the shard reaches the registry actor itself; if that server stops for any
reason the process exits, and Ray starts another.
"""

from __future__ import annotations

import os
import threading
import time

from .shard import MAX_NAMESPACES, ShardApp

START_TIMEOUT_S = 300.0  # a CUDA context and the first kernels of a cold cache take a while


def shard_server(app: ShardApp, host: str, port: int = 0):
    """A uvicorn.Server serving `app` on host:port (0: a free port), with `segfuse serve`'s HTTP limits
    and logging."""
    import uvicorn
    from segfuse.server.http_limits import server_options
    from segfuse.server.logs import log_config
    from segfuse.server.settings import Settings

    settings = Settings.from_env(**app.settings)
    config = uvicorn.Config(app, host=host, port=port, lifespan="on", log_level=settings.log_level,
                            access_log=settings.access_log,
                            log_config=log_config(settings.log_level, settings.log_format), **server_options(settings))
    return uvicorn.Server(config)


def bound_port(server) -> int:
    return server.servers[0].sockets[0].getsockname()[1]


class ShardHost:
    """Ray actor class: shard `shard_id`'s server on `host` (default: the node's address), a free
    port. `settings`: Settings overrides of its runtimes."""

    def __init__(self, shard_id: str, settings: dict, max_namespaces: int = MAX_NAMESPACES, host: str | None = None):
        import ray

        from . import registry

        host = host or ray.util.get_node_ip_address()  # None: the node's address, for the router on another
        self.app = ShardApp(shard_id, settings, max_namespaces, registry.actor())
        self.host = host
        self.server = shard_server(self.app, host)
        self.thread = threading.Thread(target=self._serve, name=f"segfuse-{shard_id}", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"shard {shard_id}'s server did not start (see the actor's log)")
            time.sleep(0.02)
        self.port = bound_port(self.server)

    def _serve(self) -> None:
        try:
            self.server.run()
        finally:
            if self.server.started:  # it served and stopped: this incarnation is over; Ray starts another
                os._exit(1)

    def address(self) -> dict:
        """Where the shard serves, and which incarnation it is."""
        return {"host": self.host, "port": self.port, **self.app.identity()}
