"""A shard (scaleout/shard.py) without Ray: each namespace gets its own runtime, so namespaces that
share a shard never see each other's buffers; registrations reach every namespace, those made later
too; a shard holds at most max_namespaces; a replica that replaces another (told by the registry, here
a local one) gets its registrations back and says so in its 404s; /metrics is every namespace's,
labelled. Oracles: the bytes put, np.bincount, prometheus_client's own parser, the runs made."""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("orjson")
from segfuse.scaleout.shard import ShardApp  # noqa: E402

pytestmark = pytest.mark.anyio
GRAPH = {"format": "segfuse.fusion/1", "name": "hist",
         "inputs": [{"name": "ids", "dtype": "int64", "shape": ["N"]}],
         "ops": [{"op": "full", "out": "z", "shape": [8], "value": 0, "dtype": "int64"},
                 {"op": "full_like", "out": "one", "inputs": ["ids"], "value": 1},
                 {"op": "scatter", "out": "counts", "inputs": ["z", "ids", "one"], "dim": 0, "reduce": "add"}],
         "outputs": ["counts"]}


@pytest.fixture
async def make_shard():
    made = []

    async def make(shard_id="shard-0", settings=None, **kw):
        shard = ShardApp(shard_id, settings or {"backend": "numpy"}, **kw)
        await shard.start()
        made.append(shard)
        return shard

    yield make
    for shard in made:
        await shard.stop()


async def call(shard, method, path, namespace=None, body=b"", content_type="application/json", query=b""):
    headers = [(b"content-type", content_type.encode()), (b"accept", b"application/json")]
    if namespace is not None:
        headers.append((b"segfuse-namespace", namespace.encode()))
    status, raw_headers, data = await shard.answer((method, path.encode(), query, headers, body))
    return status, data


async def put(shard, namespace, name, values):
    a = np.asarray(values, np.int64)
    return await call(shard, "PUT", f"/v2/buffers/{name}", namespace, a.tobytes(), "application/octet-stream",
                      f"dtype=int64&shape={a.size}".encode())


async def get(shard, namespace, name):
    status, data = await call(shard, "GET", f"/v2/buffers/{name}", namespace,
                              content_type="application/json")
    return status, (json.loads(data) if status == 200 else data)


async def test_namespaces_on_one_shard_do_not_share_buffers(make_shard):
    shard = await make_shard()
    assert (await put(shard, "team-a", "x", [1, 2, 3]))[0] == 201
    assert (await get(shard, "team-b", "x"))[0] == 404  # b has no x, though a does, on this shard
    assert (await put(shard, "team-b", "x", [7]))[0] == 201  # b's own x, not an overwrite of a's
    status, doc = await get(shard, "team-a", "x")
    assert status == 200 and doc["data"] == [1, 2, 3]
    assert (await get(shard, "team-b", "x"))[1]["data"] == [7]
    assert (await get(shard, None, "x"))[0] == 404  # the default namespace is a namespace too
    assert sorted(shard.identity()["namespaces"]) == ["default", "team-a", "team-b"]


async def test_registrations_reach_every_namespace_also_later_ones(make_shard):
    shard = await make_shard()
    await put(shard, "early", "ids", [0, 1, 1])  # a runtime that exists before the registration
    status, _ = await call(shard, "POST", "/v2/fusions", "early", json.dumps(GRAPH).encode())
    assert status == 201
    for ns, ids in (("early", [0, 1, 1]), ("late", [3, 3, 3, 7])):  # "late" is made after it
        if ns == "late":
            await put(shard, ns, "ids", ids)
        body = json.dumps({"inputs": [{"name": "ids", "parameters": {"buffer": "ids"}}]}).encode()
        status, data = await call(shard, "POST", "/v2/models/hist/infer", ns, body)
        assert status == 200, data
        assert json.loads(data)["outputs"][0]["data"] == np.bincount(ids, minlength=8).tolist()
    status, _ = await call(shard, "DELETE", "/v2/fusions/hist", "late")
    assert status == 200
    for ns in ("early", "late", "default"):
        assert (await call(shard, "GET", "/v2/models/hist", ns))[0] == 404


