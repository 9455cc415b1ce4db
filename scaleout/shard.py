"""One shard: segfuse runtimes (`segfuse.server.create_app`), one per namespace it holds, inside a Ray
Serve replica.

Requests reach it two ways, both as the same plain values (scaleout/asgi.py): from the ingress through
a deployment handle (`forward`), and over HTTP on the shard's own route `/shards/shard-<i>` (`__call__`,
the SDK's direct sharded mode). Each app is driven in-process through httpx's ASGI transport, the
library's own ASGI client, rather than behind a second HTTP server per shard: no port per replica.

Namespaces are isolated here: each has its own runtime (buffers, regions, results, metrics), made on
its first request, so two namespaces that hash to the same shard never see each other's data under
the same names. Fusion registrations (sent to every shard) are applied to every runtime of the shard
and replayed into the runtimes made later, so any namespace can run any fusion. A shard holds at
most `max_namespaces` runtimes (each has its worker threads and caches); a request for one more gets
429. GET /metrics is every runtime's metrics in one exposition, labelled shard and namespace.

Each start of a replica is an *incarnation* (start time and a random id), told to the registry
(scaleout/registry.py) at start: a replica that replaces an earlier one gets that one's registrations
back before it answers anything, and from then on its 404s say that the shard restarted.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from contextlib import AsyncExitStack

import httpx
import orjson
from starlette.requests import Request
from starlette.responses import Response

from . import metrics, registry
from .asgi import Answer, Call, call_of, error, header, response_of, with_body
from .routing import DEFAULT_NAMESPACE, NAMESPACE_HEADER, NamespaceError, is_broadcast, parse_namespace

MAX_NAMESPACES = 64
_HEADER_KEY = NAMESPACE_HEADER.lower().encode()


class Shard:
    """The deployment's class (serve_ray.py wraps it with `serve.deployment`, one replica per shard).
    `registry`: the registry actor's name (on Ray), a local `registry.Registry` (tests) or None."""

    async def __init__(self, shard_id: str, settings: dict, max_namespaces: int = MAX_NAMESPACES,
                       registry_name: str | registry.Registry | None = registry.REGISTRY_NAME):
        if not isinstance(max_namespaces, int) or max_namespaces < 1:
            raise ValueError(f"max_namespaces must be at least 1, not {max_namespaces!r}")
        self.shard_id = shard_id
        self.settings = settings
        self.max_namespaces = max_namespaces
        self.started = time.time()
        self.incarnation = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(self.started))}/{uuid.uuid4().hex[:8]}"
        self.replaced: str | None = None  # the incarnation this one replaced
        self._stack = AsyncExitStack()
        self._spaces: dict[str, httpx.ASGITransport] = {}  # namespace -> its app's transport
        self._registrations: list[Call] = []  # fusion registrations that succeeded, in order
        # Held while a runtime is made and while a registration goes round: two first requests of one
        # namespace make one runtime, and a new runtime misses no registration made meanwhile.
        self._lock = asyncio.Lock()
        self._registry = registry.actor() if isinstance(registry_name, str) else registry_name
        await self._space(DEFAULT_NAMESPACE)  # ready (and its errors seen) at start
        if self._registry is not None:
            known = await registry.call(self._registry, "start", shard_id, self.incarnation)
            if known is not None:
                self.replaced, calls = known
                for call in calls:  # the predecessor's registrations, before any request
                    await self._register(DEFAULT_NAMESPACE, call, record=False)

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
        app.state.server_state.freeze_gc = True
        app.state.server_state.shard = self.shard_id  # GET /v2's `shard`, segfuse_gpu_info's label
        # The app's own lifespan (runtime start and stop), on this replica's event loop.
        await self._stack.enter_async_context(app.router.lifespan_context(app))
        await wait_ready(app)
        transport = self._spaces[namespace] = httpx.ASGITransport(app=app, client=("ray-ingress", 0))
        for call in self._registrations:
            await _send(transport, *call)
        return transport

    async def forward(self, method: str, raw_path: bytes, query: bytes, headers: list, body: bytes) -> Answer:
        """(status, raw headers, body) of one request (what the ingress calls through its handle)."""
        try:
            namespace = parse_namespace(header(headers, _HEADER_KEY))
        except NamespaceError as e:  # the ingress checks first; a direct caller gets the same answer
            return error(400, str(e), ["header", NAMESPACE_HEADER])
        call = (method, raw_path, query, headers, body)
        path = raw_path.split(b"?", 1)[0].decode("latin-1")
        if is_broadcast(method, path):
            return self._noted(await self._register(namespace, call))
        if method == "GET" and path == "/metrics":
            return await self._metrics(headers)
        transport = await self._space(namespace)
        if transport is None:
            return error(429, f"shard {self.shard_id} holds {self.max_namespaces} namespaces, the most it may; "
                              f"namespace '{namespace}' has no runtime here", ["header", NAMESPACE_HEADER])
        return self._noted(await _send(transport, *call))

    async def __call__(self, request: Request) -> Response:
        """The shard's own HTTP route (`/shards/shard-<i>`): the SDK's direct sharded mode."""
        return response_of(await self.forward(*await call_of(request)), self.shard_id)

    async def _register(self, namespace: str, call: Call, record: bool = True) -> Answer:
        """A registration (or removal) applied to every namespace's runtime, kept for later ones and
        in the registry; the answer is the namespace's runtime's (the default's when the namespace
        has none here)."""
        async with self._lock:
            answers = {ns: await _send(t, *call) for ns, t in list(self._spaces.items())}
            own = answers.get(namespace, answers[DEFAULT_NAMESPACE])
            if own[0] < 300:
                registry.remember(self._registrations, call)
                if record and self._registry is not None:
                    await registry.call(self._registry, "record", self.shard_id, call)
        return own

    async def _metrics(self, headers: list) -> Answer:
        """Every runtime's /metrics, labelled with this shard and the namespace (the request's own
        headers go along: a token applies; the text comes back uncompressed)."""
        kept = [(k, v) for k, v in headers if k.lower() != b"accept-encoding"]
        spaces = list(self._spaces.items())
        answers = [await _send(t, "GET", b"/metrics", b"", kept, b"") for _, t in spaces]
        refused = next((a for a in answers if a[0] != 200), None)
        if refused is not None:  # e.g. 401: every runtime has the same token
            return refused
        text = metrics.merge([({"shard": self.shard_id, "namespace": ns}, a[2]) for (ns, _), a in zip(spaces, answers)])
        return with_body(answers[0], text)

    def _noted(self, answer: Answer) -> Answer:
        """A 404 from a shard that replaced another says so: what the namespace held before is gone."""
        if answer[0] != 404 or self.replaced is None:
            return answer
        try:
            doc = orjson.loads(answer[2])
        except orjson.JSONDecodeError:
            return answer
        started = self.incarnation.split("/")[0]
        doc["error"] = (f"{doc.get('error', 'not found')} (shard {self.shard_id} restarted at {started}: its "
                        "buffers, regions and results from before then are lost)")
        return with_body(answer, orjson.dumps(doc))

    async def identity(self) -> dict:
        return {"shard": self.shard_id, "incarnation": self.incarnation, "replaced": self.replaced,
                "pid": os.getpid(), "namespaces": sorted(self._spaces)}

    async def __del__(self):
        await self._stack.aclose()


async def _send(transport: httpx.ASGITransport, method: str, raw_path: bytes, query: bytes, headers: list,
                body: bytes) -> Answer:
    url = httpx.URL("http://segfuse-shard").copy_with(raw_path=raw_path + (b"?" + query if query else b""))
    response = await transport.handle_async_request(httpx.Request(method, url, headers=headers, content=body))
    # The raw stream: httpx's .content would undo a gzip Content-Encoding.
    data = b"".join([chunk async for chunk in response.stream])
    return response.status_code, list(response.headers.raw), data
