"""The fusion repository (`--fusion-dir`) says exactly what is registered: after any sequence of
register, replace, unload, load, delete, failed disk writes and restarts (a new registry over the
same directory), the fusions registered and the graphs in the directory's files agree with a model
of the registry, and a restart answers every name with the graph last registered under it. Crafted
entries in the directory (a FIFO, symlinks) neither block the start nor redirect a write."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import errno
import json
import logging
import os
import shutil
import tempfile
import threading
from pathlib import Path

import pytest
from helpers.waiting import scaled
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from segfuse.compiler import Fusion, Limits
from segfuse.server import fusion_repository
from segfuse.server.errors import ApiError
from segfuse.server.fusions import FusionRegistry

MOE = json.loads((Path(__file__).resolve().parents[1] / "examples" / "moe_problem_sizes.json").read_text())
NAMES = ("alpha", "beta")
VARIANTS = (1, 2, 3)


def graph(name: str, variant: int) -> dict:
    """A MoE histogram whose counts are `variant` per routed token: each variant is another graph."""
    g = copy.deepcopy(MOE)
    g["name"] = name
    g["ops"][2]["value"] = variant
    return g


_FUSIONS: dict[tuple[str, int], Fusion] = {}


def fusion(name: str, variant: int) -> Fusion:
    if (name, variant) not in _FUSIONS:
        _FUSIONS[name, variant] = Fusion.from_json(graph(name, variant))
    return _FUSIONS[name, variant]


def graphs_on_disk(directory: str) -> dict[str, set[str]]:
    """Graph name -> ids of the graphs the directory's *.json files hold (read independently)."""
    out: dict[str, set[str]] = {}
    for p in Path(directory).glob("*.json"):
        f = Fusion.from_json(json.loads(p.read_text()))
        out.setdefault(f.name, set()).add(f.id)
    return out


class _FailingOs:
    """The `os` module, as server/fusion_repository.py sees it, with one call failing like a disk would."""

    def __init__(self, call: str, code: int):
        self.call, self.code = call, code

    def __getattr__(self, name):
        if name == self.call:
            def fail(*args, **kwargs):
                raise OSError(self.code, os.strerror(self.code))
            return fail
        return getattr(os, name)


@contextlib.contextmanager
def failing_disk(call: str, code: int = errno.ENOSPC):
    real = fusion_repository.os
    fusion_repository.os = _FailingOs(call, code)
    try:
        yield
    finally:
        fusion_repository.os = real


def expect_status(status: int, fn, *args):
    with pytest.raises(ApiError) as e:
        fn(*args)
    assert e.value.status == status, e.value.message