async def test_a_fusion_repository_is_kept_once_and_reaches_every_namespace_after_a_restart(make_shard, tmp_path):
    """--fusion-dir on a shard: one file per fusion however many namespaces registered it, and a shard
    started on the directory gives its fusions to every namespace, those made later too."""
    first = await make_shard(settings={"backend": "numpy", "fusion_dir": str(tmp_path)})
    await put(first, "a", "ids", [1])  # two runtimes before the registration
    assert (await call(first, "POST", "/v2/fusions", "a", json.dumps(GRAPH).encode()))[0] == 201
    assert len(list(tmp_path.glob("*.json"))) == 1
    await first.stop()
    again = await make_shard(settings={"backend": "numpy", "fusion_dir": str(tmp_path)})
    for ns, ids in (("default", [2, 2]), ("b", [5, 0, 5])):
        await put(again, ns, "ids", ids)
        body = json.dumps({"inputs": [{"name": "ids", "parameters": {"buffer": "ids"}}]}).encode()
        status, data = await call(again, "POST", "/v2/models/hist/infer", ns, body)
        assert status == 200, data
        assert json.loads(data)["outputs"][0]["data"] == np.bincount(ids, minlength=8).tolist()
    assert len(list(tmp_path.glob("*.json"))) == 1


async def test_a_shard_holds_at_most_max_namespaces(make_shard):
    shard = await make_shard(max_namespaces=2)  # the default namespace and one more
    assert (await put(shard, "one", "x", [1]))[0] == 201
    status, data = await put(shard, "two", "x", [2])
    assert status == 429 and b"holds 2 namespaces" in data
    assert (await get(shard, "one", "x"))[1]["data"] == [1]  # the ones it holds still work
    status, data = await call(shard, "GET", "/v2/buffers", "bad namespace!")
    assert status == 400 and b"Segfuse-Namespace" in data


async def test_concurrent_first_requests_of_a_namespace_make_one_runtime(make_shard):
    """Two PUTs of a new namespace at once: both buffers end up in the one runtime it gets."""
    import asyncio

    shard = await make_shard()
    a, b = await asyncio.gather(put(shard, "new", "x", [1]), put(shard, "new", "y", [2]))
    assert a[0] == b[0] == 201
    assert (await get(shard, "new", "x"))[1]["data"] == [1]
    assert (await get(shard, "new", "y"))[1]["data"] == [2]
    assert shard.identity()["namespaces"] == ["default", "new"]


async def run_hist(shard, namespace, ids):
    await put(shard, namespace, "ids", ids)
    body = json.dumps({"inputs": [{"name": "ids", "parameters": {"buffer": "ids"}}]}).encode()
    return await call(shard, "POST", "/v2/models/hist/infer", namespace, body)


async def test_a_replacement_gets_the_registrations_back_and_says_it_restarted(make_shard):
    from segfuse.scaleout.registry import Registry

    registry = Registry()
    first = await make_shard(registry_handle=registry)
    other = await make_shard("shard-1", registry_handle=registry)
    assert (await call(first, "POST", "/v2/fusions", "a", json.dumps(GRAPH).encode()))[0] == 201
    assert (await call(first, "POST", "/v2/fusions", "b", json.dumps(GRAPH).encode()))[0] == 200  # the same again
    await put(first, "a", "x", [1])
    assert first.replaced is None and (await get(first, "a", "nope"))[1].find(b"restarted") < 0
    second = await make_shard(registry_handle=registry)  # shard-0 restarted
    assert second.replaced == first.incarnation and other.replaced is None
    status, data = await get(second, "a", "x")  # the buffer is gone, and the 404 says why
    assert status == 404 and b"shard shard-0 restarted at " + second.incarnation.split("/")[0].encode() in data
    status, data = await run_hist(second, "a", [2, 2, 5])  # the fusion is back, in a new namespace too
    assert status == 200, data
    assert json.loads(data)["outputs"][0]["data"] == np.bincount([2, 2, 5], minlength=8).tolist()
    assert (await run_hist(other, "a", [1]))[0] == 404  # shard-1 never had it: nothing replayed there
    assert b"restarted" not in (await get(other, "a", "x"))[1]
    assert len(registry.start("shard-0", "later")[1]) == 1  # registering the same graph twice kept it once


async def test_metrics_are_every_namespaces_labelled(make_shard):
    from prometheus_client.parser import text_string_to_metric_families

    shard = await make_shard()
    await call(shard, "POST", "/v2/fusions", None, json.dumps(GRAPH).encode())
    runs = {"a": 3, "b": 1}
    for ns, n in runs.items():
        for _ in range(n):
            assert (await run_hist(shard, ns, [0, 1]))[0] == 200
    status, data = await call(shard, "GET", "/metrics", "a")
    assert status == 200
    text = data.decode()
    families = list(text_string_to_metric_families(text))
    names = [f.name for f in families]
    assert len(names) == len(set(names))  # each family once, its samples together
    ok = {s.labels["namespace"]: s.value for f in families for s in f.samples
          if s.name == "segfuse_runs_total" and s.labels.get("outcome") == "ok"}
    assert ok == {"default": 0, **runs}
    assert all(s.labels["shard"] == "shard-0" for f in families for s in f.samples)
    assert text.count("# TYPE segfuse_runs_total ") == 1
