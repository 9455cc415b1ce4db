"""The fusion repository directory (issue 17, item 21; Triton's model repository): its graphs are
registered at start, fusions registered over HTTP are kept there and come back after a restart,
deleted ones are removed from it, a bad file is skipped (and logged) without stopping the rest."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.anyio

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


async def _names(c) -> list[str]:
    return sorted(f["name"] for f in (await c.get("/v2/fusions")).json()["fusions"])


async def test_graphs_in_the_directory_are_registered_at_start(asgi_server, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="segfuse.server")
    for name in ("moe_problem_sizes", "moe_argsort"):
        shutil.copy(EXAMPLES / f"{name}.json", tmp_path / f"{name}.json")
    (tmp_path / "broken.json").write_text('{"format": "segfuse.fusion/1", "name": "x", "ops": [}')
    (tmp_path / "notes.txt").write_text("not a graph")
    async with asgi_server(fusion_dir=str(tmp_path)) as c:
        assert await _names(c) == ["moe_argsort", "moe_problem_sizes"]
        r = await c.post("/v2/models/moe_problem_sizes/infer", json={
            "inputs": [{"name": "topk_ids", "shape": [1, 2], "datatype": "INT64", "data": [3, 3]}]})
        assert r.status_code == 200 and r.json()["outputs"][0]["data"][3] == 2
    assert any("broken.json not registered" in rec.getMessage() for rec in caplog.records)


async def test_registrations_survive_a_restart_and_deletes_remove_them(asgi_server, tmp_path, moe_graph, chain_graph):
    async with asgi_server(fusion_dir=str(tmp_path)) as c:
        assert (await c.post("/v2/fusions", json=moe_graph)).status_code == 201
        chain_id = (await c.post("/v2/fusions", json=chain_graph)).json()["id"]
        files = sorted(p.name for p in tmp_path.glob("*.json"))
        assert len(files) == 2 and f"{chain_id}.json" in files
        assert json.loads((tmp_path / f"{chain_id}.json").read_text())["name"] == "elementwise_chain"
    async with asgi_server(fusion_dir=str(tmp_path)) as c:  # a restarted server
        assert await _names(c) == ["elementwise_chain", "moe_problem_sizes"]
        assert (await c.delete("/v2/fusions/elementwise_chain")).status_code == 200
        assert not (tmp_path / f"{chain_id}.json").exists()
        other = {**moe_graph, "ops": [dict(op) for op in moe_graph["ops"]]}
        other["ops"][1]["shape"] = [32]  # another graph under the same name, replacing it
        new_id = (await c.post("/v2/fusions", json=other, params={"replace": "true"})).json()["id"]
        assert [p.name for p in tmp_path.glob("*.json")] == [f"{new_id}.json"]
        assert (await c.post("/v2/repository/models/moe_problem_sizes/unload")).status_code == 200
        assert (tmp_path / f"{new_id}.json").exists()  # unloaded, not deleted: it loads again at start
    async with asgi_server(fusion_dir=str(tmp_path)) as c:
        assert await _names(c) == ["moe_problem_sizes"]
        r = await c.get("/v2/fusions/moe_problem_sizes")
        assert r.json()["id"] == new_id


async def test_deleting_a_fusion_loaded_from_an_operators_file_removes_that_file(asgi_server, tmp_path):
    shutil.copy(EXAMPLES / "moe_problem_sizes.json", tmp_path / "histogram.json")
    async with asgi_server(fusion_dir=str(tmp_path)) as c:
        assert (await c.delete("/v2/fusions/moe_problem_sizes")).status_code == 200
    assert not list(tmp_path.glob("*.json"))


def test_segfuse_serve_fusion_dir_survives_a_restart(tmp_path):
    """Through the console script: `segfuse serve --fusion-dir DIR`, a fusion registered over HTTP
    (by `segfuse` itself) is in DIR and registered again by the next server on DIR."""
    import httpx
    from helpers.processes import SEGFUSE, segfuse, server_process

    repo = tmp_path / "repo"
    repo.mkdir()

    def serve():  # (the port comes from server_process's SEGFUSE_PORT)
        return server_process(cmd=[*SEGFUSE, "serve", "--backend", "numpy", "--fusion-dir", str(repo)])

    with serve() as url:
        assert httpx.get(url + "/v2/fusions").json()["fusions"] == []
        graph = json.loads((EXAMPLES / "moe_problem_sizes.json").read_text())
        r = httpx.post(url + "/v2/fusions", json=graph)
        assert r.status_code == 201
    kept = list(repo.iterdir())  # kept as <id>.json
    assert [p.name for p in kept] == [f"{r.json()['id']}.json"]
    assert json.loads(kept[0].read_text())["name"] == "moe_problem_sizes"
    with serve() as url:
        assert "moe_problem_sizes" in segfuse("fusions", "ls", server=url).stdout
        segfuse("fusions", "rm", "moe_problem_sizes", server=url)
    assert list(repo.iterdir()) == []
