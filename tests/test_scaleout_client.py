"""The SDK's direct sharded mode without Ray (`Client(shards=[...])`, `AsyncClient` the same): it picks
the shard the router's hash picks (oracle: XXH32 written out here), sends every request to that
shard but registrations and removals, which reach every shard (502 when they disagree), and
round-trips put/run/get against two real `segfuse serve` processes (oracle: np.bincount, and each
server's own view of what it holds). The same against real Ray shards: tests/test_scaleout_ray.py."""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest
import xxhash
from helpers.graphs import MOE_PROBLEM_SIZES
from helpers.servers import LiveServer
from segfuse.client import AsyncClient, Buffer, Client, ClientError
from segfuse.scaleout.routing import shard_for

URLS = ["http://s0.test:1", "http://s1.test:2/base", "http://s2.test:3/x/y"]


def oracle(namespace: str, n: int) -> int:
    """The index of the shard the documented hash picks: the highest XXH32 of the namespace, seeded with
    XXH32 of 'shard-i'."""
    def w(i):
        return xxhash.xxh32(namespace.encode(), seed=xxhash.xxh32(f"shard-{i}".encode()).intdigest()).intdigest()

    return max(range(n), key=w)


def test_direct_mode_picks_the_shard_the_router_picks():
    namespaces = [f"tenant-{i}" for i in range(50)] + ["default", "a", "team.b_c-d"]
    chosen = set()
    for n in (1, 2, 3):
        for ns in namespaces:
            with Client(shards=URLS[:n], namespace=ns, transport=httpx.MockTransport(lambda r: None)) as c:
                want = oracle(ns, n)
                assert c.shard == f"shard-{want}" == shard_for(ns, [f"shard-{i}" for i in range(n)])
                assert c.url == URLS[want]
                chosen.add((n, c.shard))
    assert chosen == {(1, "shard-0"), (2, "shard-0"), (2, "shard-1"), (3, "shard-0"), (3, "shard-1"), (3, "shard-2")}
    with Client(shards=URLS) as c:
        assert c.shard == f"shard-{oracle('default', 3)}"  # no namespace: the default one


def _recording(statuses: dict[str, int] | None = None):
    """A MockTransport answering every request with {"host": ...}, and the (method, URL) it saw."""
    seen = []

    def handler(request):
        seen.append((request.method, str(request.url), request.headers.get("Segfuse-Namespace"),
                     request.headers.get("host")))
        status = (statuses or {}).get(request.url.host, 200 if request.method != "POST" else 201)
        return httpx.Response(status, json={"id": "f1", "name": "moe", "host": request.url.host, "buffers": []})

    return httpx.MockTransport(handler), seen


def test_registrations_reach_every_shard_and_the_rest_only_the_namespaces():
    transport, seen = _recording()
    ns = next(f"t{i}" for i in range(100) if oracle(f"t{i}", 3) == 1)  # a namespace of shard-1
    with Client(shards=URLS, namespace=ns, transport=transport) as c:
        ref = c.register(MOE_PROBLEM_SIZES)
        assert ref.info["host"] == "s1.test"  # the namespace's shard's answer
        assert [(m, u) for m, u, *_ in seen] == [("POST", "http://s0.test:1/v2/fusions"),
                                                 ("POST", "http://s1.test:2/base/v2/fusions"),
                                                 ("POST", "http://s2.test:3/x/y/v2/fusions")]
        assert all(n == ns and h == u.split("/")[2] for _, u, n, h in seen)  # each copy names its own host
        seen.clear()
        c.buffers()
        c.unregister("moe")
        assert [(m, u) for m, u, *_ in seen] == [("GET", "http://s1.test:2/base/v2/buffers"),
                                                 ("DELETE", "http://s0.test:1/v2/fusions/moe"),
                                                 ("DELETE", "http://s1.test:2/base/v2/fusions/moe"),
                                                 ("DELETE", "http://s2.test:3/x/y/v2/fusions/moe")]


def test_shards_that_disagree_give_502_listing_them():
    transport, _ = _recording({"s2.test": 409})
    with Client(shards=URLS, transport=transport, retries=0) as c:
        with pytest.raises(ClientError, match="shards disagree") as e:
            c.register(MOE_PROBLEM_SIZES)
    assert e.value.status == 502
    assert "shard-0: 201, shard-1: 201, shard-2: 409" in e.value.message


