"""Registry of validated fusions by id (content hash) and by name (one fusion per name)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from dataclasses import dataclass

from segfuse.compiler import Fusion, Limits

from .errors import ApiError, conflict, not_found, too_large
from .fusion_repository import FusionRepository
from .jsonio import dumps, loads
from .protocol import check_name
from .tensors import kserve_name

log = logging.getLogger("segfuse.server")


@dataclass
class Registered:
    created: bool
    replaced: str | None = None


@dataclass
class _Change:
    """A registration, checked: what it replaces, and the repository files it keeps or removes."""
    fusion: Fusion
    data: bytes  # its canonical JSON: counted against max_fusion_bytes, and its file's content
    replaced: str | None  # the registered fusion of the same name it replaces
    superseded: list[str]  # ids it makes unreachable: `replaced`, an unloaded graph of the name
    keep: list[str]  # files that already hold the graph (an unloaded fusion loaded again)
    stale: list[str]  # files of the superseded graphs, removed once the graph is kept


def graph_bytes(fusion: Fusion) -> int:
    """What a fusion counts against `max_fusion_bytes`: the size of its canonical JSON (the server
    holds several times that in parsed form, its plans and kernels aside)."""
    return len(dumps(fusion.to_json()))


class FusionRegistry:
    """Fusions by id and by name, and the fusion repository that keeps them (`directory`).

    With a repository, every change is made on disk first and in memory only once the disk has it:
    a registration writes its graph's file (and removes the files of the graphs it supersedes), a
    delete removes the fusion's files; a disk failure answers 507 and changes nothing. Unloading
    keeps the file (the next start registers it again, as Triton's repository does). So the
    repository's graph files are exactly the registered and unloaded fusions, one graph per name.

    Changes run one at a time: the routes call the `*_async` methods (disk I/O off the event loop,
    memory changed on it); the synchronous ones are for a thread (the start's load_directory)
    and tests, never the event loop while a server runs."""

    def __init__(self, limits: Limits, max_fusions: int = 1 << 30, max_fusion_bytes: int = 1 << 62,
                 directory: str | None = None):
        self.limits = limits
        self.directory = directory
        self.repository = (FusionRepository(directory, min(4 * max_fusion_bytes + (1 << 20), 1 << 30))
                           if directory else None)
        self.max_fusions, self.max_fusion_bytes = max_fusions, max_fusion_bytes
        self._by_id: dict[str, Fusion] = {}
        self._by_name: dict[str, str] = {}
        self._bytes: dict[str, int] = {}  # fusion id -> graph_bytes, of every fusion held (registered, unloaded)
        self._total = 0  # sum of _bytes
        self._files: dict[str, list[str]] = {}  # fusion id -> its files in the repository
        # Fusions unloaded through the model repository API (POST .../unload): kept by name so that
        # a plain POST .../load registers them again; listed by the repository index as unloaded.
        self.unloaded: dict[str, Fusion] = {}
        self._mutex = threading.Lock()  # one change at a time, the start's loading thread included
        self._turn = asyncio.Lock()  # routes wait for the mutex here, not in threads

    def parse(self, graph: dict) -> Fusion:
        """Validate a graph (GraphError -> 400); 413 when it is over the op or rank limit."""
        ops = graph.get("ops") if isinstance(graph, dict) else None
        if isinstance(ops, list) and len(ops) > self.limits.max_ops:
            raise too_large(f"{len(ops)} ops exceed the limit of {self.limits.max_ops}", ["graph", "ops"])
        inputs = graph.get("inputs") if isinstance(graph, dict) else None
        for i, inp in enumerate(inputs if isinstance(inputs, list) else []):
            shape = inp.get("shape") if isinstance(inp, dict) else None
            if isinstance(shape, list) and len(shape) > self.limits.max_rank:
                raise too_large(f"rank {len(shape)} exceeds the limit of {self.limits.max_rank}",
                                ["graph", "inputs", i, "shape"])
        return Fusion.from_json(graph, self.limits)

    # ---- changes: synchronous (a thread, tests) --------------------------------------------
    def register(self, fusion: Fusion, replace: bool = False) -> Registered:
        with self._mutex:
            change = self._plan_register(fusion, replace)
            return Registered(False) if change is None else self._apply_register(change, self._store(change))

    def delete(self, key: str) -> Fusion:
        with self._mutex:
            f = self._known(key)
            self._remove_files(f)
            return self._apply_delete(f)

    def unload(self, key: str) -> Fusion:
        with self._mutex:
            return self._apply_unload(key)

    # ---- changes: from the event loop ---------------------------------------------------------
    async def register_async(self, fusion: Fusion, replace: bool = False) -> Registered:
        async def work():
            change = self._plan_register(fusion, replace)
            if change is None:
                return Registered(False)
            return self._apply_register(change, await asyncio.to_thread(self._store, change))
        return await self._change(work)

    async def load_async(self, name: str) -> tuple[Fusion, Registered] | None:
        """Register again the fusion unloaded under `name`; (fusion, created False) when it is
        registered; None when neither."""
        async def work():
            gone = self.unloaded.get(name)
            if gone is None:
                f = self._by_id.get(self._by_name.get(name, name))
                return None if f is None else (f, Registered(False))
            change = self._plan_register(gone, replace=True)
            return gone, self._apply_register(change, await asyncio.to_thread(self._store, change))
        return await self._change(work)

    async def delete_async(self, key: str) -> Fusion:
        async def work():
            f = self._known(key)
            await asyncio.to_thread(self._remove_files, f)
            return self._apply_delete(f)
        return await self._change(work)

    async def unload_async(self, key: str) -> Fusion:
        async def work():
            return self._apply_unload(key)
        return await self._change(work)

    async def _change(self, work):
        """Run `work` alone among changes, and to its end even if the request is cancelled (its
        disk step and its memory step are one change)."""
        task = asyncio.ensure_future(self._exclusive(work))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved: not logged
            raise

    async def _exclusive(self, work):
        async with self._turn:
            if not self._mutex.acquire(blocking=False):  # held only while the start loads the directory
                await asyncio.to_thread(self._mutex.acquire)
            try:
                return await work()
            finally:
                self._mutex.release()

    # ---- the steps of a change (the mutex held) ---------------------------------------------
    def _plan_register(self, fusion: Fusion, replace: bool) -> _Change | None:
        """Check a registration (400, 409, 413); None when the graph is registered already."""
        if fusion.id in self._by_id:
            return None
        check_name(fusion.name)  # 400 for names that routes under /v2/models/ use
        old = self._by_name.get(fusion.name)
        if old is not None and not replace:
            raise conflict(f"the name '{fusion.name}' is taken by fusion {old}, a different graph; "
                           "pass ?replace=true to replace it", ["graph", "name"])
        gone = self.unloaded.get(fusion.name)
        superseded = [i for i in (old, gone and gone.id) if i is not None and i != fusion.id]
        data = dumps(fusion.to_json())
        self._check_room(fusion, len(data), superseded)
        return _Change(fusion, data, old, superseded, keep=list(self._files.get(fusion.id, ())),
                       stale=[p for i in superseded for p in self._files.get(i, ())])

    def _store(self, change: _Change) -> list[str]:
        """The disk step of a registration: the graph's file (written unless one holds it already),
        then the superseded graphs' files removed; 507, and the disk as it was, when that fails.
        Returns the graph's files."""
        repo = self.repository
        if repo is None:
            return []
        written = None
        try:
            files = [p for p in change.keep if repo.is_file(p)]
            if not files:
                written = repo.write(change.fusion.id, change.data, newer_than=change.stale)
                files = [written]
            for p in change.stale:
                repo.remove(p)
        except OSError as e:
            if written is not None:
                try:
                    repo.remove(written)
                except OSError as again:  # the next start would register this graph: say so
                    log.error("fusion repository %s: could not remove %s after a failed registration: %s",
                              self.directory, written, again)
            raise self._storage_error(e, f"keep fusion '{change.fusion.name}'", "it was not registered") from None
        return files

    def _apply_register(self, change: _Change, files: list[str]) -> Registered:
        f = change.fusion
        for i in change.superseded:
            self._by_id.pop(i, None)
            self._release(i)
        self.unloaded.pop(f.name, None)
        self._by_id[f.id] = f
        self._by_name[f.name] = f.id
        self._release(f.id)
        self._bytes[f.id] = len(change.data)
        self._total += len(change.data)
        if files:
            self._files[f.id] = files
        return Registered(created=True, replaced=change.replaced)

    def _known(self, key: str) -> Fusion:
        """A registered fusion (by id, else name), else an unloaded one (by name, else id); 404."""
        with contextlib.suppress(ApiError):
            return self.resolve(key)
        f = self.unloaded.get(key) or next((u for u in self.unloaded.values() if u.id == key), None)
        if f is None:
            raise not_found("fusion", key)
        return f

    def _remove_files(self, fusion: Fusion) -> None:
        if self.repository is None:
            return
        files = self._files.get(fusion.id, [])
        try:
            while files:
                self.repository.remove(files[0])
                files.pop(0)
        except OSError as e:
            raise self._storage_error(e, f"delete the file of fusion '{fusion.name}'",
                                      "the fusion is still registered") from None

    def _apply_delete(self, f: Fusion) -> Fusion:
        if self._by_id.get(f.id) is f:
            del self._by_id[f.id]
            if self._by_name.get(f.name) == f.id:
                del self._by_name[f.name]
        elif self.unloaded.get(f.name) is f:
            del self.unloaded[f.name]
        self._release(f.id)
        return f

    def _apply_unload(self, key: str) -> Fusion:
        """Unregister, remembering the graph for a later load (the repository API's unload); its
        files stay (a restart registers it again, as Triton's repository does)."""
        f = self.resolve(key)
        del self._by_id[f.id]
        if self._by_name.get(f.name) == f.id:
            del self._by_name[f.name]
        self.unloaded[f.name] = f
        return f

    def _release(self, fusion_id: str) -> None:
        """Forget a fusion's bytes and files (it is neither registered nor unloaded any more)."""
        self._total -= self._bytes.pop(fusion_id, 0)
        self._files.pop(fusion_id, None)

    def _storage_error(self, e: OSError, what: str, outcome: str) -> ApiError:
        log.error("fusion repository %s: could not %s: %s", self.directory, what, e)
        msg = f"the fusion repository could not {what} ({e.strerror or type(e).__name__}): {outcome}"
        return ApiError(507, msg, [{"loc": ["server", "fusion_dir"], "msg": msg}])

    # ---- the fusion repository at start ---------------------------------------------------------
    def load_directory(self) -> list[tuple[str, str]]:
        """Register every *.json graph of the directory; returns (file, error) for those that could
        not be (an invalid graph, a graph over a limit). Of files whose graphs share a name, the
        newest file's graph is registered and the others are renamed to <file>.superseded (what an
        interrupted replacement leaves). Entries that are not regular files are skipped (logged)."""
        if self.repository is None:
            return []
        found, _ = self.repository.scan()
        failed, parsed = [], []
        for gf in found:
            try:
                parsed.append((self.parse(loads(gf.data, ["file", gf.name], f"fusion file {gf.name}")), gf))
            except Exception as e:  # one bad file must not keep the others (or the server) down
                failed.append((gf.name, str(e)))
        newest = {f.name: f.id for f, gf in sorted(parsed, key=lambda t: (t[1].mtime_ns, t[1].name))}
        for fusion, gf in parsed:
            try:
                if newest[fusion.name] != fusion.id:
                    aside = os.path.basename(self.repository.set_aside(gf.path))
                    raise conflict(f"a newer file holds another graph named '{fusion.name}' (fusion "
                                   f"{newest[fusion.name]}); this one was renamed to {aside}")
                with self._mutex:
                    self._load_file(fusion, gf.path)
            except Exception as e:
                failed.append((gf.name, str(e)))
        return failed

    def _load_file(self, fusion: Fusion, path: str) -> None:
        if fusion.id in self._by_id:  # the same graph in another file: both are its files
            self._files.setdefault(fusion.id, []).append(path)
            return
        change = self._plan_register(fusion, replace=False)
        change.keep = [path]
        self._apply_register(change, self._store(change))

    def _check_room(self, fusion: Fusion, size: int, freed: list[str]) -> None:
        """413 when one more fusion (less those it supersedes) would pass the count or bytes limit."""
        held = len(self._bytes) - len(freed) - (fusion.id in self._bytes)
        if held + 1 > self.max_fusions:
            raise too_large(f"{held} fusions are registered (or unloaded and kept), the limit is "
                            f"{self.max_fusions}; delete some first", ["graph"])
        used = self._total - sum(self._bytes[i] for i in freed) - self._bytes.get(fusion.id, 0)
        if used + size > self.max_fusion_bytes:
            raise too_large(f"this graph's {size} bytes of JSON would bring the registered fusions to "
                            f"{used + size} bytes, over the limit of {self.max_fusion_bytes}", ["graph"])

    # ---- reading ------------------------------------------------------------------------------
    @property
    def bytes(self) -> int:
        """graph_bytes of every fusion held (registered, and unloaded ones kept for reload)."""
        return self._total

    def resolve(self, key: str) -> Fusion:
        """By id, else by name; 404 otherwise."""
        f = self._by_id.get(key)
        if f is None:
            f = self._by_id.get(self._by_name.get(key, ""))
        if f is None:
            raise not_found("fusion", key)
        return f

    def has_id(self, fusion_id: str) -> bool:
        return fusion_id in self._by_id

    def all(self) -> list[Fusion]:
        return sorted(self._by_id.values(), key=lambda f: (f.name, f.id))

    def __len__(self) -> int:
        return len(self._by_id)


def dims(shape) -> list[int]:
    """Concrete sizes as ints, symbolic ones as -1 (KServe's variable dimension)."""
    return [d if isinstance(d, int) else -1 for d in shape]


def tensor_meta(fusion: Fusion) -> tuple[list[dict], list[dict]]:
    ins = [{"name": n, "datatype": kserve_name(t.dtype), "shape": dims(t.shape)} for n, t in fusion.inputs]
    outs = [{"name": o.name, "datatype": kserve_name(fusion.types[o.name].dtype),
             "shape": dims(fusion.types[o.name].shape)} for o in fusion.outputs]
    return ins, outs


def fusion_info(fusion: Fusion) -> dict:
    ins, outs = tensor_meta(fusion)
    return {"id": fusion.id, "name": fusion.name, "ops": len(fusion.nodes), "inputs": ins, "outputs": outs,
            "symbols": sorted(fusion.symbols)}
