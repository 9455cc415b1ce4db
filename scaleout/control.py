"""The control app: the requests that concern every shard, fanned out over HTTP to the shards'
own servers.

Why a separate path: the router (HAProxy, configured by scaleout/router.py) carries the data path:
each buffer, run, plan or region request goes straight to the shard that holds its namespace, with
no code of ours in between. A few requests speak for all shards at once, and a load balancer can
neither send one request to every server nor merge their answers: fusion registration and removal
(`routing.broadcast_routes()`: every shard must be able to run every fusion), GET /metrics (one
exposition of every shard) and GET /v2/health/ready (ready when every shard is). The router sends
those here. They are rare and small, so one Python hop on them costs nothing that matters, and the
runs never take it.

Semantics:
- a malformed Segfuse-Namespace header: 400 naming the header;
- GET /v2/health/live: this app answers itself (it is up);
- GET /v2/health/ready: 200 when every shard answers 200 to it, else 503 naming those that do not;
- GET /metrics: every shard's exposition merged, no labels added (each shard labels its own samples);
  the first refusal (say 401 without the token) is passed through;
- a broadcast: sent to every shard at once; when they agree (`routing.broadcast_outcome`), the answer
  of the namespace's home shard, else 503 (only unreachable shards failed: send it again; the shards
  that were reached have applied it, and a registration of the same graph succeeds again) or 502;
- anything else that reaches it: the namespace's home shard's answer.
Answers from a shard come back unchanged (status, headers, raw body: a gzip body stays gzip) plus
`Segfuse-Shard` naming it. A shard that cannot be reached (refused, reset, timed out) counts as a 503
with Retry-After: 1, never a 500 here. Shards are hashed over the configured table (`set_shards`
replaces it when a shard moves), so a namespace never moves to a shard without its data.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager
from dataclasses import dataclass

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount

from . import metrics
from .asgi import Answer, Call, call_of, error, header, response_of, with_body
from .routing import (
    NAMESPACE_HEADER,
    NamespaceError,
    broadcast_outcome,
    is_broadcast,
    parse_namespace,
    shard_for,
)

CONNECT_TIMEOUT_S = 5.0  # the router's own `timeout connect`
MAX_CONNECTIONS = 512  # to all shards together: a broadcast takes one per shard
_HOP_BY_HOP = frozenset({b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"te",
                         b"trailer", b"upgrade", b"proxy-authenticate", b"proxy-authorization"})
_NOT_FORWARDED = _HOP_BY_HOP | {b"host", b"content-length"}  # httpx sets both for the shard
# The server in front of this app (uvicorn) adds its own Date and Server: the shard's would repeat them.
_NOT_RETURNED = _HOP_BY_HOP | {b"date", b"server"}


@dataclass(frozen=True)
class _Table:
    """The shards at one moment: a request keeps the table it began with."""
    urls: dict[str, httpx.URL]
    ids: tuple[str, ...]


def create_control_app(shards: dict[str, str], timeout_s: float = 300.0) -> Starlette:
    """The control app over `shards` (shard id -> base URL, e.g. "http://127.0.0.1:8101"). `timeout_s`
    bounds a shard's answer (a registration may compile for a while)."""
    timeout = httpx.Timeout(timeout_s, connect=min(CONNECT_TIMEOUT_S, timeout_s))

    @asynccontextmanager
    async def lifespan(app: Starlette):
        limits = httpx.Limits(max_connections=MAX_CONNECTIONS, max_keepalive_connections=max(32, 4 * len(shards)))
        async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
            app.state.client = client
            yield

    app = Starlette(routes=[Mount("/", app=_handle)], lifespan=lifespan)
    app.state.timeout = timeout.as_dict()  # per request: requests made without client.build_request
    set_shards(app, shards)
    return app


def set_shards(app: Starlette, shards: dict[str, str]) -> None:
    """Replace the whole table (a shard restarted elsewhere); requests in flight keep theirs."""
    if not shards:
        raise ValueError("the control app needs at least one shard")
    urls = {sid: httpx.URL(url.rstrip("/")) for sid, url in shards.items()}
    app.state.shards = _Table(urls, tuple(sorted(urls)))