def test_a_shard_out_of_reach_gives_503_and_success_codes_agree():
    transport, _ = _recording({"s1.test": 503})
    with Client(shards=URLS, transport=transport, retries=0) as c:
        with pytest.raises(ClientError, match="not every shard could be reached") as e:
            c.register(MOE_PROBLEM_SIZES)
    assert e.value.status == 503  # the SDK's retry policy sends a 503 again (here retries=0)
    transport, _ = _recording({"s0.test": 200})  # 200 (had it) and 201 (new): both succeeded
    with Client(shards=URLS, transport=transport, namespace=next(f"n{i}" for i in range(99) if oracle(f"n{i}", 3) == 2),
                retries=0) as c:
        assert c.register(MOE_PROBLEM_SIZES).info["host"] == "s2.test"


def test_async_client_broadcasts_too():
    transport, seen = _recording()

    async def main():
        async with AsyncClient(shards=URLS[:2], namespace="x", transport=transport) as c:
            await c.register(MOE_PROBLEM_SIZES)
            await c.buffers()

    asyncio.run(main())
    home = URLS[oracle("x", 2)]
    assert sorted(u for m, u, *_ in seen if m == "POST") == sorted(u + "/v2/fusions" for u in URLS[:2])
    assert [u for m, u, *_ in seen if m == "GET"] == [home + "/v2/buffers"]


@pytest.mark.parametrize("kwargs, message", [
    ({"url": "h:1", "shards": URLS}, "not both"), ({"shards": []}, "empty list"),
    ({"shards": "http://h:1"}, "list of shard URLs"), ({"shards": [URLS[0], URLS[0]]}, "twice"),
    ({"url": "h:1", "namespace": "no spaces"}, "Segfuse-Namespace")])
def test_bad_arguments(kwargs, message):
    for cls in (Client, AsyncClient):
        with pytest.raises((TypeError, ValueError), match=message):
            cls(**kwargs)


def test_a_plain_client_is_unchanged():
    c = Client()
    assert c.url == "http://127.0.0.1:8000" and c.shards is None and c.shard is None
    assert repr(Client(shards=URLS[:1], namespace="a")) == "Client(shards=['http://s0.test:1'], namespace='a')"


@pytest.fixture(scope="module")
def two_servers():
    servers = [LiveServer(backend="numpy").start() for _ in range(2)]
    try:
        yield [s.url for s in servers]
    finally:
        for s in servers:
            s.stop()


def test_direct_mode_round_trips_against_real_servers(two_servers):
    rng = np.random.default_rng(18)
    for ns in ("alpha", "beta", "gamma"):
        home = oracle(ns, 2)
        ids = rng.integers(0, 16, (32, 4))
        with Client(shards=two_servers, namespace=ns) as c:
            ref = c.register(MOE_PROBLEM_SIZES, replace=True)
            c.put(f"ids_{ns}", ids)
            res = c.run("moe_problem_sizes", inputs={"topk_ids": Buffer(f"ids_{ns}")})
            np.testing.assert_array_equal(res["counts"], np.bincount(ids.ravel(), minlength=16))
            np.testing.assert_array_equal(c.get(f"ids_{ns}"), ids)
        for i, url in enumerate(two_servers):  # each server's own view, through a plain client
            with Client(url) as plain:
                assert (f"ids_{ns}" in {b["name"] for b in plain.buffers()}) == (i == home)
                assert plain.fusion(ref.id)["id"] == ref.id  # the registration reached both


def test_async_direct_mode_round_trips(two_servers):
    ids = np.arange(12).reshape(6, 2) % 16

    async def main():
        async with AsyncClient(shards=two_servers, namespace="delta") as c:
            await c.register(MOE_PROBLEM_SIZES, replace=True)
            await c.put("ids", ids)
            res = await c.run("moe_problem_sizes", inputs={"topk_ids": Buffer("ids")})
            return res, await c.get("ids"), c.url

    res, back, url = asyncio.run(main())
    np.testing.assert_array_equal(res["counts"], np.bincount(ids.ravel(), minlength=16))
    np.testing.assert_array_equal(back, ids)
    assert url == two_servers[oracle("delta", 2)]
