"""One shard: segfuse runtimes (`segfuse.server.create_app`), one per namespace it holds, behind one
ASGI app (`ShardApp`) that a shard's own HTTP server serves (`segfuse serve --shard-id`, or a Ray
actor: scaleout/shard_host.py), behind the router of scaleout/router.py.

A request goes to its namespace's app as it came (the ASGI scope, receive and send are handed on):
nothing is re-framed or copied, so a shard's run costs what a `segfuse serve` process's does, plus
reading one header.

Namespaces are isolated here: each has its own runtime (buffers, regions, results, metrics), made on
its first request, so two namespaces that hash to the same shard never see each other's data under
the same names. Fusion registrations (sent to every shard) are applied to every runtime of the shard
and replayed into the runtimes made later, so any namespace can run any fusion. A shard holds at
most `max_namespaces` runtimes (each has its worker threads and caches); a request for one more gets
429. GET /metrics is every runtime's metrics in one exposition, labelled shard and namespace.

Each start of a shard is an *incarnation* (start time and a random id), told to the registry
(scaleout/registry.py) at start: a shard that replaces an earlier one gets that one's registrations
back before it answers anything, and from then on its 404s say that the shard restarted.
"""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from contextlib import AsyncExitStack
from urllib.parse import unquote

import orjson

from . import metrics, registry
from .asgi import Answer, Call, error, with_body
from .routing import DEFAULT_NAMESPACE, NAMESPACE_HEADER, NamespaceError, is_broadcast, parse_namespace

MAX_NAMESPACES = 64
_HEADER_KEY = NAMESPACE_HEADER.lower().encode()