class RepositoryMachine(RuleBasedStateMachine):
    """Changes go through the registry's async API (what the routes call); a restart is a new
    registry loading the same directory, as `segfuse serve` does at start."""

    def __init__(self):
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="segfuse-repo-")
        self.registered: dict[str, int] = {}  # the model: name -> variant
        self.unloaded: dict[str, int] = {}
        self.copies = 0
        self.reg = self._start()

    def teardown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def _start(self, superseded: int = 0) -> FusionRegistry:
        reg = FusionRegistry(Limits(), directory=self.dir)
        failed = reg.load_directory()
        assert len(failed) == superseded and all("renamed to" in why for _, why in failed), failed
        return reg

    def _run(self, coro):
        return asyncio.run(coro)

    def _needs_write(self, name: str, v: int) -> bool:
        return self.unloaded.get(name) != v  # an unloaded graph loaded again has its file already

    @rule(name=st.sampled_from(NAMES), v=st.sampled_from(VARIANTS), replace=st.booleans(),
          fail=st.sampled_from([None, "write", "fsync", "replace"]))
    def register(self, name, v, replace, fail):
        """POST /v2/fusions[?replace=true]; with replace, also Triton's load with a config."""
        f = fusion(name, v)
        call = self._run if fail is None else self._failing(fail)
        if self.registered.get(name) == v:
            assert call(self.reg.register_async(f, replace)).created is False
        elif name in self.registered and not replace:
            expect_status(409, call, self.reg.register_async(f, replace))
        elif fail is not None and self._needs_write(name, v):
            expect_status(507, call, self.reg.register_async(f, replace))
        else:
            old = self.registered.get(name)
            r = call(self.reg.register_async(f, replace))
            assert r.created and r.replaced == (None if old is None else fusion(name, old).id)
            self.registered[name] = v
            self.unloaded.pop(name, None)

    def _failing(self, call: str):
        def run(coro):
            with failing_disk(call):
                return asyncio.run(coro)
        return run

    @rule(name=st.sampled_from(NAMES))
    def unload(self, name):
        if name in self.registered:
            assert self._run(self.reg.unload_async(name)).name == name
            self.unloaded[name] = self.registered.pop(name)
        else:
            expect_status(404, self._run, self.reg.unload_async(name))

    @rule(name=st.sampled_from(NAMES))
    def load(self, name):
        """Triton's load without a config: an unloaded fusion registered again."""
        got = self._run(self.reg.load_async(name))
        if name in self.unloaded:
            assert got[0].id == fusion(name, self.unloaded[name]).id and got[1].created
            self.registered[name] = self.unloaded.pop(name)
        elif name in self.registered:
            assert got[0].id == fusion(name, self.registered[name]).id and not got[1].created
        else:
            assert got is None

    @rule(name=st.sampled_from(NAMES), fail=st.booleans())
    def delete(self, name, fail):
        known = name in self.registered or name in self.unloaded
        if not known:
            expect_status(404, self._run, self.reg.delete_async(name))
        elif fail:
            expect_status(507, self._failing("remove"), self.reg.delete_async(name))
        else:
            self._run(self.reg.delete_async(name))
            self.registered.pop(name, None)
            self.unloaded.pop(name, None)

    def _restarted(self, superseded: int = 0) -> None:
        self.reg = self._start(superseded)
        self.registered.update(self.unloaded)  # unloaded fusions keep their file: registered again
        self.unloaded.clear()

    @rule()
    def restart(self):
        self._restarted()

    @rule(data=st.data())
    def operator_copies_a_file_then_restart(self, data):
        """Two files hold one graph: both belong to the fusion (a delete removes both)."""
        if not (self.registered or self.unloaded):
            return
        src = data.draw(st.sampled_from(sorted(Path(self.dir).glob("*.json"))))
        self.copies += 1
        shutil.copy(src, Path(self.dir) / f"copy{self.copies}.json")
        self._restarted()

    @rule(data=st.data(), v=st.sampled_from(VARIANTS))
    def crash_between_writing_a_replacement_and_removing_the_old_file(self, data, v):
        """kill -9 after the replacement's file is written, before the replaced one is removed:
        the next start registers the replacement (the newer file), the old file is set aside."""
        if not (self.registered or self.unloaded):
            return
        name = data.draw(st.sampled_from(sorted({**self.registered, **self.unloaded})))
        current = {**self.registered, **self.unloaded}[name]
        if v == current:
            return
        others = [str(p) for p in Path(self.dir).glob("*.json")]
        self.reg.repository.write(fusion(name, v).id, json.dumps(graph(name, v)).encode(), newer_than=others)
        old_files = sum(1 for p in Path(self.dir).glob("*.json")
                        if json.loads(p.read_text())["ops"][2]["value"] == current
                        and json.loads(p.read_text())["name"] == name)
        self.unloaded.pop(name, None)
        self.registered[name] = v
        self._restarted(superseded=old_files)

    @invariant()
    def registry_matches_the_model(self):
        assert {f.name: f.id for f in self.reg.all()} == {n: fusion(n, v).id for n, v in self.registered.items()}
        assert {n: f.id for n, f in self.reg.unloaded.items()} == \
            {n: fusion(n, v).id for n, v in self.unloaded.items()}

    @invariant()
    def directory_holds_exactly_the_registered_and_unloaded_graphs(self):
        want = {n: {fusion(n, v).id} for n, v in {**self.registered, **self.unloaded}.items()}
        assert graphs_on_disk(self.dir) == want
        assert not [p.name for p in Path(self.dir).iterdir() if p.name.endswith(".tmp")]


RepositoryMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=20, deadline=None,
                                               suppress_health_check=[HealthCheck.too_slow])
test_the_repository_agrees_with_the_registry_after_any_sequence = RepositoryMachine.TestCase


# ---- through HTTP -----------------------------------------------------------------------------
ONE_TOKEN = {"inputs": [{"name": "topk_ids", "shape": [1, 1], "datatype": "INT64", "data": [3]}]}


async def _count(c, name: str) -> int:
    r = await c.post(f"/v2/models/{name}/infer", json=ONE_TOKEN)
    assert r.status_code == 200, r.text
    return r.json()["outputs"][0]["data"][3]


