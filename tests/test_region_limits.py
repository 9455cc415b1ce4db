"""Bounds on shared-memory regions: their number (`max_regions`, per server: there is one token, so
per token is per server) beside their bytes (`max_region_bytes`), the descriptors they hold within
the process's own limit, and keys that name the server's own shared memory refused."""

from __future__ import annotations

import os
import uuid

import httpx
import pytest
from helpers.waiting import scaled
from region_server import serve

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="POSIX shared memory in /dev/shm (Linux)")

SYS = "/v2/systemsharedmemory"


def _body(obj, byte_size: int = 1) -> dict:
    return {"key": "/" + obj.name, "byte_size": byte_size}


@pytest.mark.anyio
async def test_region_count_is_bounded_per_server(asgi_server, shm):
    auth = {"authorization": "Bearer s3cret"}
    async with asgi_server(token="s3cret", max_regions=3, headers=auth) as c:
        objs = [shm(1) for _ in range(4)]
        for i in range(3):
            r = await c.post(f"{SYS}/region/r{i}/register", json=_body(objs[i]))
            assert r.status_code == 200, r.text
        r = await c.post(f"{SYS}/region/r3/register", json=_body(objs[3]))
        assert r.status_code == 413, r.text
        body = r.json()
        assert "limit of 3 shared-memory regions" in body["error"] and "max_regions" in body["error"], body
        assert body["details"][0]["loc"] == ["path", "name"] and "max_regions" in body["details"][0]["msg"], body
        # the refusal registered nothing; unregistering makes room
        assert [x["name"] for x in (await c.get(f"{SYS}/status")).json()] == ["r0", "r1", "r2"]
        assert (await c.post(f"{SYS}/region/r0/unregister")).status_code == 200
        r = await c.post(f"{SYS}/region/r3/register", json=_body(objs[3]))
        assert r.status_code == 200, r.text
        metrics = (await c.get("/metrics")).text
        assert 'segfuse_regions{kind="system"} 3.0' in metrics


def test_region_descriptors_stay_within_the_process_limit(tmp_path, shm):
    """With a low limit of open files (256 here) and no region count bound to speak of, registrations
    stop with a 413 naming the limit while descriptors remain for everything else: new connections
    and other routes keep working (before, shm_open or accept failed with EMFILE)."""
    obj = shm(4096)
    with serve(tmp_path, nofile=256, max_regions=100_000) as served, httpx.Client(base_url=served.url,
                                                                                   timeout=scaled(30)) as c:
        statuses = []
        for i in range(300):
            r = c.post(f"{SYS}/region/r{i}/register", json=_body(obj))
            assert r.status_code in (200, 413), r.text
            statuses.append(r.status_code)
            if r.status_code == 413:
                body = r.json()
                assert "RLIMIT_NOFILE" in body["error"] and body["details"][0]["loc"] == ["path", "name"], body
        assert 413 in statuses and statuses.index(413) >= 50, statuses
        assert 200 not in statuses[statuses.index(413):]  # no registration slips past the bound
        for _ in range(20):  # fresh connections still accepted, buffers still stored
            assert httpx.get(served.url + "/v2/health/ready", timeout=scaled(30)).status_code == 200
        r = c.put("/v2/buffers/b", json={"dtype": "int64", "shape": [3], "data": [1, 2, 3]})
        assert r.status_code == 201, r.text
        # unregistering gives the descriptors back
        assert c.post(f"{SYS}/unregister").status_code == 200
        assert c.post(f"{SYS}/region/again/register", json=_body(obj)).status_code == 200


@pytest.mark.anyio
@pytest.mark.parametrize("name", ["sem.sf_test_{}", "segfuse-codec-sf_test_{}"],
                         ids=["named-semaphore", "codec-segment"])
async def test_keys_naming_the_servers_own_objects_are_refused(asgi_server, shm, name):
    """POSIX named semaphores (multiprocessing's locks among them) live as /dev/shm/sem.NAME, and the
    codec's segments, where it must name them, start with segfuse-codec-: such keys are refused even
    when the object exists."""
    obj = shm(64, name=name.format(uuid.uuid4().hex[:12]))
    async with asgi_server() as c:
        for key in ("/" + obj.name, obj.name):
            r = await c.post(f"{SYS}/region/own/register", json={"key": key, "byte_size": 64})
            assert r.status_code == 400, r.text
            body = r.json()
            assert "server's own" in body["error"] and body["details"][0]["loc"] == ["body", "key"], body
        assert (await c.get(f"{SYS}/status")).json() == []
