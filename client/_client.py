"""`Client` and `AsyncClient`: the same methods, one sending with httpx.Client, one awaiting
httpx.AsyncClient (and sleeping between retries). Everything else (URLs, bodies, decoding,
errors) lives in `_builder`, the retry policy in `_retry`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
import numpy as np

from ._builder import Call, _Calls, _RequestBuilder
from ._regions import RegionCalls
from ._retry import RetryPolicy, retrying
from ._sharded import AsyncShardedTransport, ShardedTransport, ShardMap
from ._types import FusionRef, Region, RunResult
from .sharding import parse_namespace

DEFAULT_TIMEOUT = httpx.Timeout(60.0, connect=5.0)  # a first GPU run may compile for seconds
DEFAULT_URL = "127.0.0.1:8000"


class _BaseClient:
    def __init__(self, url: str | None, token: str | None, timeout, retries: int, backoff: float,
                 max_backoff: float, namespace: str | None, shards: Sequence[str] | None):
        if namespace is not None:
            parse_namespace(namespace)  # a bad one fails here, naming the rule, not at the server
        self.namespace = namespace
        self._shards = None
        if shards is not None:
            if url is not None:
                raise ValueError("give url (a server or the scale-out router) or shards (direct sharded mode), "
                                 "not both")
            self._shards = ShardMap(shards, namespace)
            url = self._shards.home_url
        self._build = _RequestBuilder(DEFAULT_URL if url is None else url, token, namespace)
        self._calls = _Calls(self._build)
        self._regions = RegionCalls(self._build)
        self.timeout = timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)
        self.retry = RetryPolicy(retries, backoff, max_backoff)

    @property
    def url(self) -> str:
        """The server's URL; in direct sharded mode, the URL of the namespace's shard."""
        return self._build.base_url

    @property
    def shards(self) -> list[str] | None:
        """The shard URLs of direct sharded mode, in shard order; None for a plain client."""
        return None if self._shards is None else list(self._shards.urls)

    @property
    def shard(self) -> str | None:
        """The id of the namespace's shard in direct sharded mode ("shard-<i>"); None for a plain client."""
        return None if self._shards is None else self._shards.ids[self._shards.home]

    def __repr__(self) -> str:
        if self._shards is not None:
            return f"{type(self).__name__}(shards={self._shards.urls!r}, namespace={self.namespace!r})"
        return f"{type(self).__name__}({self.url!r})"


