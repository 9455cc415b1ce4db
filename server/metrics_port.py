"""`--metrics-port`: GET /metrics on a port of its own, as Triton serves it on 8002, beside the HTTP
port's /metrics (which stays). Off by default.

No bearer token here, as on Triton's metrics port: scrapers configured for Triton send none. It is
off unless asked for and listens on the service's --host; where the token must guard the metrics
too, leave it off and scrape the HTTP port's /metrics with the token (docs/operations.md, Metrics).

uvicorn serves it on a thread of its own with its own event loop: a scrape (and the GPU queries it
makes) never waits for the serving loop nor delays it. The socket is bound before the thread starts,
so a port in use is refused at once with a clear error (uvicorn would log it and exit its thread);
the app's lifespan starts and stops it with the server.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable

import uvicorn
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

THREAD = "segfuse-metrics-port"


class MetricsPortError(RuntimeError):
    pass


class _QuietThread(logging.Filter):
    """uvicorn's start and stop lines of this listener's server ("Started server process", "Shutting
    down") would read as the main server's: only its warnings and errors are logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.threadName != THREAD or record.levelno >= logging.WARNING


_quiet = _QuietThread()


def metrics_app(exposition: Callable[[], bytes]) -> Starlette:
    """GET /metrics (HEAD too) answering `exposition()`; 404 elsewhere."""
    async def metrics(request) -> Response:
        return Response(exposition(), media_type=CONTENT_TYPE_LATEST)

    return Starlette(routes=[Route("/metrics", metrics, methods=["GET"])])


class MetricsListener:
    def __init__(self, host: str, port: int, exposition: Callable[[], bytes]):
        self.host, self.port = host, port
        self.app = metrics_app(exposition)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None

    def start(self) -> int:
        """Bind and listen (MetricsPortError when the port is taken), then serve on a thread.
        Returns the port (the one the system chose for port 0)."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
            sock.listen(128)  # connections wait in the backlog until the thread's loop accepts them
        except OSError as e:
            sock.close()
            raise MetricsPortError(f"--metrics-port {self.port}: cannot listen on {self.host}:{self.port} "
                                   f"({e.strerror or e}); choose a free port or leave --metrics-port off") from None
        self._sock, self.port = sock, sock.getsockname()[1]
        config = uvicorn.Config(self.app, lifespan="off", access_log=False, log_config=None,
                                timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        # (signals stay the main server's: uvicorn installs none off the main thread)
        logging.getLogger("uvicorn.error").addFilter(_quiet)  # (once: a logger keeps a filter once)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name=THREAD, daemon=True)
        self._thread.start()
        return self.port

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and close the port (blocks until the thread ended: call it off the event loop)."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
        if self._sock is not None:
            self._sock.close()
        self._server = self._thread = self._sock = None
