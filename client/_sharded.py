"""The SDK's direct sharded mode: `Client(shards=[url0, url1, ...], namespace=...)` talks to the shard
of its namespace itself, picking it as the router would.

The i-th URL is the shard `shard-i` (list them in the cluster's order; with `segfuse serve-ray` they
are `http://HOST:PORT/shards/shard-<i>`). The namespace's shard is chosen by the router's own
rendezvous hash (segfuse.client.sharding), so both reach the same shard and the same buffers. Every
request goes to that shard, but the ones every shard must see (fusion registration and removal, the
repository's load/unload), which go to all of them, as the router's control endpoint sends them: the answer is the
namespace's shard's when every shard succeeded (or all failed alike), else a 503 (some shard could not
be reached: send it again) or 502 listing each status (`sharding.broadcast_outcome`).

This is a wrapper around the client's httpx transport, so the calls, the retry policy and the
decoding stay the ones of a plain client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import httpx

from ._builder import normalize_url
from .sharding import DEFAULT_NAMESPACE, broadcast_outcome, is_broadcast, shard_for, shard_ids


class ShardMap:
    """Shard URLs, their ids, the namespace's own shard, and how to copy a request to every shard."""

    def __init__(self, urls: Sequence[str], namespace: str | None):
        if isinstance(urls, (str, bytes)) or not isinstance(urls, Sequence):
            raise TypeError("shards is a list of shard URLs (the i-th is shard-i), not "
                            f"{type(urls).__name__}")
        self.urls = [normalize_url(u) for u in urls]
        if not self.urls:
            raise ValueError("shards is an empty list: give the URL of every shard, shard-0 first")
        if len(set(self.urls)) != len(self.urls):
            raise ValueError(f"shards lists a URL twice: {self.urls}")
        self.ids = shard_ids(len(self.urls))
        self.home = self.ids.index(shard_for(namespace or DEFAULT_NAMESPACE, self.ids))
        self._prefixes = [httpx.URL(u).raw_path.rstrip(b"/") for u in self.urls]

    @property
    def home_url(self) -> str:
        return self.urls[self.home]

    def copies(self, request: httpx.Request) -> list[httpx.Request] | None:
        """The request once per shard (in shard order) when every shard must see it; else None.
        `request` was built against the home shard's URL."""
        prefix = self._prefixes[self.home]
        raw = request.url.raw_path
        if not raw.startswith(prefix):
            return None
        rest = raw[len(prefix):]
        if not is_broadcast(request.method, rest.split(b"?", 1)[0].decode("latin-1")):
            return None
        headers = [(k, v) for k, v in request.headers.raw if k.lower() != b"host"]
        return [request if i == self.home else
                httpx.Request(request.method, httpx.URL(url).copy_with(raw_path=self._prefixes[i] + rest),
                              headers=headers, content=request.content, extensions=request.extensions)
                for i, url in enumerate(self.urls)]

    def combine(self, request: httpx.Request, responses: list[httpx.Response], bodies: list[bytes]) -> httpx.Response:
        outcome = broadcast_outcome({s: r.status_code for s, r in zip(self.ids, responses)})
        if outcome is not None:
            status, message = outcome
            return httpx.Response(status, json={"error": message, "details": [{"loc": ["shards"], "msg": message}]},
                                  request=request)
        home = responses[self.home]
        return httpx.Response(home.status_code, headers=home.headers, content=bodies[self.home], request=request)


class ShardedTransport(httpx.BaseTransport):
    """`inner` (the client's transport) sends; broadcast requests go to every shard, one after another."""

    def __init__(self, inner: httpx.BaseTransport, shards: ShardMap):
        self.inner, self.shards = inner, shards

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        copies = self.shards.copies(request)
        if copies is None:
            return self.inner.handle_request(request)
        responses, bodies = [], []
        for copy in copies:
            response = self.inner.handle_request(copy)
            try:
                # The raw stream: the client decodes a Content-Encoding itself.
                bodies.append(b"".join(response.stream))
            finally:
                response.close()
            responses.append(response)
        return self.shards.combine(request, responses, bodies)

    def close(self) -> None:
        self.inner.close()


class AsyncShardedTransport(httpx.AsyncBaseTransport):
    """The async twin: broadcast requests go to every shard at once."""

    def __init__(self, inner: httpx.AsyncBaseTransport, shards: ShardMap):
        self.inner, self.shards = inner, shards

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        copies = self.shards.copies(request)
        if copies is None:
            return await self.inner.handle_async_request(request)

        async def send(copy):
            response = await self.inner.handle_async_request(copy)
            try:
                return response, b"".join([chunk async for chunk in response.stream])
            finally:
                await response.aclose()

        answers = await asyncio.gather(*(send(c) for c in copies))
        return self.shards.combine(request, [a[0] for a in answers], [a[1] for a in answers])

    async def aclose(self) -> None:
        await self.inner.aclose()
