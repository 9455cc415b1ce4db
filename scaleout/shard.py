"""One shard: segfuse runtimes (`segfuse.server.create_app`), one per namespace it holds, inside a Ray
Serve replica.

The ingress hands it an HTTP request as plain values (method, raw path, query, raw headers, body)
through a deployment handle, and gets back (status, raw headers, body) unchanged. Each app is driven
in-process through httpx's ASGI transport, the library's own ASGI client, rather than behind a second
HTTP server per shard: one hop (Ray's handle) instead of two, and no port per replica.

Namespaces are isolated here: each has its own runtime (buffers, regions, results, metrics), made on
its first request, so two namespaces that hash to the same shard never see each other's data under
the same names. Fusion registrations (the ingress sends them to every shard) are applied to every
runtime of the shard and replayed into the runtimes made later, so any namespace can run any fusion.
A shard holds at most `max_namespaces` runtimes (each has its worker threads and caches); a request
for one more gets 429.

Each start of a replica is an *incarnation* (start time and a random id): the ingress compares it with
the one it last saw to tell that Ray restarted the shard and its buffers are gone.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from contextlib import AsyncExitStack

import httpx
import orjson
from segfuse.server.errors import error_body

from .ingress import is_broadcast
from .routing import DEFAULT_NAMESPACE, NAMESPACE_HEADER, NamespaceError, parse_namespace

MAX_NAMESPACES = 64
_HEADER_KEY = NAMESPACE_HEADER.lower().encode()


class Shard:
    """The deployment's class (serve_ray.py wraps it with `serve.deployment`, one replica per shard)."""

    async def __init__(self, shard_id: str, settings: dict, max_namespaces: int = MAX_NAMESPACES):
        self.shard_id = shard_id
        self.settings = settings
        self.max_namespaces = max_namespaces
        self.started = time.time()
        self.incarnation = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(self.started))}/{uuid.uuid4().hex[:8]}"
        self._stack = AsyncExitStack()
        self._spaces: dict[str, httpx.ASGITransport] = {}  # namespace -> its app's transport
        self._registrations: list[tuple] = []  # fusion registrations that succeeded, in order
        # Held while a runtime is made and while a registration goes round: two first requests of one
        # namespace make one runtime, and a new runtime misses no registration made meanwhile.
        self._lock = asyncio.Lock()
        await self._space(DEFAULT_NAMESPACE)  # ready (and its errors seen) at start

    async def _space(self, namespace: str) -> httpx.ASGITransport | None:
        """The transport of the namespace's app, made (and given the registrations) on first use; None
        when the shard holds max_namespaces already."""
        transport = self._spaces.get(namespace)
        if transport is not None:
            return transport
        async with self._lock:
            return await self._make(namespace)

    async def _make(self, namespace: str) -> httpx.ASGITransport | None:
        transport = self._spaces.get(namespace)
        if transport is not None:  # made while this request waited for the lock
            return transport
        if len(self._spaces) >= self.max_namespaces:
            return None
        from segfuse.server import create_app
        from segfuse.server.app import wait_ready
        from segfuse.server.settings import Settings

        app = create_app(Settings.from_env(**self.settings))
        app.state.runtime.freeze_gc = True
        # The app's own lifespan (runtime start and stop), on this replica's event loop.
        await self._stack.enter_async_context(app.router.lifespan_context(app))
        await wait_ready(app)
        transport = self._spaces[namespace] = httpx.ASGITransport(app=app, client=("ray-ingress", 0))
        for call in self._registrations:
            await _send(transport, *call)
        return transport

    async def forward(self, method: str, raw_path: bytes, query: bytes, headers: list, body: bytes,
                      incarnation: str | None = None):
        """(status, raw headers, body, this incarnation); with `incarnation` given and not this one,
        (None, [], b"", this incarnation) without running the request, so the ingress can restore
        fusions on a restarted shard before the request reaches it."""
        if incarnation is not None and incarnation != self.incarnation:
            return None, [], b"", self.incarnation
        value = next((v.decode("latin-1") for k, v in headers if k.lower() == _HEADER_KEY), None)
        try:
            namespace = parse_namespace(value)
        except NamespaceError as e:  # the ingress checks first; a direct caller gets the same answer
            return (*_error(400, str(e), ["header", NAMESPACE_HEADER]), self.incarnation)
        call = (method, raw_path, query, headers, body)
        path = raw_path.split(b"?", 1)[0].decode("latin-1")
        if is_broadcast(method, path):
            return (*await self._register(namespace, call), self.incarnation)
        transport = await self._space(namespace)
        if transport is None:
            return (*_error(429, f"shard {self.shard_id} holds {self.max_namespaces} namespaces, the most it "
                                 f"may; namespace '{namespace}' has no runtime here", ["header", NAMESPACE_HEADER]),
                    self.incarnation)
        return (*await _send(transport, *call), self.incarnation)

    async def _register(self, namespace: str, call: tuple):
        """A registration (or removal) applied to every namespace's runtime, kept for later ones; the
        answer is the namespace's runtime's (the default's when the namespace has none here)."""
        async with self._lock:
            answers = {ns: await _send(t, *call) for ns, t in list(self._spaces.items())}
            own = answers.get(namespace, answers[DEFAULT_NAMESPACE])
            if own[0] < 300:
                self._registrations.append(call)
        return own

    async def identity(self) -> dict:
        return {"shard": self.shard_id, "incarnation": self.incarnation, "pid": os.getpid(),
                "namespaces": sorted(self._spaces)}

    async def __del__(self):
        await self._stack.aclose()


async def _send(transport: httpx.ASGITransport, method: str, raw_path: bytes, query: bytes, headers: list,
                body: bytes):
    url = httpx.URL("http://segfuse-shard").copy_with(raw_path=raw_path + (b"?" + query if query else b""))
    response = await transport.handle_async_request(httpx.Request(method, url, headers=headers, content=body))
    # The raw stream: httpx's .content would undo a gzip Content-Encoding.
    data = b"".join([chunk async for chunk in response.stream])
    return response.status_code, list(response.headers.raw), data


def _error(status: int, message: str, loc: list):
    body = orjson.dumps(error_body(message, [{"loc": loc, "msg": message}]))
    return status, [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())], body
