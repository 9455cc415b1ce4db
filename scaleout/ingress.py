"""The ingress: reads a request's namespace, forwards the request unchanged to the shard that holds the
namespace, and answers with the shard's response unchanged (status, headers, body), adding one header,
`Segfuse-Shard`, naming the shard.

Design: each shard is its own Ray Serve application `segfuse-shard-<i>` (one single-replica deployment
`shard`, also reachable over HTTP at `/shards/shard-<i>` for the SDK's direct sharded mode), and the
ingress, application `segfuse` at `/`, holds a handle per shard. Not one N-replica deployment with a
custom `ray.serve.request_router.RequestRouter`: a RequestRouter chooses among *interchangeable*
replicas, and a replica's id changes when Ray replaces it (its rank may be reassigned too); here a
namespace must reach one particular shard by a name that survives restarts (so a restarted shard gets
its namespaces back, and a namespace never silently moves to a shard without its data). Named
applications give that stable id; Ray Serve still places them (`num_gpus=1` each), restarts them and
queues requests for a shard while it restarts; the ingress needs no Ray internals. (It also measured
slower: docs/operations.md, "Scaling out".)

The shard set hashed over is the configured one: a dead shard is restarted by Ray rather than having
its namespaces move (moving them would give a namespace an empty shard and, once the old one came
back, move them again). Requests that are not one namespace's:
- GET /v2/health/live: the ingress answers (it is up).
- GET /v2/health/ready: 200 when every shard answers ready, else 503 naming the shards that do not.
- GET /metrics: every shard's (each already every namespace's), in one exposition labelled by shard
  and namespace (scaleout/metrics.py).
- fusion registration and removal (POST /v2/fusions, DELETE /v2/fusions/{key}, the model repository's
  load/unload): sent to every shard, so any namespace can run the fusion; the answer is the
  namespace's shard's when every shard succeeds (or all fail alike), else 503 when the only failures
  are shards that could not be reached (send it again), 502 listing each shard's status otherwise.
  Each shard keeps what it applied in the registry, which restores it on a replacement replica.
- everything else (buffers, runs, plans, regions, metadata, stats): the namespace's shard.
A shard whose replica died under a request, or is not there, answers 503 with Retry-After: 1 (the SDK
sends the request again); requests sent while Ray starts a new replica wait for it.
"""

from __future__ import annotations

import asyncio

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from .asgi import Call, call_of, error, response_of
from .control import broadcast_answer, metrics_answer, ready_answer
from .routing import (
    NAMESPACE_HEADER,
    NamespaceError,
    is_broadcast,
    parse_namespace,
    shard_for,
)


def _unavailable() -> tuple:
    from ray.exceptions import RayActorError
    from ray.serve.exceptions import DeploymentUnavailableError, ReplicaUnavailableError

    return RayActorError, DeploymentUnavailableError, ReplicaUnavailableError


try:
    _UNAVAILABLE = _unavailable()
except ImportError:  # no Ray (unit tests of the routing): nothing to catch
    _UNAVAILABLE = ()


def _error(status: int, message: str, loc: list) -> Response:
    return response_of(error(status, message, loc))


class Ingress:
    """The deployment's class (serve_ray.py wraps it with `serve.deployment`). `shards`: shard id ->
    DeploymentHandle, or -> the name of the application whose deployment `shard` it is."""

    def __init__(self, shards: dict):
        if any(isinstance(h, str) for h in shards.values()):
            from ray import serve

            shards = {s: serve.get_deployment_handle("shard", app_name=h) if isinstance(h, str) else h
                      for s, h in shards.items()}
        # Requests and answers are plain values (bytes, str, lists of pairs): pickle, not Ray's
        # default cloudpickle (~8% less CPU per request in the shard here, HAProxy mode).
        self.shards = {s: h.options(request_serialization="pickle", response_serialization="pickle")
                       for s, h in shards.items()}
        self.ids = sorted(shards)

    async def __call__(self, request: Request) -> Response:
        try:
            namespace = parse_namespace(request.headers.get(NAMESPACE_HEADER))
        except NamespaceError as e:
            return _error(400, str(e), ["header", NAMESPACE_HEADER])
        method, path = request.method, request.url.path
        if method == "GET" and path == "/v2/health/live":
            return JSONResponse({"live": True})
        call = await call_of(request)
        if method == "GET" and path == "/v2/health/ready":
            return await self._ready(call)
        if method == "GET" and path == "/metrics":
            return await self._metrics(call)
        home = shard_for(namespace, self.ids)
        if is_broadcast(method, path):
            return await self._broadcast(call, home)
        return response_of(await self._send(home, call), home)

    async def _send(self, shard: str, call: Call):
        """The shard's answer; 503 (Retry-After: 1) when its replica died under the request or is not
        there: it may or may not have run, and whatever it did is gone with the replica, so a client
        may send it again (the SDK does, for every method), then to the replica Ray starts."""
        try:
            return await self.shards[shard].forward.remote(*call)
        except _UNAVAILABLE as e:
            return error(503, f"shard {shard} is unavailable (its replica died or is being replaced): "
                              f"{type(e).__name__}; send the request again", ["shards", shard], {"Retry-After": "1"})

    async def _all(self, call: Call) -> dict:
        return dict(zip(self.ids, await asyncio.gather(*(self._send(s, call) for s in self.ids))))

    async def _broadcast(self, call: Call, home: str) -> Response:
        return response_of(*broadcast_answer(await self._all(call), home))

    async def _ready(self, call: Call) -> Response:
        return response_of(ready_answer(await self._all(call)))

    async def _metrics(self, call: Call) -> Response:
        return response_of(metrics_answer(await self._all(call)))