async def _handle(scope, receive, send) -> None:
    request = Request(scope, receive)
    response = await _answer(request)
    await response(scope, receive, send)


async def _answer(request: Request) -> Response:
    try:
        namespace = parse_namespace(request.headers.get(NAMESPACE_HEADER))
    except NamespaceError as e:
        return response_of(error(400, str(e), ["header", NAMESPACE_HEADER]))
    method, path = request.method, request.url.path
    if method == "GET" and path == "/v2/health/live":
        return JSONResponse({"live": True})
    state = request.app.state
    fanout = _Fanout(state.client, state.shards, state.timeout)
    call = await call_of(request)
    if method == "GET" and path == "/v2/health/ready":
        return await fanout.ready(call)
    if method == "GET" and path == "/metrics":
        return await fanout.metrics(call)
    home = shard_for(namespace, fanout.table.ids)
    if is_broadcast(method, path):
        return await fanout.broadcast(call, home)
    return response_of(await fanout.send(home, call), home)


@dataclass(frozen=True)
class _Fanout:
    client: httpx.AsyncClient
    table: _Table
    timeout: dict

    async def send(self, shard: str, call: Call) -> Answer:
        """The shard's answer, its body as sent (not decoded); 503 when it cannot be reached."""
        method, raw_path, query, headers, body = call
        base = self.table.urls[shard]
        path = raw_path.split(b"?", 1)[0]  # (httpx's ASGI transport puts the query in raw_path too)
        url = base.copy_with(raw_path=base.raw_path.rstrip(b"/") + path + (b"?" + query if query else b""))
        kept = [(k, v) for k, v in headers if k.lower() not in _NOT_FORWARDED]
        request = httpx.Request(method, url, headers=kept, content=body, extensions={"timeout": self.timeout})
        try:
            response = await self.client.send(request, stream=True)
            try:
                data = b"".join([chunk async for chunk in response.aiter_raw()])
            finally:
                await response.aclose()
        except httpx.TransportError as e:
            return error(503, f"shard {shard} is unavailable ({type(e).__name__}: {e}); send the request again",
                         ["shards", shard], {"Retry-After": "1"})
        returned = [(k, v) for k, v in response.headers.raw if k.lower() not in _NOT_RETURNED]
        if response.status_code not in (204, 304) and header(returned, b"content-length") is None:
            returned.append((b"content-length", str(len(data)).encode()))  # it was chunked
        return response.status_code, returned, data

    async def all(self, call: Call) -> dict[str, Answer]:
        ids = self.table.ids
        return dict(zip(ids, await asyncio.gather(*(self.send(s, call) for s in ids))))

    async def broadcast(self, call: Call, home: str) -> Response:
        answer, shard = broadcast_answer(await self.all(call), home)
        return response_of(answer, shard)

    async def ready(self, call: Call) -> Response:
        return response_of(ready_answer(await self.all(call)))

    async def metrics(self, call: Call) -> Response:
        method, raw_path, query, headers, body = call
        plain = [(k, v) for k, v in headers if k.lower() != b"accept-encoding"]  # texts to merge, not gzip
        return response_of(metrics_answer(await self.all((method, raw_path, query, plain, body))))


def broadcast_answer(answers: dict[str, Answer], home: str) -> tuple[Answer, str | None]:
    """A broadcast's answer from every shard's, and the shard it speaks for (None: for all)."""
    outcome = broadcast_outcome({s: a[0] for s, a in answers.items()})
    if outcome is not None:
        return error(*outcome, ["shards"], {"Retry-After": "1"} if outcome[0] == 503 else None), None
    return answers[home], home


def ready_answer(answers: dict[str, Answer]) -> Answer:
    not_ready = [s for s, a in answers.items() if a[0] != 200]
    if not_ready:
        return error(503, f"not ready: shards {', '.join(not_ready)}", ["shards"])
    body = b'{"ready":true}'
    return 200, [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())], body


def metrics_answer(answers: dict[str, Answer]) -> Answer:
    """Every shard's exposition in one (each labels its own samples), or the first refusal."""
    refused = next((a for a in answers.values() if a[0] != 200), None)
    if refused is not None:
        return refused
    first = next(iter(answers.values()))
    return with_body(first, metrics.merge([({}, a[2]) for a in answers.values()]))