class ShardApp:
    """The ASGI app of shard `shard_id`. `settings`: Settings.from_env overrides of every runtime;
    `registry`: a local `registry.Registry` (tests), an actor handle (Ray: `registry.actor()`), or
    None. Started by its lifespan (or `start()`), stopped by `stop()`."""

    def __init__(self, shard_id: str, settings: dict, max_namespaces: int = MAX_NAMESPACES, registry_handle=None):
        if isinstance(max_namespaces, bool) or not isinstance(max_namespaces, int) or max_namespaces < 1:
            raise ValueError(f"max_namespaces must be at least 1, not {max_namespaces!r}")
        self.shard_id = shard_id
        self.settings = settings
        self.max_namespaces = max_namespaces
        self.started = time.time()
        self.incarnation = f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime(self.started))}/{uuid.uuid4().hex[:8]}"
        self.replaced: str | None = None  # the incarnation this one replaced
        self._stack = AsyncExitStack()
        self._spaces: dict = {}  # namespace -> its runtime's ASGI app
        self._registrations: list[Call] = []  # fusion registrations that succeeded, in order
        # Held while a runtime is made and while a registration goes round: two first requests of one
        # namespace make one runtime, and a new runtime misses no registration made meanwhile.
        self._lock = asyncio.Lock()
        self._registry = registry_handle

    async def start(self) -> None:
        await self._space(DEFAULT_NAMESPACE)  # ready (and its errors seen) at start
        if self._registry is not None:
            known = await registry.call(self._registry, "start", self.shard_id, self.incarnation)
            if known is not None:
                self.replaced, calls = known
                for call in calls:  # the predecessor's registrations, before any request
                    await self._register(DEFAULT_NAMESPACE, call, record=False)

    async def stop(self) -> None:
        await self._stack.aclose()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http":
            return await self._http(scope, receive, send)
        if scope["type"] == "lifespan":
            return await self._lifespan(receive, send)
        raise RuntimeError(f"a segfuse shard serves HTTP, not {scope['type']}")

    async def _http(self, scope, receive, send) -> None:
        raw = next((v for k, v in scope["headers"] if k == _HEADER_KEY), None)
        try:
            namespace = parse_namespace(None if raw is None else raw.decode("latin-1"))
        except NamespaceError as e:
            return await _respond(send, error(400, str(e), ["header", NAMESPACE_HEADER]))
        method, path = scope["method"], scope["path"]
        if is_broadcast(method, path) or (method == "GET" and path == "/metrics"):
            call = (method, scope.get("raw_path") or path.encode(), scope.get("query_string", b""),
                    list(scope["headers"]), await _body(receive))
            answer = await (self._metrics(call[3]) if path == "/metrics" else self._register(namespace, call))
            return await _respond(send, self._noted(answer))
        app = self._spaces.get(namespace) or await self._space(namespace)
        if app is None:
            return await _respond(send, error(
                429, f"shard {self.shard_id} holds {self.max_namespaces} namespaces, the most it may; "
                     f"namespace '{namespace}' has no runtime here", ["header", NAMESPACE_HEADER]))
        await app(scope, receive, send if self.replaced is None else _Noting(self, send))

    async def _lifespan(self, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.start()
                except Exception as e:  # noqa: BLE001 - the server reports it and does not serve
                    await send({"type": "lifespan.startup.failed", "message": f"{type(e).__name__}: {e}"})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def answer(self, call: Call) -> Answer:
        """(status, raw headers, body) of one request given as plain values (tests, tools)."""
        return await call_app(self, call)

    async def _space(self, namespace: str):
        """The namespace's app, made (and given the registrations) on first use; None when the shard
        holds max_namespaces already."""
        async with self._lock:
            return await self._make(namespace)

    async def _make(self, namespace: str):
        app = self._spaces.get(namespace)
        if app is not None:  # made while this request waited for the lock
            return app
        if len(self._spaces) >= self.max_namespaces:
            return None
        from segfuse.server import create_app
        from segfuse.server.app import wait_ready
        from segfuse.server.settings import Settings

        app = create_app(Settings.from_env(**self.settings))
        app.state.server_state.freeze_gc = True
        app.state.server_state.shard = self.shard_id  # GET /v2's `shard`, segfuse_gpu_info's label
        # The app's own lifespan (runtime start and stop), on this server's event loop.
        await self._stack.enter_async_context(app.router.lifespan_context(app))
        await wait_ready(app)
        for call in self._registrations:
            await call_app(app, call)
        self._spaces[namespace] = app
        return app

    async def _register(self, namespace: str, call: Call, record: bool = True) -> Answer:
        """A registration (or removal) applied to every namespace's runtime, kept for later ones and
        in the registry; the answer is the namespace's runtime's (the default's when the namespace
        has none here)."""
        async with self._lock:
            answers = {ns: await call_app(app, call) for ns, app in list(self._spaces.items())}
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
        answers = [await call_app(app, ("GET", b"/metrics", b"", kept, b"")) for _, app in spaces]
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

    def identity(self) -> dict:
        return {"shard": self.shard_id, "incarnation": self.incarnation, "replaced": self.replaced,
                "pid": os.getpid(), "namespaces": sorted(self._spaces)}


class _Noting:
    """`send` of a shard that replaced another: a 404 is held until its body is whole, then noted."""

    def __init__(self, shard: ShardApp, send):
        self.shard, self.send, self.held = shard, send, None

    async def __call__(self, message) -> None:
        if self.held is None:
            if message["type"] == "http.response.start" and message["status"] == 404:
                self.held = [message]
                return
            return await self.send(message)
        self.held.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            status, headers, body = self.shard._noted(_answer_of(self.held))
            await _respond(self.send, (status, headers, body))


def _scope(method: str, raw_path: bytes, query: bytes, headers: list) -> dict:
    path = raw_path.split(b"?", 1)[0]
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method, "scheme": "http",
            "path": unquote(path.decode("latin-1")), "raw_path": path, "query_string": query, "root_path": "",
            "headers": [(k.lower(), v) for k, v in headers], "client": ("segfuse-shard", 0),
            "server": ("segfuse-shard", 80)}


def _receiver(body: bytes):
    done = False

    async def receive():
        nonlocal done
        if not done:
            done = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Future()  # the client stays connected until the answer is sent

    return receive


async def _body(receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


def _answer_of(messages: list) -> Answer:
    start = next(m for m in messages if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in messages if m["type"] == "http.response.body")
    return start["status"], list(start.get("headers", [])), body


async def _respond(send, answer: Answer) -> None:
    status, headers, body = answer
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def call_app(app, call: Call) -> Answer:
    """One request, given as plain values, to an ASGI app: its answer as plain values."""
    method, raw_path, query, headers, body = call
    sent: list = []

    async def send(message):
        sent.append(message)

    await app(_scope(method, raw_path, query, headers), _receiver(body), send)
    return _answer_of(sent)
