"""The service in the test process: a real uvicorn server on a free loopback port, in a thread."""

from __future__ import annotations

import threading
import time

import pytest

from helpers.waiting import scaled


def settings(**kw):
    from segfuse.server.settings import Settings

    kw.setdefault("backend", "numpy")
    return Settings(**kw)


def skip_if_not_ready(app) -> None:
    """Skip where the cupy backend cannot start here; fail where any other backend did not."""
    rt = app.state.server_state
    if not rt.ready:
        if rt.settings.backend == "cupy":
            pytest.skip(f"cupy backend not available: {rt.init_error}")
        raise AssertionError(f"server did not become ready: {rt.init_error}")


class LiveServer:
    """A real uvicorn server on a free loopback port, in a thread of the test process."""

    def __init__(self, **kw):
        import uvicorn
        from segfuse.server import create_app

        self.app = create_app(settings(**kw))
        # Port 0: uvicorn binds a free loopback port itself (a socket handed in from outside
        # costs ~40 ms per request here: Nagle and delayed ACKs).
        config = uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning", lifespan="on",
                                timeout_keep_alive=30)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.url = ""

    def start(self) -> LiveServer:
        import httpx

        self.thread.start()
        deadline = time.monotonic() + scaled(120)
        while time.monotonic() < deadline:
            if self.server.started:
                if not self.url:
                    port = self.server.servers[0].sockets[0].getsockname()[1]
                    self.url = f"http://127.0.0.1:{port}"
                try:
                    if httpx.get(self.url + "/v2/health/ready", timeout=scaled(5)).status_code == 200:
                        return self
                except httpx.TransportError:
                    pass
                if self.app.state.server_state.init_error:
                    break
            time.sleep(0.02)
        self.stop()
        skip_if_not_ready(self.app)
        raise AssertionError("uvicorn did not start")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=scaled(30))

    @property
    def runtime(self):
        return self.app.state.server_state
