"""A client that shrinks its shared-memory object while a run uses it gets a clear 400 (or, for an
input read before the shrink, the right result); the server survives, where touching the missing
pages of a mapping would have killed it with SIGBUS. The server runs in its own process
(tests/region_server.py), with its engine gated so that the shrink lands exactly mid-run."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from helpers.graphs import MOE_PROBLEM_SIZES
from helpers.waiting import scaled
from region_server import Served, get, post, serve

pytestmark = pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="POSIX shared memory in /dev/shm (Linux)")

SYS = "/v2/systemsharedmemory"
INFER = "/v2/models/moe_problem_sizes/infer"
TOKENS, K = 16384, 8  # 1 MiB of int64 ids: the read spans many pages


def _register(served: Served, name: str, obj, byte_size: int) -> None:
    r = post(served, f"{SYS}/region/{name}/register", json={"key": "/" + obj.name, "byte_size": byte_size})
    assert r.status_code == 200, r.text


def _infer_body() -> dict:
    return {"inputs": [{"name": "topk_ids", "shape": [TOKENS, K], "datatype": "INT64",
                        "parameters": {"shared_memory_region": "ids", "shared_memory_byte_size": TOKENS * K * 8}}],
            "outputs": [{"name": "counts", "parameters": {"shared_memory_region": "counts",
                                                           "shared_memory_byte_size": 128}}]}


def _run_while_shrinking(served: Served, obj, size: int):
    """One run held in the engine while `obj` shrinks to `size` bytes; its response, once the server
    is known to have survived it."""
    box: dict = {}

    def call():
        try:
            box["r"] = post(served, INFER, json=_infer_body())
        except Exception as e:  # the server died under the request
            box["e"] = e

    t = threading.Thread(target=call)
    t.start()
    served.wait_entered()
    os.ftruncate(obj._fd, size)
    served.open_gate()
    t.join(scaled(60))
    assert served.alive(), f"the server died: exit status {served.proc.returncode} (-7 is SIGBUS)"
    r = box.get("r")
    assert r is not None, box
    return r


def test_shrinking_objects_mid_run_fails_the_run_not_the_server(tmp_path, shm):
    ids_obj, out_obj = shm(TOKENS * K * 8), shm(256)
    ids = np.random.default_rng(5).integers(0, 16, (TOKENS, K))
    np.ndarray(ids.shape, np.int64, buffer=ids_obj.buf)[...] = ids
    out_obj.buf[:] = b"\x5a" * 256
    with serve(tmp_path, gate=True) as served:
        assert post(served, "/v2/fusions", json=MOE_PROBLEM_SIZES).status_code == 201
        _register(served, "ids", ids_obj, TOKENS * K * 8)
        _register(served, "counts", out_obj, 256)

        # the input object shrinks to nothing while the run is in the engine
        r = _run_while_shrinking(served, ids_obj, 0)
        if r.status_code == 200:  # the input had been read before it shrank: the result is right
            counts = np.frombuffer(bytes(out_obj.buf[:128]), np.int64)
            np.testing.assert_array_equal(counts, np.bincount(ids.ravel(), minlength=16))
        else:
            assert r.status_code == 400 and "shrank" in r.json()["error"], r.text
        os.ftruncate(ids_obj._fd, TOKENS * K * 8)
        np.ndarray(ids.shape, np.int64, buffer=ids_obj.buf)[...] = ids
        out_obj.buf[:] = b"\x5a" * 256

        # the output object shrinks while the run is in the engine: nothing may be written back
        r = _run_while_shrinking(served, out_obj, 64)
        assert r.status_code == 400, r.text
        body = r.json()
        assert "shrank to 64 bytes" in body["error"], body
        assert any(d["loc"] == ["outputs", 0, "parameters", "shared_memory_region"] for d in body["details"]), body
        assert os.fstat(out_obj._fd).st_size == 64 and bytes(out_obj.buf[:64]) == b"\x5a" * 64  # nothing written
        assert get(served, "/v2/health/live").status_code == 200
        stat = get(served, f"{SYS}/status").json()
        assert [(x["name"], x["ref_count"]) for x in stat] == [("counts", 0), ("ids", 0)]


def test_objects_resized_during_many_runs_never_crash_the_server(tmp_path, shm):
    """No gate: a thread keeps shrinking and restoring the input object while runs go on. Every run
    answers 200 or a 400 that says the object shrank, and the server stays up."""
    nbytes = TOKENS * K * 8
    ids_obj, out_obj = shm(nbytes), shm(128)
    with serve(tmp_path) as served:
        assert post(served, "/v2/fusions", json=MOE_PROBLEM_SIZES).status_code == 201
        _register(served, "ids", ids_obj, nbytes)
        _register(served, "counts", out_obj, 128)
        stop = threading.Event()

        def flap():
            while not stop.is_set():
                os.ftruncate(ids_obj._fd, 4096)
                os.ftruncate(ids_obj._fd, nbytes)

        flapper = threading.Thread(target=flap)
        flapper.start()
        statuses = []
        try:
            for _ in range(60):
                try:
                    r = post(served, INFER, json=_infer_body())
                except Exception as e:
                    raise AssertionError(f"the server died: exit status {served.proc.poll()}") from e
                assert r.status_code in (200, 400), r.text
                if r.status_code == 400:
                    assert "shrank" in r.json()["error"], r.text
                statuses.append(r.status_code)
        finally:
            stop.set()
            flapper.join()
        assert served.alive() and get(served, "/v2/health/live").status_code == 200
        assert len(statuses) == 60
