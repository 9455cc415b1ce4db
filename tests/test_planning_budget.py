"""Validating and planning stay bounded: size expressions past the complexity bounds are refused at
the op that writes them (simplifying them took minutes), the segmenter's passes charge a
deterministic work budget and a clock (compiler/limits.py), and the server validates graphs and
plans cold runs on threads of their own under that budget (413 past it), so neither holds up buffer
I/O or other clients' runs."""

from __future__ import annotations

import asyncio
import threading
import time

import numpy as np
import pytest
from helpers.service import assert_error
from helpers.waiting import scaled
from segfuse.compiler.engine import Engine
from segfuse.compiler.errors import GraphError
from segfuse.compiler.ir import Fusion
from segfuse.compiler.limits import BudgetExceeded, budget
from segfuse.compiler.segmenter.cache import PlanCache

pytestmark = pytest.mark.anyio


def graph(name, ops, outputs, inputs=None) -> dict:
    return {"format": "segfuse.fusion/1", "name": name, "inputs": inputs or [{"name": "x", "dtype": "int64",
                                                                             "shape": ["T"]}],
            "ops": ops, "outputs": outputs}


def nested_floor(depth: int) -> str:
    """((T+1)//2+2)//3 ... nested `depth` deep: each level doubled simplify's time."""
    e = "T"
    for k in range(depth):
        e = f"({e}+{k + 1})//{k + 2}"
    return e


def scatter_chain(n: int, name: str = "chain") -> dict:
    """n scatter-adds into one 16-element tensor, each into the previous one's result."""
    ops = [{"op": "full", "out": "c0", "shape": [16], "value": 0, "dtype": "int64"},
           {"op": "full_like", "out": "ones", "inputs": ["idx"], "value": 1}]
    ops += [{"op": "scatter", "out": f"c{k + 1}", "inputs": [f"c{k}", "idx", "ones"], "dim": 0, "reduce": "add"}
            for k in range(n)]
    return graph(name, ops, [f"c{n}"], [{"name": "idx", "dtype": "int64", "shape": ["N"]}])


def plan_of(g: dict, shapes: dict):
    return Engine("numpy", plan_cache=PlanCache()).plan(Fusion.from_json(g), shapes)


# ---- size expressions -------------------------------------------------------------------------
def test_nested_floor_divisions_are_refused_at_the_attribute_that_writes_them():
    g = graph("nested", [{"op": "full", "out": "y", "shape": [nested_floor(6)], "value": 0, "dtype": "int64"}], ["y"])
    t0 = time.perf_counter()
    with pytest.raises(GraphError) as e:
        Fusion.from_json(g)
    assert time.perf_counter() - t0 < scaled(5)
    (issue,) = e.value.issues
    assert issue.loc == ("ops", 0, "shape", 0), issue
    assert "too complex" in issue.msg and "'//' nested more than 4 deep" in issue.msg, issue.msg


def test_sizes_within_the_bounds_bind_to_python_arithmetic():
    exprs = ["(T+3)//4*4", nested_floor(4), "T*T*2 - T//3", "(T//2 + T//3)//5"]
    ops = [{"op": "full", "out": f"y{k}", "shape": [e], "value": 0, "dtype": "int64"} for k, e in enumerate(exprs)]
    f = Fusion.from_json(graph("within", ops, [f"y{k}" for k in range(len(exprs))]))
    for t in (0, 1, 7, 1000):
        types = f.bind({"x": (t,)}).types
        got = [types[f"y{k}"].shape[0] for k in range(len(exprs))]
        assert got == [eval(e, {"T": t}) for e in exprs], (t, got)  # the graph's own text, as Python


def test_a_slice_of_a_strided_slice_is_refused_not_simplified_for_minutes():
    """Each slice of a symbolic size doubles its expression: four took 154 s to validate."""
    ops = [{"op": "slice", "out": "a", "inputs": ["x"], "dim": 0, "start": 1, "step": 2},
           {"op": "slice", "out": "b", "inputs": ["a"], "dim": 0, "start": 1, "step": 2}]
    with pytest.raises(GraphError) as e:
        Fusion.from_json(graph("slices", ops, ["b"]))
    (issue,) = e.value.issues
    assert issue.loc[:2] == ("ops", 1) and "too complex" in issue.msg, issue
    # one slice is fine, and still right
    f = Fusion.from_json(graph("slice", ops[:1], ["a"]))
    assert [f.bind({"x": (t,)}).types["a"].shape[0] for t in (0, 1, 2, 9)] == [len(range(t)[1::2]) for t in (0, 1, 2, 9)]