@pytest.mark.anyio
async def test_a_version_loaded_after_unload_answers_after_a_restart(asgi_server, tmp_path):
    """Triton's flow: unload, load a new version (parameters.config), restart: the new graph answers."""
    async with asgi_server(fusion_dir=str(tmp_path)) as c:
        assert (await c.post("/v2/fusions", json=graph("hist", 4))).status_code == 201
        assert await _count(c, "hist") == 4
        assert (await c.post("/v2/repository/models/hist/unload")).status_code == 200
        r = await c.post("/v2/repository/models/hist/load",
                         json={"parameters": {"config": json.dumps(graph("hist", 20))}})
        assert r.status_code == 200, r.text
        assert await _count(c, "hist") == 20
    async with asgi_server(fusion_dir=str(tmp_path)) as c:
        assert await _count(c, "hist") == 20
    assert graphs_on_disk(str(tmp_path)) == {"hist": {fusion("hist", 20).id}}


@pytest.mark.anyio
async def test_a_graph_held_by_two_files_stays_deleted_after_a_restart(asgi_server, tmp_path):
    (tmp_path / "hist.json").write_text(json.dumps(graph("hist", 1)))
    (tmp_path / "hist-copy.json").write_text(json.dumps(graph("hist", 1)))
    async with asgi_server(fusion_dir=str(tmp_path)) as c:
        assert (await c.delete("/v2/fusions/hist")).status_code == 200
    assert list(tmp_path.iterdir()) == []
    async with asgi_server(fusion_dir=str(tmp_path)) as c:
        assert (await c.get("/v2/fusions/hist")).status_code == 404


@pytest.mark.anyio
@pytest.mark.parametrize("call", ["replace", "fsync"])
async def test_a_failed_repository_write_answers_507_and_registers_nothing(asgi_server, tmp_path, monkeypatch, call):
    async with asgi_server(fusion_dir=str(tmp_path)) as c:
        with monkeypatch.context() as m:
            def full(*args, **kwargs):
                raise OSError(errno.ENOSPC, "No space left on device")
            m.setattr(os, call, full)
            r = await c.post("/v2/fusions", json=graph("hist", 1))
        assert r.status_code == 507, r.text
        assert "No space left on device" in r.json()["error"] and "not registered" in r.json()["error"]
        assert r.json()["details"][0]["loc"] == ["server", "fusion_dir"]
        assert (await c.get("/v2/fusions/hist")).status_code == 404
        assert list(tmp_path.iterdir()) == []  # no graph file, no temporary file
        assert (await c.post("/v2/fusions", json=graph("hist", 1))).status_code == 201  # the disk is back
    async with asgi_server(fusion_dir=str(tmp_path)) as c:
        assert await _count(c, "hist") == 1


@pytest.mark.anyio
async def test_a_replacement_whose_old_file_cannot_be_removed_changes_nothing(asgi_server, tmp_path, monkeypatch):
    async with asgi_server(fusion_dir=str(tmp_path)) as c:
        old_id = (await c.post("/v2/fusions", json=graph("hist", 1))).json()["id"]
        real_remove = os.remove

        def remove(path, *args, **kwargs):
            if os.path.basename(path) == f"{old_id}.json":
                raise PermissionError(errno.EPERM, "Operation not permitted")
            return real_remove(path, *args, **kwargs)

        monkeypatch.setattr(os, "remove", remove)
        r = await c.post("/v2/fusions", json=graph("hist", 2), params={"replace": "true"})
        assert r.status_code == 507, r.text
        assert (await c.get("/v2/fusions/hist")).json()["id"] == old_id
        assert graphs_on_disk(str(tmp_path)) == {"hist": {old_id}}
        r = await c.delete("/v2/fusions/hist")
        assert r.status_code == 507 and "still registered" in r.json()["error"]
        assert await _count(c, "hist") == 1


# ---- crafted entries in the directory -----------------------------------------------------------
def _load_in_thread(reg: FusionRegistry, seconds: float = 10.0):
    """load_directory in a thread, joined with a generous bound (None if it did not finish)."""
    out = []
    t = threading.Thread(target=lambda: out.append(reg.load_directory()), daemon=True)
    t.start()
    t.join(seconds)
    return out[0] if out else None


def test_a_fifo_or_a_symlink_in_the_directory_is_skipped_with_a_warning(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="segfuse.server")
    (tmp_path / "hist.json").write_text(json.dumps(graph("hist", 1)))
    os.mkfifo(tmp_path / "fifo.json")
    outside = tmp_path.parent / f"{tmp_path.name}-outside.json"
    outside.write_text(json.dumps(graph("linked", 1)))
    (tmp_path / "linked.json").symlink_to(outside)
    reg = FusionRegistry(Limits(), directory=str(tmp_path))
    try:
        failed = _load_in_thread(reg)
    finally:  # a reader blocked on the FIFO (the bug) is released by a writer's open
        with contextlib.suppress(OSError):
            os.close(os.open(tmp_path / "fifo.json", os.O_WRONLY | os.O_NONBLOCK))
    assert failed == [], "load_directory did not finish (blocked on the FIFO?)" if failed is None else failed
    assert [f.name for f in reg.all()] == ["hist"]
    warned = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "fifo.json is not a regular file" in warned and "linked.json is a symbolic link" in warned


