"""On the GPU a run is also bounded by the device's free memory: one whose buffers need more than is
free is refused with 413 before anything is allocated (the engine never sees it), and the device
keeps serving runs that fit."""

from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy")

from helpers.graphs import FILL_INPUT as X  # noqa: E402
from helpers.graphs import fill_graph  # noqa: E402
from helpers.service import count_runs  # noqa: E402

pytestmark = [pytest.mark.gpu, pytest.mark.anyio]
HUGE = 1 << 52  # the byte limits out of the way: only the device's free memory binds


async def test_a_run_needing_more_than_the_free_device_memory_is_413(asgi_server, monkeypatch):
    free, _total = cp.cuda.runtime.memGetInfo()
    n = (free + cp.get_default_memory_pool().free_bytes()) // 4 + (1 << 28)  # 1 GiB more than is free
    async with asgi_server(backend="cupy", max_buffer_bytes=HUGE, max_total_bytes=HUGE, max_run_bytes=HUGE) as c:
        runs = count_runs(c.app.state.server_state, monkeypatch)
        for name, size in (("too_big", n), ("fits", 1024)):
            assert (await c.post("/v2/fusions", json=fill_graph(size, name))).status_code == 201
        r = await c.post("/v2/models/too_big/infer", json={"inputs": [X], "outputs": [
            {"name": "y", "parameters": {"buffer": "y"}}]})
        assert r.status_code == 413 and "bytes are free" in r.json()["error"], r.text
        assert runs == [] and (await c.get("/v2/buffers")).json()["buffers"] == []
        r = await c.post("/v2/models/fits/infer", json={"inputs": [X]})
        assert r.status_code == 200, r.text
        np.testing.assert_array_equal(np.array(r.json()["outputs"][0]["data"], np.float32),
                                      np.full(1024, 3.5, np.float32))