# ---- the work budget ---------------------------------------------------------------------------
def test_planning_charges_the_same_work_every_time_and_stops_one_unit_past_it():
    g, shapes = scatter_chain(48), {"idx": (8,)}
    used = []
    for _ in range(2):
        with budget("planning the run", work=10**9) as b:
            plan_of(g, shapes)
        used.append(b.used)
    assert used[0] == used[1] and used[0] > 48, used
    with budget("planning the run", work=used[0], work_name="max_plan_work"):
        plan_of(g, shapes)
    with pytest.raises(BudgetExceeded) as e, budget("planning the run", work=used[0] - 1, work_name="max_plan_work"):
        plan_of(g, shapes)
    assert e.value.limit == "max_plan_work" and "max_plan_work" in str(e.value)


def test_a_long_scatter_chain_stops_at_the_work_budget_quickly():
    g = scatter_chain(1024)  # planned for minutes before
    t0 = time.perf_counter()
    with pytest.raises(BudgetExceeded) as e, budget("planning the run", work=200_000, work_name="max_plan_work"):
        plan_of(g, {"idx": (8,)})
    assert "200000 work units (max_plan_work)" in str(e.value)
    assert time.perf_counter() - t0 < scaled(60)


def test_the_clock_stops_planning_past_its_seconds():
    g = scatter_chain(2048)
    t0 = time.perf_counter()
    with pytest.raises(BudgetExceeded) as e, budget("planning the run", seconds=0.5, seconds_name="max_plan_seconds"):
        plan_of(g, {"idx": (8,)})
    assert e.value.limit == "max_plan_seconds" and "0.5 s" in str(e.value)
    assert time.perf_counter() - t0 < scaled(30)


def test_a_scatter_chain_within_the_budget_counts_right():
    g = scatter_chain(64)
    idx = np.array([3, 3, 15, 0, 7], np.int64)
    with budget("planning the run", work=1_000_000):
        out = Engine("numpy", plan_cache=PlanCache()).run(Fusion.from_json(g), {"idx": idx}).outputs["c64"]
    np.testing.assert_array_equal(out, 64 * np.bincount(idx, minlength=16))


# ---- the server --------------------------------------------------------------------------------
async def test_registration_past_the_work_budget_is_413_and_registers_nothing(asgi_server):
    ops = [{"op": "full", "out": f"y{k}", "shape": [f"(T+{k})//2"], "value": 0, "dtype": "int64"} for k in range(60)]
    async with asgi_server(max_plan_work=500) as c:
        r = await c.post("/v2/fusions", json=graph("expensive", ops, ["y0"]))
        assert_error(r, 413, "validating the graph", "500 work units (max_plan_work)")
        assert (await c.get("/v2/fusions")).json()["fusions"] == []
        r = await c.post("/v2/fusions", json=graph("cheap", ops[:2], ["y0"]))
        assert r.status_code == 201, r.text


async def test_a_cold_run_past_the_planning_budget_is_413_and_changes_nothing(asgi_server, moe_graph):
    async with asgi_server(max_plan_work=20_000) as c:
        assert (await c.post("/v2/fusions", json=scatter_chain(256))).status_code == 201
        body = {"inputs": [{"name": "idx", "shape": [3], "datatype": "INT64", "data": [1, 2, 2]}],
                "outputs": [{"name": "c256", "parameters": {"buffer": "counts"}}]}
        r = await c.post("/v2/models/chain/infer", json=body)
        assert_error(r, 413, "planning the run", "20000 work units (max_plan_work)")
        assert (await c.get("/v2/buffers")).json()["buffers"] == []
        r = await c.get("/v2/fusions/chain/plan", params={"shape": "N=3"})  # the plan route: the same budget
        assert_error(r, 413, "20000 work units (max_plan_work)")
        # a graph within the budget runs on the same server
        assert (await c.post("/v2/fusions", json=moe_graph)).status_code == 201
        r = await c.post("/v2/models/moe_problem_sizes/infer",
                         json={"inputs": [{"name": "topk_ids", "shape": [2, 1], "datatype": "INT64", "data": [3, 3]}]})
        assert r.status_code == 200 and r.json()["outputs"][0]["data"][3] == 2, r.text


