"""System shared-memory regions (Triton's extension) through the ASGI app and a live uvicorn server:
register/status/unregister, runs reading inputs from and writing outputs to regions (against NumPy
computed independently), every refused parameter (400 naming the field, no region byte changed),
pins (unregistering a region in use, unregister all during a run), auth, limits and metrics.
CUDA regions are in tests/gpu/test_cuda_regions_gpu.py; here only the NumPy backend's refusal."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import uuid
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np
import pytest
from helpers.service import GatedEngine

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[1]
SYS = "/v2/systemsharedmemory"


def key(s: shared_memory.SharedMemory) -> str:
    return "/" + s.name.lstrip("/")


def view(s, dtype, shape, offset=0) -> np.ndarray:
    return np.ndarray(shape, dtype, buffer=s.buf, offset=offset)


def assert_error(r, status: int, *words: str, loc: list | None = None) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    for w in words:
        assert w in body["error"], body
    if loc is not None:
        assert any(d["loc"] == loc for d in body["details"]), body
    return body


async def register(c, name, s, byte_size=None, offset=0):
    r = await c.post(f"{SYS}/region/{name}/register",
                     json={"key": key(s), "offset": offset, "byte_size": byte_size or s.size - offset})
    assert r.status_code == 200, r.text
    return r.json()


async def status(c) -> list[dict]:
    r = await c.get(f"{SYS}/status")
    assert r.status_code == 200, r.text
    return r.json()


def shm_input(name, region, shape, datatype="INT64", offset=0, nbytes=None) -> dict:
    size = nbytes if nbytes is not None else int(np.prod(shape)) * (8 if datatype in ("INT64", "FP64") else 4)
    return {"name": name, "shape": list(shape), "datatype": datatype,
            "parameters": {"shared_memory_region": region, "shared_memory_byte_size": size,
                           "shared_memory_offset": offset}}


def shm_output(name, region, nbytes, offset=0) -> dict:
    return {"name": name, "parameters": {"shared_memory_region": region, "shared_memory_byte_size": nbytes,
                                         "shared_memory_offset": offset}}


MOE_INFER = "/v2/models/moe_problem_sizes/infer"


@pytest.fixture
async def moe_regions(asgi_server, moe_graph, shm):
    """An app with the MoE histogram registered, region 'ids' holding 8x4 ids at byte 64 of an object
    registered from byte 64 (so the tensor is at byte 128 of the object) and region 'counts'."""
    async with asgi_server() as c:
        assert (await c.post("/v2/fusions", json=moe_graph)).status_code == 201
        ids_obj, out_obj = shm(4096), shm(256, fill=0x5A)
        ids = view(ids_obj, np.int64, (8, 4), offset=128)
        ids[...] = np.random.default_rng(3).integers(0, 16, (8, 4))
        await register(c, "ids", ids_obj, byte_size=1024, offset=64)
        await register(c, "counts", out_obj)
        yield c, ids, out_obj


# ---- register, status, unregister ----------------------------------------------------------------
async def test_register_status_unregister(asgi_server, shm):
    async with asgi_server() as c:
        a, b = shm(1024), shm(64)
        entry = {"name": "a", "key": key(a), "offset": 256, "byte_size": 512, "ref_count": 0}
        assert await register(c, "a", a, byte_size=512, offset=256) == entry
        # JSON whatever the Content-Type: curl -d sends a form type, tritonclient none
        bare = (await c.post(f"{SYS}/region/b/register", content=json.dumps({"key": key(b)[1:], "byte_size": 64}),
                             headers={"content-type": "application/x-www-form-urlencoded"})).json()
        assert bare["key"] == key(b) and bare["offset"] == 0  # a key without '/' is the same object
        assert [r["name"] for r in await status(c)] == ["a", "b"]
        one = await c.get(f"{SYS}/region/a/status")
        assert one.status_code == 200 and one.json() == [entry]
        r = await c.post(f"{SYS}/region/a/unregister")
        assert r.status_code == 200 and r.json() == {"unregistered": ["a"]}
        assert_error(await c.get(f"{SYS}/region/a/status"), 404, "'a' not found", loc=["path", "name"])
        assert_error(await c.post(f"{SYS}/region/a/unregister"), 404, "'a' not found")
        assert (await c.post(f"{SYS}/unregister")).json() == {"unregistered": ["b"]}
        assert await status(c) == []
        assert (await c.post(f"{SYS}/unregister")).json() == {"unregistered": []}
        meta = (await c.get("/v2")).json()
        assert {"system_shared_memory", "cuda_shared_memory"} <= set(meta["extensions"])


@pytest.mark.parametrize("bad_key", ["/a/b", "a/b", "../etc/passwd", "/..", "..", ".", "/", "", "/a..b", "a b",
                                     "/dev/shm/x"])
async def test_keys_are_plain_names(asgi_server, bad_key):
    async with asgi_server() as c:
        r = await c.post(f"{SYS}/region/r/register", json={"key": bad_key, "byte_size": 8})
        assert_error(r, 400, "plain name", loc=["body", "key"])
        assert await status(c) == []


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="Linux's shared-memory namespace is /dev/shm")
async def test_symbolic_links_and_directories_are_refused(asgi_server, tmp_path):
    target = tmp_path / "secret"
    target.write_bytes(b"x" * 64)
    link, folder = Path(f"/dev/shm/sf_test_link_{uuid.uuid4().hex[:8]}"), Path(f"/dev/shm/sf_test_dir_{uuid.uuid4().hex[:8]}")
    link.symlink_to(target)
    folder.mkdir()
    try:
        async with asgi_server() as c:
            for p in (link, folder):
                r = await c.post(f"{SYS}/region/r/register", json={"key": "/" + p.name, "byte_size": 8})
                assert_error(r, 400, "Unable to open shared memory region", loc=["body", "key"])
            assert await status(c) == []
    finally:
        link.unlink()
        folder.rmdir()


async def test_register_refusals_change_nothing(asgi_server, shm):
    async with asgi_server() as c:
        s = shm(128)
        await register(c, "taken", s)
        before = await status(c)
        for body, status_code, words, loc in [
            ({"key": "/sf_test_no_such_object", "byte_size": 8}, 400, ["Unable to open", "no such"], ["body", "key"]),
            ({"key": key(s), "byte_size": 129}, 400, ["exceeds the 128 bytes"], ["body", "byte_size"]),
            ({"key": key(s), "offset": 100, "byte_size": 29}, 400, ["offset 100 + byte_size 29"], ["body", "byte_size"]),
            ({"key": key(s), "byte_size": 0}, 400, ["byte_size"], None),
            ({"key": key(s), "offset": -1, "byte_size": 8}, 400, ["offset"], None),
            ({"byte_size": 8}, 400, ["key"], None),
            ({"key": key(s), "byte_size": 8, "extra": 1}, 400, ["extra"], None),
        ]:
            assert_error(await c.post(f"{SYS}/region/new/register", json=body), status_code, *words, loc=loc)
        assert_error(await c.post(f"{SYS}/region/new/register", content=b"{not json"), 400, "JSON")
        assert_error(await c.post(f"{SYS}/region/taken/register", json={"key": key(s), "byte_size": 8}),
                     400, "already registered", loc=["path", "name"])
        assert_error(await c.post(f"{SYS}/region/bad%2Fname/register", json={"key": key(s), "byte_size": 8}), 404)
        assert_error(await c.post(f"{SYS}/region/b%20d/register", json={"key": key(s), "byte_size": 8}), 400)
        assert await status(c) == before


async def test_cuda_regions_on_the_numpy_backend(asgi_server, shm):
    async with asgi_server() as c:
        handle = "A" * 88  # base64 of 64 bytes
        r = await c.post("/v2/cudasharedmemory/region/g/register",
                         json={"raw_handle": {"b64": handle}, "device_id": 0, "byte_size": 64})
        assert_error(r, 501, "no GPU", "cupy backend")
        assert (await c.get("/v2/cudasharedmemory/status")).json() == []
        assert (await c.post("/v2/cudasharedmemory/unregister")).json() == {"unregistered": []}
        assert_error(await c.get("/v2/cudasharedmemory/region/g/status"), 404, "CUDA shared memory region 'g'")
        # one namespace: a system region is not a CUDA region, nor can a CUDA one take its name
        await register(c, "sys", shm(64))
        assert_error(await c.get("/v2/cudasharedmemory/region/sys/status"), 404,
                     "registered as system shared memory, not CUDA shared memory")
        assert_error(await c.post("/v2/cudasharedmemory/region/sys/unregister"), 404, "not CUDA")
        assert [r["name"] for r in await status(c)] == ["sys"]


async def test_region_limit_metrics_and_auth(asgi_server, shm):
    async with asgi_server(token="s3cret", max_region_bytes=1000) as c:
        s = shm(1024)
        for method, path in [("GET", f"{SYS}/status"), ("POST", f"{SYS}/region/a/register"),
                             ("POST", f"{SYS}/unregister"), ("GET", "/v2/cudasharedmemory/status"),
                             ("POST", "/v2/cudasharedmemory/region/a/register")]:
            assert_error(await c.request(method, path), 401, "missing bearer token")
        c.headers["authorization"] = "Bearer s3cret"
        await register(c, "a", s, byte_size=600)
        r = await c.post(f"{SYS}/region/b/register", json={"key": key(s), "byte_size": 500})
        assert_error(r, 413, "limit of 1000 bytes", loc=["body", "byte_size"])
        await register(c, "b", s, byte_size=400, offset=600)
        text = (await c.get("/metrics")).text
        assert 'segfuse_region_bytes{kind="system"} 1000.0' in text and 'segfuse_regions{kind="system"} 2.0' in text
        await c.post(f"{SYS}/unregister")
        assert 'segfuse_region_bytes{kind="system"} 0.0' in (await c.get("/metrics")).text


# ---- runs --------------------------------------------------------------------------------------------
async def test_input_and_output_in_regions(moe_regions):
    c, ids, out_obj = moe_regions
    body = {"inputs": [shm_input("topk_ids", "ids", (8, 4), offset=64)], "outputs": [shm_output("counts", "counts", 256)]}
    r = await c.post(MOE_INFER, json=body)
    assert r.status_code == 200, r.text
    out = r.json()["outputs"][0]
    assert "data" not in out and out["shape"] == [16] and out["datatype"] == "INT64"
    assert out["parameters"] == {"shared_memory_region": "counts", "shared_memory_byte_size": 128,
                                 "shared_memory_offset": 0}
    expected = np.bincount(ids.reshape(-1), minlength=16)
    assert (view(out_obj, np.int64, (16,)) == expected).all()
    assert bytes(out_obj.buf[128:256]) == b"\x5a" * 128  # nothing past the output
    # the server read the region in place: new ids in the same region give new counts
    ids[...] = 15 - ids
    r = await c.post(MOE_INFER, json={**body, "outputs": [shm_output("counts", "counts", 128, offset=128)]})
    assert r.status_code == 200, r.text
    assert (view(out_obj, np.int64, (16,), offset=128) == expected[::-1]).all()
    # a region input with an inline output, and the refcounts are back to 0
    r = await c.post(MOE_INFER, json={"inputs": body["inputs"]})
    assert r.json()["outputs"][0]["data"] == expected[::-1].tolist()
    assert [x["ref_count"] for x in await status(c)] == [0, 0]


async def test_several_tensors_in_one_region(asgi_server, chain_graph, shm):
    """The elementwise chain with a, b, c at three offsets of one region and the output in the same object."""
    async with asgi_server() as c:
        assert (await c.post("/v2/fusions", json=chain_graph)).status_code == 201
        n = 100
        obj = shm(4 * n * 4)
        rng = np.random.default_rng(0)
        a, b, cc = (view(obj, np.float32, (n,), offset=k * 4 * n) for k in range(3))
        a[...], b[...], cc[...] = rng.normal(size=(3, n)).astype(np.float32)
        await register(c, "abc", obj, byte_size=3 * 4 * n)
        await register(c, "out", obj, byte_size=4 * n, offset=3 * 4 * n)
        body = {"inputs": [shm_input(x, "abc", (n,), "FP32", offset=k * 4 * n) for k, x in enumerate("abc")],
                "outputs": [shm_output("out", "out", 4 * n)]}
        r = await c.post("/v2/models/elementwise_chain/infer", json=body)
        assert r.status_code == 200, r.text
        want = np.where(a > 0, a * b + cc, np.exp(cc) * np.float32(0.5))
        np.testing.assert_allclose(view(obj, np.float32, (n,), offset=3 * 4 * n), want, rtol=1e-6)


async def test_failed_run_changes_no_region_byte(moe_regions):
    c, ids, out_obj = moe_regions
    ids[3, 1] = 16  # out of range for 16 bins
    body = {"inputs": [shm_input("topk_ids", "ids", (8, 4), offset=64)], "outputs": [shm_output("counts", "counts", 256)]}
    assert_error(await c.post(MOE_INFER, json=body), 400, "index 16 is out of bounds")
    assert bytes(out_obj.buf) == b"\x5a" * 256
    assert [x["ref_count"] for x in await status(c)] == [0, 0]


@pytest.mark.parametrize("case", [
    "byte_size_mismatch", "offset_out_of_region", "size_out_of_region", "misaligned", "no_byte_size",
    "byte_size_without_region", "data_too", "binary_too", "buffer_too", "no_shape", "unknown_region",
    "output_too_small", "output_misaligned", "output_buffer_too", "output_return_data", "output_unknown_region",
    "outputs_overlap", "negative_offset"])
async def test_bad_region_parameters(moe_regions, case):
    c, ids, out_obj = moe_regions
    good_in, good_out = shm_input("topk_ids", "ids", (8, 4), offset=64), shm_output("counts", "counts", 128)
    inp, out = json.loads(json.dumps(good_in)), json.loads(json.dumps(good_out))
    ip, op = inp["parameters"], out["parameters"]
    outputs = [out]
    status_code, words, loc = 400, [], None
    at_in = ["inputs", 0, "parameters"]
    at_out = ["outputs", 0, "parameters"]
    if case == "byte_size_mismatch":
        ip["shared_memory_byte_size"] = 248
        words, loc = ["is 248 but INT64[8, 4] needs 256 bytes"], at_in + ["shared_memory_byte_size"]
    elif case == "offset_out_of_region":
        ip["shared_memory_offset"] = 1024
        words, loc = ["exceeds the 1024 bytes of region 'ids'"], at_in + ["shared_memory_offset"]
    elif case == "size_out_of_region":
        ip["shared_memory_offset"] = 800
        words, loc = ["800 + shared_memory_byte_size 256"], at_in + ["shared_memory_byte_size"]
    elif case == "misaligned":
        ip["shared_memory_offset"] = 68
        words, loc = ["not a multiple of its item size (8)"], at_in + ["shared_memory_offset"]
    elif case == "no_byte_size":
        del ip["shared_memory_byte_size"]
        words, loc = ["without shared_memory_byte_size"], at_in + ["shared_memory_byte_size"]
    elif case == "byte_size_without_region":
        del ip["shared_memory_region"]
        words, loc = ["without shared_memory_region"], at_in + ["shared_memory_region"]
    elif case == "data_too":
        inp["data"] = [0] * 32
        words, loc = ["also gives data"], ["inputs", 0, "data"]
    elif case == "binary_too":
        ip["binary_data_size"] = 256
        words, loc = ["also gives parameters.binary_data_size"], at_in + ["binary_data_size"]
    elif case == "buffer_too":
        ip["buffer"] = "ids_0"
        words, loc = ["also gives parameters.buffer"], at_in + ["buffer"]
    elif case == "no_shape":
        del inp["shape"]
        words, loc = ["needs 'shape'"], ["inputs", 0, "shape"]
    elif case == "unknown_region":
        ip["shared_memory_region"] = "nope"
        status_code, words, loc = 404, ["region 'nope' not found"], at_in + ["shared_memory_region"]
    elif case == "output_too_small":
        op["shared_memory_byte_size"] = 120
        words, loc = ["120 is too small for INT64[16] (128 bytes)"], at_out + ["shared_memory_byte_size"]
    elif case == "output_misaligned":
        op["shared_memory_offset"] = 4
        words, loc = ["item size (8)"], at_out + ["shared_memory_offset"]
    elif case == "output_buffer_too":
        op["buffer"] = "counts_0"
        words, loc = ["also asks for parameters.buffer"], at_out + ["buffer"]
    elif case == "output_return_data":
        op["return_data"] = True
        words, loc = ["without data"], at_out + ["return_data"]
    elif case == "output_unknown_region":
        op["shared_memory_region"] = "nope"
        status_code, words, loc = 404, ["'nope' not found"], at_out + ["shared_memory_region"]
    elif case == "outputs_overlap":  # two outputs of one graph, the second over the first's bytes
        graph = json.loads((ROOT / "examples" / "moe_blockscale_offsets.json").read_text())
        assert (await c.post("/v2/fusions", json=graph)).status_code == 201
        r = await c.post("/v2/models/moe_blockscale_offsets/infer", json={
            "inputs": [{"name": "tokens_per_expert", "shape": [16], "datatype": "INT64", "data": list(range(16))}],
            "outputs": [shm_output("expert_offsets", "counts", 136), shm_output("blockscale_offsets", "counts", 136, 120)]})
        assert_error(r, 400, "would overwrite the bytes of output 'expert_offsets'",
                     loc=["outputs", 1, "parameters", "shared_memory_offset"])
        assert bytes(out_obj.buf) == b"\x5a" * 256
        return
    elif case == "negative_offset":
        ip["shared_memory_offset"] = -8
        words, loc = ["shared_memory_offset"], None
    r = await c.post(MOE_INFER, json={"inputs": [inp], "outputs": outputs})
    assert_error(r, status_code, *words, loc=loc)
    assert bytes(out_obj.buf) == b"\x5a" * 256  # nothing written
    assert [x["ref_count"] for x in await status(c)] == [0, 0]


async def test_shrunk_object_is_refused_not_a_crash(moe_regions):
    c, ids, out_obj = moe_regions
    del ids
    r = await c.post(f"{SYS}/region/tail/register", json={"key": key(out_obj), "offset": 128, "byte_size": 128})
    assert r.status_code == 200, r.text
    os.ftruncate(out_obj._fd, 128)  # the client shrinks the object under the registration
    r = await c.post(MOE_INFER, json={"inputs": [{"name": "topk_ids", "shape": [1, 1], "datatype": "INT64", "data": [1]}],
                                      "outputs": [shm_output("counts", "tail", 128)]})
    assert_error(r, 400, "shrank to 128 bytes", loc=["outputs", 0, "parameters", "shared_memory_region"])
    os.ftruncate(out_obj._fd, 256)


# ---- pins -----------------------------------------------------------------------------------------
async def test_unregister_refused_while_pinned(moe_regions):
    """A pin held from the test stands for a run in progress."""
    c, ids, out_obj = moe_regions
    rt = c.app.state.server_state
    with rt.regions.pin(["ids"]):
        assert_error(await c.post(f"{SYS}/region/ids/unregister"), 400,
                     "Cannot unregister shared memory region 'ids', it is currently in use", loc=["path", "name"])
        assert {x["name"]: x["ref_count"] for x in await status(c)} == {"counts": 0, "ids": 1}
        body = assert_error(await c.post(f"{SYS}/unregister"), 400, "currently in use by runs: 'ids'",
                            "unregistered: 'counts'")
        assert body["details"] == [{"loc": ["regions", "ids"], "msg": "in use by 1 run(s)"}]
        assert [x["name"] for x in await status(c)] == ["ids"]  # the idle one went, the pinned one stayed
    assert (await c.post(f"{SYS}/unregister")).json() == {"unregistered": ["ids"]}


async def wait_for(event: threading.Event) -> None:
    assert await asyncio.to_thread(event.wait, 10), "timed out"


async def test_unregister_during_runs_on_a_live_server(live_server, moe_graph, shm):
    """A run in flight pins its regions: unregistering one is refused, "unregister all" keeps it, and the
    run still lands its output. A run still waiting in the queue holds nothing yet: a region it names
    that is unregistered meanwhile makes it fail with 404 and change nothing."""
    import httpx

    rt = live_server.runtime
    async with httpx.AsyncClient(base_url=live_server.url, timeout=60) as c:
        await c.post(f"{SYS}/unregister")
        assert (await c.post("/v2/fusions", json=moe_graph)).status_code in (200, 201)
        ids_obj, out_obj, late_obj = shm(256), shm(128, fill=0x5A), shm(128, fill=0x5A)
        ids = view(ids_obj, np.int64, (8, 4))
        ids[...] = np.arange(32).reshape(8, 4) % 16
        for name, s in (("live_ids", ids_obj), ("live_counts", out_obj), ("live_late", late_obj)):
            await register(c, name, s)
        gate = GatedEngine(rt.engine)
        rt.engine = gate
        try:
            first = asyncio.create_task(c.post(MOE_INFER, json={
                "inputs": [shm_input("topk_ids", "live_ids", (8, 4))], "outputs": [shm_output("counts", "live_counts", 128)]}))
            await wait_for(gate.entered)
            queued = asyncio.create_task(c.post(MOE_INFER, json={
                "inputs": [shm_input("topk_ids", "live_ids", (8, 4))], "outputs": [shm_output("counts", "live_late", 128)]}))
            while rt.executor.admitted < 2:
                await asyncio.sleep(0.01)
            assert_error(await c.post(f"{SYS}/region/live_ids/unregister"), 400, "currently in use")
            body = assert_error(await c.post(f"{SYS}/unregister"), 400, "'live_counts'", "'live_ids'")
            assert "unregistered: 'live_late'" in body["error"]
            assert {x["name"]: x["ref_count"] for x in await status(c)} == {"live_counts": 1, "live_ids": 1}
        finally:
            gate.release.set()
            rt.engine = gate.inner
        r = await first
        assert r.status_code == 200, r.text
        assert (view(out_obj, np.int64, (16,)) == np.bincount(ids.reshape(-1), minlength=16)).all()
        assert_error(await queued, 404, "'live_late' not found", loc=["outputs", 0, "parameters", "shared_memory_region"])
        assert bytes(late_obj.buf) == b"\x5a" * 128
        del ids
        assert (await c.post(f"{SYS}/unregister")).json() == {"unregistered": ["live_counts", "live_ids"]}