def test_a_symlink_planted_at_the_temporary_files_name_is_not_written_through(tmp_path, monkeypatch):
    """At the old predictable name and (forced) at the unguessable one: the victim stays intact."""
    victim = tmp_path.parent / f"{tmp_path.name}-victim"
    victim.write_text("precious")
    f = fusion("hist", 1)
    (tmp_path / f"{f.id}.json.{os.getpid()}.tmp").symlink_to(victim)
    names = iter(["0" * 32, "1" * 32])
    monkeypatch.setattr(fusion_repository.secrets, "token_hex", lambda n: next(names))
    (tmp_path / f".{f.id}.{'0' * 32}.tmp").symlink_to(victim)
    assert FusionRegistry(Limits(), directory=str(tmp_path)).register(f).created
    assert victim.read_text() == "precious"
    assert json.loads((tmp_path / f"{f.id}.json").read_text())["name"] == "hist"


def test_a_symlink_planted_at_the_graph_files_name_is_replaced_not_followed(tmp_path):
    victim = tmp_path.parent / f"{tmp_path.name}-victim"
    victim.write_text("precious")
    f = fusion("hist", 1)
    path = tmp_path / f"{f.id}.json"
    path.symlink_to(victim)
    assert FusionRegistry(Limits(), directory=str(tmp_path)).register(f).created
    assert victim.read_text() == "precious"
    assert not path.is_symlink() and json.loads(path.read_text())["name"] == "hist"
    restarted = FusionRegistry(Limits(), directory=str(tmp_path))
    assert restarted.load_directory() == [] and restarted.resolve("hist").id == f.id


def test_of_two_files_naming_one_fusion_the_newer_graph_is_registered(tmp_path):
    """What an interrupted replacement leaves: the newer file wins, the older is set aside (kept)."""
    old, new = tmp_path / "b-old.json", tmp_path / "a-new.json"
    old.write_text(json.dumps(graph("hist", 1)))
    new.write_text(json.dumps(graph("hist", 2)))
    os.utime(old, ns=(10**18, 10**18))
    os.utime(new, ns=(10**18 + 1, 10**18 + 1))
    for _ in range(2):  # and again: the set-aside file is not loaded
        reg = FusionRegistry(Limits(), directory=str(tmp_path))
        reg.load_directory()
        assert reg.resolve("hist").id == fusion("hist", 2).id
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-new.json", "b-old.json.superseded"]


@pytest.mark.anyio
async def test_concurrent_replacements_leave_one_graph_per_name_on_disk(asgi_server, tmp_path):
    async with asgi_server(fusion_dir=str(tmp_path)) as c:
        rs = await asyncio.gather(*(c.post("/v2/fusions", json=graph("hist", v), params={"replace": "true"})
                                    for v in range(1, 13)))
        assert all(r.status_code == 201 for r in rs), [r.text for r in rs if r.status_code != 201]
        final = (await c.get("/v2/fusions/hist")).json()["id"]
        assert graphs_on_disk(str(tmp_path)) == {"hist": {final}}
    async with asgi_server(fusion_dir=str(tmp_path)) as c:
        assert (await c.get("/v2/fusions/hist")).json()["id"] == final


@pytest.mark.anyio
async def test_health_answers_while_a_registration_waits_on_a_slow_disk(asgi_server, tmp_path, monkeypatch):
    """fsync waits until the test lets it go: health answers meanwhile, so the wait is not on the
    event loop (were it, health would answer only after fsync gave up waiting)."""
    entered, release, returned = threading.Event(), threading.Event(), threading.Event()
    real_fsync = os.fsync

    def slow_fsync(fd):
        entered.set()
        release.wait(scaled(60))
        returned.set()
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", slow_fsync)
    async with asgi_server(fusion_dir=str(tmp_path)) as c:
        registering = asyncio.ensure_future(c.post("/v2/fusions", json=graph("hist", 1)))
        try:
            assert await asyncio.to_thread(entered.wait, scaled(60)), "the registration never reached fsync"
            assert (await c.get("/v2/health/live")).status_code == 200
            assert not returned.is_set() and not registering.done()
        finally:
            release.set()
        assert (await registering).status_code == 201
