"""The ingress: reads a request's namespace, forwards the request unchanged to the shard that holds the
namespace, and answers with the shard's response unchanged (status, headers, body), adding one header,
`Segfuse-Shard`, naming the shard.

Design: N single-replica deployments `shard-0..N-1` and an ingress holding one handle per shard, rather
than one N-replica deployment with a custom `ray.serve.request_router.RequestRouter`. A RequestRouter
chooses among *interchangeable* replicas, and its replica ids change when Ray replaces a replica; here a
namespace must reach one particular shard by a name that survives restarts (so a restarted shard gets
its namespaces back, and a namespace never silently moves to a shard without its data). Named
deployments give that stable id, Ray Serve still places them (`num_gpus=1` each), restarts them and
queues requests for a shard while it restarts; the ingress needs no Ray internals.

The shard set hashed over is the configured one: a dead shard is restarted by Ray rather than having
its namespaces move (moving them would give a namespace an empty shard and, once the old one came
back, move them again). Requests that are not one namespace's:
- GET /v2/health/live: the ingress answers (it is up).
- GET /v2/health/ready: 200 when every shard answers ready, else 503 naming the shards that do not.
- fusion registration and removal (POST /v2/fusions, DELETE /v2/fusions/{key}, the model repository's
  load/unload): sent to every shard, so any namespace can run the fusion; the answer is the
  namespace's shard's when every shard agrees (same status), else 502 listing each shard's status.
  The ingress keeps the registrations that succeeded and replays them on a shard Ray restarted.
- everything else (buffers, runs, plans, regions, metadata, /metrics): the namespace's shard.
"""

from __future__ import annotations

import asyncio
import re

import orjson
from segfuse.server.errors import error_response
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .routing import NAMESPACE_HEADER, NamespaceError, parse_namespace, shard_for

SHARD_HEADER = "Segfuse-Shard"
_BROADCAST = [("POST", re.compile(r"/v2/fusions/?")), ("DELETE", re.compile(r"/v2/fusions/[^/]+")),
              ("POST", re.compile(r"/v2/repository/models/[^/]+/(load|unload)"))]
_HEADER_KEY = NAMESPACE_HEADER.lower().encode()


def _error(status: int, message: str, loc: list, headers: dict | None = None) -> JSONResponse:
    return error_response(status, message, [{"loc": loc, "msg": message}], headers)


def is_broadcast(method: str, path: str) -> bool:
    return any(method == m and p.fullmatch(path) for m, p in _BROADCAST)


class Ingress:
    """The deployment's class (serve_ray.py wraps it with `serve.deployment`)."""

    def __init__(self, shards: dict):
        self.shards = shards  # shard id -> DeploymentHandle
        self.ids = sorted(shards)
        self.seen: dict[str, str] = {}  # shard id -> the incarnation last answered
        self.restarted: dict[str, str] = {}  # shard id -> the incarnation that replaced an earlier one
        self.registrations: list[tuple] = []  # broadcast requests that succeeded, in order, to replay

    async def __call__(self, request: Request) -> Response:
        try:
            namespace = parse_namespace(request.headers.get(NAMESPACE_HEADER))
        except NamespaceError as e:
            return _error(400, str(e), ["header", NAMESPACE_HEADER])
        method, path = request.method, request.url.path
        if method == "GET" and path == "/v2/health/live":
            return JSONResponse({"live": True})
        body = await request.body()
        # Forwarded as received; Ray's proxy has already read the HTTP framing.
        call = (method, request.scope.get("raw_path") or path.encode(), request.scope.get("query_string", b""),
                list(request.headers.raw), body)
        if method == "GET" and path == "/v2/health/ready":
            return await self._ready(call)
        if is_broadcast(method, path):
            return await self._broadcast(call, shard_for(namespace, self.ids))
        return await self._one(call, shard_for(namespace, self.ids))

    async def _send(self, shard: str, call: tuple):
        """(status, headers, body) from `shard`, after restoring registrations on a restarted shard."""
        handle = self.shards[shard]
        status, headers, body, incarnation = await handle.forward.remote(*call, self.seen.get(shard))
        if status is None:  # a new incarnation: Ray restarted the shard since this ingress last saw it
            self.restarted[shard] = incarnation
            self.seen[shard] = incarnation
            for registration in self.registrations:
                await handle.forward.remote(*registration, incarnation)
            status, headers, body, incarnation = await handle.forward.remote(*call, incarnation)
        self.seen.setdefault(shard, incarnation)
        return status, headers, body

    def _response(self, shard: str, status: int, headers: list, body: bytes) -> Response:
        if status == 404 and shard in self.restarted:
            status, headers, body = _note_restart(shard, self.restarted[shard], status, headers, body)
        response = Response(body, status_code=status)
        # Ray's proxy adds the request's X-Request-Id itself (the same id the shard echoed).
        kept = [(k, v) for k, v in headers if k.lower() != b"x-request-id"]
        response.raw_headers = [*kept, (SHARD_HEADER.lower().encode(), shard.encode())]
        return response

    async def _one(self, call: tuple, shard: str) -> Response:
        return self._response(shard, *await self._send(shard, call))

    async def _broadcast(self, call: tuple, home: str) -> Response:
        answers = dict(zip(self.ids, await asyncio.gather(*(self._send(s, call) for s in self.ids))))
        statuses = {s: a[0] for s, a in answers.items()}
        if len(set(statuses.values())) > 1:
            listing = ", ".join(f"{s}: {st}" for s, st in statuses.items())
            return _error(502, f"the shards disagree on this request ({listing}); it may have been applied "
                               "on some of them", ["shards"])
        if statuses[home] < 300:
            self.registrations.append(call)
        return self._response(home, *answers[home])

    async def _ready(self, call: tuple) -> Response:
        answers = await asyncio.gather(*(self._send(s, call) for s in self.ids))
        not_ready = [s for s, a in zip(self.ids, answers) if a[0] != 200]
        if not_ready:
            return _error(503, f"not ready: shards {', '.join(not_ready)}", ["shards"])
        return JSONResponse({"ready": True})


def _note_restart(shard: str, incarnation: str, status: int, headers: list, body: bytes):
    """A 404 from a restarted shard says so: what the namespace held there before is gone."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return status, headers, body
    started = incarnation.split("/")[0]
    doc["error"] = (f"{doc.get('error', 'not found')} (shard {shard} restarted at {started}: its buffers, "
                    "regions and results from before then are lost)")
    body = orjson.dumps(doc)
    headers = [(k, str(len(body)).encode() if k.lower() == b"content-length" else v) for k, v in headers]
    return status, headers, body
