"""An app from `create_app` may be started and stopped more than once in one process (embedders,
test clients, schemathesis's in-process runs each run its lifespan): every start serves like the
first, validation and planning included."""

from __future__ import annotations

import pytest


@pytest.mark.anyio
async def test_a_restarted_app_still_registers_plans_and_runs(moe_graph):
    """The validation and planning threads were shut down with the first lifespan and never made
    again: after a restart every registration answered 500 ('cannot schedule new futures')."""
    import httpx
    from asgi_lifespan import LifespanManager
    from segfuse.server import create_app
    from segfuse.server.app import wait_ready
    from segfuse.server.settings import Settings

    app = create_app(Settings(backend="numpy"))
    infer = {"inputs": [{"name": "topk_ids", "datatype": "INT64", "shape": [2, 2], "data": [1, 3, 3, 15]}]}
    for start in range(3):
        async with LifespanManager(app, startup_timeout=60) as manager:
            await wait_ready(app)
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=manager.app),
                                         base_url="http://segfuse.test") as c:
                moe_graph["name"] = f"moe_{start}"  # a new graph each time: validated, not found registered
                r = await c.post("/v2/fusions", json=moe_graph)
                assert r.status_code == 201, (start, r.status_code, r.text)
                plan = await c.get(f"/v2/fusions/moe_{start}/plan", params={"shape": "T=2,K=2", "source": "false"})
                assert plan.status_code == 200, (start, plan.text)
                out = await c.post(f"/v2/models/moe_{start}/infer", json=infer)
                assert out.status_code == 200, (start, out.text)
                # counts of the indices 1, 3, 3, 15 among 16 bins
                assert out.json()["outputs"][0]["data"] == [0, 1, 0, 2] + [0] * 11 + [1], start