class Client(_BaseClient):
    """A synchronous client of a segfuse server.

        with Client("localhost:8000") as c:
            c.put("ids_0", ids)
            res = c.run("moe_problem_sizes", inputs={"topk_ids": Buffer("ids_0")}, outputs=["counts"])
            res["counts"]

    `url` is "host:port" or a full URL (default 127.0.0.1:8000); `token` is the server's bearer
    token, if it has one. Every failure raises `ClientError`.

    `namespace` is sent as the Segfuse-Namespace header (`segfuse serve-ray` keeps each namespace's
    buffers on one shard). `shards=[url0, url1, ...]` instead of `url` is direct sharded mode: the
    client sends its requests to the namespace's shard itself (the i-th URL is shard-i, chosen by
    the router's own hash), fusion registrations to every shard; see `segfuse.client._sharded`.

    A request refused with 429 (run queue full) or 503 (not ready) is sent again up to `retries`
    times, after the server's Retry-After or `backoff` * 2**n seconds (at most `max_backoff`);
    so are connection failures, and GET/PUT/DELETE requests whose connection broke (a POST that
    reached the server is not repeated: it may have run). `retries=0` sends every request once.
    """

    def __init__(self, url: str | None = None, token: str | None = None,
                 timeout: float | httpx.Timeout = DEFAULT_TIMEOUT, *, retries: int = 3, backoff: float = 0.25,
                 max_backoff: float = 10.0, transport: httpx.BaseTransport | None = None,
                 namespace: str | None = None, shards: Sequence[str] | None = None):
        super().__init__(url, token, timeout, retries, backoff, max_backoff, namespace, shards)
        if transport is None:  # httpx retries failed connects itself; given a transport, it is the caller's
            transport = httpx.HTTPTransport(retries=retries)
        if self._shards is not None:
            transport = ShardedTransport(transport, self._shards)
        self._http = httpx.Client(timeout=self.timeout, transport=transport)

    def _send(self, call: Call):
        """Drive one call (`_retry.retrying`): send each request it yields, sleep each delay."""
        flow = retrying(call, self.retry)
        try:
            step = next(flow)
            while True:
                if not isinstance(step, httpx.Request):
                    time.sleep(step)
                    step = flow.send(None)
                    continue
                try:
                    response = self._http.send(step)
                except httpx.TransportError as e:
                    step = flow.throw(e)
                else:
                    step = flow.send(response)
        except StopIteration as done:
            return done.value

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # health and metadata
    def is_live(self) -> bool:
        return self._send(self._calls.is_live())

    def is_ready(self) -> bool:
        return self._send(self._calls.is_ready())

    def metadata(self) -> dict:
        return self._send(self._calls.metadata())

    # buffers
    def put(self, name: str, array) -> dict:
        """Store `array` (NumPy, or a CuPy/torch array copied to the host) as buffer `name`."""
        return self._send(self._calls.put(name, array))

    def get(self, name: str) -> np.ndarray:
        return self._send(self._calls.get(name))

    def delete(self, name: str) -> None:
        return self._send(self._calls.delete(name))

    def buffers(self) -> list[dict]:
        return self._send(self._calls.buffers())

    # fusions
    def register(self, fusion, replace: bool = False) -> FusionRef:
        """Register a FusionDefinition, a graph dict or a path to a graph JSON file."""
        return self._send(self._calls.register(fusion, replace))

    def fusions(self) -> list[dict]:
        return self._send(self._calls.fusions())

    def fusion(self, ref: FusionRef | str) -> dict:
        return self._send(self._calls.fusion(ref))

    def unregister(self, ref: FusionRef | str) -> None:
        return self._send(self._calls.unregister(ref))

    def plan(self, fusion, shapes: Mapping[str, int] | str) -> dict:
        """The segment plan for sizes such as {"T": 4096, "K": 8} (registers the graph if needed)."""
        return self._send(self._calls.plan(fusion, shapes))

    def run(self, fusion, inputs: Mapping[str, Any] | None = None, outputs=None) -> RunResult:
        """Run a fusion: a FusionRef, a registered name or id, or a graph (sent inline).

        An input is an array (sent in the binary extension), `Buffer("name")` or a tensor in a
        shared-memory `Region`. `outputs` is a list of names to return, or a dict of name ->
        `Buffer("name")` to store or `Region` to write into instead (None returns that one);
        omitted, every output is returned.
        """
        return self._send(self._calls.run(fusion, inputs, outputs))

    # shared-memory regions (Triton's extensions)
    def register_system_shared_memory(self, name: str, key, byte_size: int | None = None, offset: int = 0) -> Region:
        """Register [offset, offset + byte_size) of the POSIX shared-memory object `key` (or a
        `SystemRegion`, whose size is then the default byte_size) as region `name`; returns
        `Region(name, byte_size=byte_size)`."""
        return self._send(self._regions.register_system(name, key, byte_size, offset))

    def register_cuda_shared_memory(self, name: str, tensor_or_raw_handle, device_id: int | None = None,
                                    byte_size: int | None = None) -> Region:
        """Register a CuPy array or torch CUDA tensor (or a raw cudaIpcMemHandle_t with `byte_size`)
        as CUDA region `name`; returns the Region addressing the tensor (offset, dtype, shape). Keep
        the tensor alive while it is registered."""
        return self._send(self._regions.register_cuda(name, tensor_or_raw_handle, device_id, byte_size))

    def get_system_shared_memory_status(self, name: str | None = None) -> list[dict]:
        return self._send(self._regions.status("system", name))

    def get_cuda_shared_memory_status(self, name: str | None = None) -> list[dict]:
        return self._send(self._regions.status("cuda", name))

    def unregister_system_shared_memory(self, name: str | None = None) -> list[str]:
        """Unregister one region, or without a name every idle one; returns the names unregistered."""
        return self._send(self._regions.unregister("system", name))

    def unregister_cuda_shared_memory(self, name: str | None = None) -> list[str]:
        return self._send(self._regions.unregister("cuda", name))

    def regions(self) -> list[dict]:
        """Every region, system and CUDA, each with its "kind"."""
        return self._send(self._regions.regions())


