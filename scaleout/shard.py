"""One shard: a whole segfuse runtime (`segfuse.server.create_app`) inside a Ray Serve replica.

The ingress hands it an HTTP request as plain values (method, raw path, query, raw headers, body)
through a deployment handle, and gets back (status, raw headers, body) unchanged. The app is driven
in-process through httpx's ASGI transport, the library's own ASGI client, rather than behind a second
HTTP server per shard: one hop (Ray's handle) instead of two, and no port per replica.

Each start of a replica is an *incarnation* (start time and a random id): the ingress compares it with
the one it last saw to tell that Ray restarted the shard and its buffers are gone.
"""

from __future__ import annotations

import os
import time
import uuid
from contextlib import AsyncExitStack

import httpx


class Shard:
    """The deployment's class (serve_ray.py wraps it with `serve.deployment`, one replica per shard)."""

    async def __init__(self, shard_id: str, settings: dict):
        from segfuse.server import create_app
        from segfuse.server.app import wait_ready
        from segfuse.server.settings import Settings

        self.shard_id = shard_id
        self.started = time.time()
        self.incarnation = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(self.started))}/{uuid.uuid4().hex[:8]}"
        self.app = create_app(Settings.from_env(**settings))
        self.app.state.runtime.freeze_gc = True
        self._stack = AsyncExitStack()
        # The app's own lifespan (runtime start and stop), on this replica's event loop.
        await self._stack.enter_async_context(self.app.router.lifespan_context(self.app))
        await wait_ready(self.app)
        self._transport = httpx.ASGITransport(app=self.app, client=("ray-ingress", 0))

    async def forward(self, method: str, raw_path: bytes, query: bytes, headers: list, body: bytes,
                      incarnation: str | None = None):
        """(status, raw headers, body, this incarnation); with `incarnation` given and not this one,
        (None, [], b"", this incarnation) without running the request, so the ingress can restore
        fusions on a restarted shard before the request reaches it."""
        if incarnation is not None and incarnation != self.incarnation:
            return None, [], b"", self.incarnation
        url = httpx.URL("http://segfuse-shard").copy_with(raw_path=raw_path + (b"?" + query if query else b""))
        request = httpx.Request(method, url, headers=headers, content=body)
        response = await self._transport.handle_async_request(request)
        # The raw stream: httpx's .content would undo a gzip Content-Encoding.
        data = b"".join([chunk async for chunk in response.stream])
        return response.status_code, list(response.headers.raw), data, self.incarnation

    async def identity(self) -> dict:
        return {"shard": self.shard_id, "incarnation": self.incarnation, "pid": os.getpid()}

    async def __del__(self):
        await self._stack.aclose()