async def test_a_cold_run_plans_off_the_run_worker(asgi_server, moe_graph, monkeypatch):
    """While one fusion's planning is held, another fusion's runs go through the (single) run worker."""
    async with asgi_server() as c:
        rt = c.app.state.server_state
        assert (await c.post("/v2/fusions", json=scatter_chain(4))).status_code == 201
        assert (await c.post("/v2/fusions", json=moe_graph)).status_code == 201
        slow_id = rt.fusions.resolve("chain").id
        plans, entered, release = rt.engine.plans, threading.Event(), threading.Event()
        real_get = plans.get

        def held_get(fusion, bound):
            if fusion.id == slow_id and not release.is_set():
                entered.set()
                release.wait(60)
            return real_get(fusion, bound)

        monkeypatch.setattr(plans, "get", held_get)
        slow = asyncio.ensure_future(c.post("/v2/models/chain/infer", json={
            "inputs": [{"name": "idx", "shape": [2], "datatype": "INT64", "data": [5, 5]}]}))
        try:
            for _ in range(200):
                if entered.is_set():
                    break
                await asyncio.sleep(0.05)
            assert entered.is_set(), "the held planning never started"
            for n in (1, 2, 3):  # each a different size, so each binds and plans anew
                ids = list(range(n))
                r = await asyncio.wait_for(c.post("/v2/models/moe_problem_sizes/infer", json={
                    "inputs": [{"name": "topk_ids", "shape": [n, 1], "datatype": "INT64", "data": ids}]}), scaled(20))
                assert r.status_code == 200 and r.json()["outputs"][0]["data"] == np.bincount(ids, minlength=16).tolist()
            assert not slow.done()
        finally:
            release.set()
        r = await asyncio.wait_for(slow, scaled(60))
        assert r.status_code == 200 and r.json()["outputs"][0]["data"][5] == 8, r.text  # 4 scatters of 2 ones


async def test_graphs_being_validated_do_not_hold_up_buffer_io(asgi_server, monkeypatch):
    """More registrations than asyncio's default executor has threads are held in validation; a
    buffer PUT and GET (which use that executor) still answer, and the held ones answer 201 or 429."""
    async with asgi_server() as c:
        rt = c.app.state.server_state
        release = threading.Event()
        real_parse = rt.fusions.parse

        def held_parse(g):
            release.wait(60)
            return real_parse(g)

        monkeypatch.setattr(rt.fusions, "parse", held_parse)
        ops = [{"op": "full", "out": "y", "shape": [4], "value": 1, "dtype": "int64"}]
        held = [asyncio.ensure_future(c.post("/v2/fusions", json=graph(f"g{k}", ops, ["y"]))) for k in range(40)]
        try:
            await asyncio.sleep(0.5)
            a = np.arange(6, dtype=np.int64)
            r = await asyncio.wait_for(c.put("/v2/buffers/b", content=a.tobytes(), params={"dtype": "int64", "shape": "6"},
                                             headers={"content-type": "application/octet-stream"}), scaled(20))
            assert r.status_code == 201, r.text
            r = await asyncio.wait_for(c.get("/v2/buffers/b", headers={"accept": "application/octet-stream"}), scaled(20))
            assert np.frombuffer(r.content, np.int64).tolist() == a.tolist()
        finally:
            release.set()
        statuses = [r.status_code for r in await asyncio.wait_for(asyncio.gather(*held), scaled(60))]
        assert set(statuses) <= {201, 429} and statuses.count(201) >= 2, statuses
        assert len((await c.get("/v2/fusions")).json()["fusions"]) == statuses.count(201)