class AsyncClient(_BaseClient):
    """The asynchronous twin of `Client`: the same methods, as coroutines.

        async with AsyncClient("localhost:8000") as c:
            res = await c.run(graph, inputs={"topk_ids": ids})
    """

    def __init__(self, url: str | None = None, token: str | None = None,
                 timeout: float | httpx.Timeout = DEFAULT_TIMEOUT, *, retries: int = 3, backoff: float = 0.25,
                 max_backoff: float = 10.0, transport: httpx.AsyncBaseTransport | None = None,
                 namespace: str | None = None, shards: Sequence[str] | None = None):
        super().__init__(url, token, timeout, retries, backoff, max_backoff, namespace, shards)
        if transport is None:
            transport = httpx.AsyncHTTPTransport(retries=retries)
        if self._shards is not None:
            transport = AsyncShardedTransport(transport, self._shards)
        self._http = httpx.AsyncClient(timeout=self.timeout, transport=transport)

    async def _send(self, call: Call):
        flow = retrying(call, self.retry)
        try:
            step = next(flow)
            while True:
                if not isinstance(step, httpx.Request):
                    await asyncio.sleep(step)
                    step = flow.send(None)
                    continue
                try:
                    response = await self._http.send(step)
                except httpx.TransportError as e:
                    step = flow.throw(e)
                else:
                    step = flow.send(response)
        except StopIteration as done:
            return done.value

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def is_live(self) -> bool:
        return await self._send(self._calls.is_live())

    async def is_ready(self) -> bool:
        return await self._send(self._calls.is_ready())

    async def metadata(self) -> dict:
        return await self._send(self._calls.metadata())

    async def put(self, name: str, array) -> dict:
        return await self._send(self._calls.put(name, array))

    async def get(self, name: str) -> np.ndarray:
        return await self._send(self._calls.get(name))

    async def delete(self, name: str) -> None:
        return await self._send(self._calls.delete(name))

    async def buffers(self) -> list[dict]:
        return await self._send(self._calls.buffers())

    async def register(self, fusion, replace: bool = False) -> FusionRef:
        return await self._send(self._calls.register(fusion, replace))

    async def fusions(self) -> list[dict]:
        return await self._send(self._calls.fusions())

    async def fusion(self, ref: FusionRef | str) -> dict:
        return await self._send(self._calls.fusion(ref))

    async def unregister(self, ref: FusionRef | str) -> None:
        return await self._send(self._calls.unregister(ref))

    async def plan(self, fusion, shapes: Mapping[str, int] | str) -> dict:
        return await self._send(self._calls.plan(fusion, shapes))

    async def run(self, fusion, inputs: Mapping[str, Any] | None = None, outputs=None) -> RunResult:
        return await self._send(self._calls.run(fusion, inputs, outputs))

    async def register_system_shared_memory(self, name: str, key, byte_size: int | None = None, offset: int = 0) -> Region:
        return await self._send(self._regions.register_system(name, key, byte_size, offset))

    async def register_cuda_shared_memory(self, name: str, tensor_or_raw_handle, device_id: int | None = None,
                                          byte_size: int | None = None) -> Region:
        return await self._send(self._regions.register_cuda(name, tensor_or_raw_handle, device_id, byte_size))

    async def get_system_shared_memory_status(self, name: str | None = None) -> list[dict]:
        return await self._send(self._regions.status("system", name))

    async def get_cuda_shared_memory_status(self, name: str | None = None) -> list[dict]:
        return await self._send(self._regions.status("cuda", name))

    async def unregister_system_shared_memory(self, name: str | None = None) -> list[str]:
        return await self._send(self._regions.unregister("system", name))

    async def unregister_cuda_shared_memory(self, name: str | None = None) -> list[str]:
        return await self._send(self._regions.unregister("cuda", name))

    async def regions(self) -> list[dict]:
        return await self._send(self._regions.regions())
