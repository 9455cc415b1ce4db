"""Registry of validated fusions by id (content hash) and by name (one fusion per name)."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

from segfuse.compiler import Fusion, Limits

from .errors import conflict, not_found, too_large
from .jsonio import dumps, loads
from .protocol import check_name
from .tensors import kserve_name


@dataclass
class Registered:
    created: bool
    replaced: str | None = None


def graph_bytes(fusion: Fusion) -> int:
    """What a fusion counts against `max_fusion_bytes`: the size of its canonical JSON (the server
    holds several times that in parsed form, its plans and kernels aside)."""
    return len(dumps(fusion.to_json()))


class FusionRegistry:
    def __init__(self, limits: Limits, max_fusions: int = 1 << 30, max_fusion_bytes: int = 1 << 62,
                 directory: str | None = None):
        self.limits = limits
        # a fusion repository (Triton's model repository): graphs there are registered at start,
        # and registrations are kept there as <fusion id>.json (see load_directory)
        self.directory = directory
        self.max_fusions, self.max_fusion_bytes = max_fusions, max_fusion_bytes
        self._by_id: dict[str, Fusion] = {}
        self._by_name: dict[str, str] = {}
        self._bytes: dict[str, int] = {}  # fusion id -> graph_bytes, of registered and unloaded ones
        self._loading = False  # registering the directory's own files: nothing to write back
        self._files: dict[str, str] = {}  # fusion id -> the directory's file it was loaded from
        # Fusions unloaded through the model repository API (POST .../unload): kept by name so that
        # a plain POST .../load registers them again; listed by the repository index as unloaded.
        self.unloaded: dict[str, Fusion] = {}

    def parse(self, graph: dict) -> Fusion:
        """Validate a graph (GraphError -> 422); 413 when it is over the op or rank limit."""
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

    def register(self, fusion: Fusion, replace: bool = False) -> Registered:
        if fusion.id in self._by_id:
            return Registered(created=False)
        check_name(fusion.name)  # 422 for names that routes under /v2/models/ use
        gone = self.unloaded.pop(fusion.name, None)
        if gone is not None and gone.id not in self._by_id:
            self._bytes.pop(gone.id, None)
        old = self._by_name.get(fusion.name)
        if old is not None and not replace:
            raise conflict(f"the name '{fusion.name}' is taken by fusion {old}, a different graph; "
                           "pass ?replace=true to replace it", ["graph", "name"])
        self._check_room(fusion, old)
        if old is not None:
            del self._by_id[old]
            self._bytes.pop(old, None)
        self._by_id[fusion.id] = fusion
        self._by_name[fusion.name] = fusion.id
        self._bytes[fusion.id] = graph_bytes(fusion)
        self._persist(fusion, old)
        return Registered(created=True, replaced=old)

    # ---- the fusion repository directory ----------------------------------------------------
    def _file(self, fusion_id: str) -> str:
        """The file that holds a fusion: the one it was loaded from, else <id>.json (hex: safe)."""
        return self._files.get(fusion_id) or os.path.join(self.directory, f"{fusion_id}.json")

    def _persist(self, fusion: Fusion, replaced: str | None) -> None:
        if not self.directory:
            return
        path = self._file(fusion.id)
        if not os.path.exists(path) and not self._loading:
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "wb") as f:
                f.write(dumps(fusion.to_json()))
            os.replace(tmp, path)  # atomic: a crash never leaves half a graph
        if replaced is not None:
            self._forget_file(replaced)

    def _forget_file(self, fusion_id: str) -> None:
        if self.directory:
            with contextlib.suppress(FileNotFoundError):
                os.remove(self._file(fusion_id))
            self._files.pop(fusion_id, None)

    def load_directory(self) -> list[tuple[str, str]]:
        """Register every *.json graph of the directory, in name order; returns (file, error) for
        those that could not be (an invalid graph, a name another file's graph took)."""
        if not self.directory:
            return []
        os.makedirs(self.directory, exist_ok=True)
        failed = []
        self._loading = True
        try:
            for name in sorted(os.listdir(self.directory)):
                if not name.endswith(".json"):
                    continue
                path = os.path.join(self.directory, name)
                try:
                    with open(path, "rb") as f:
                        fusion = self.parse(loads(f.read(), ["file", name], f"fusion file {name}"))
                    if self.register(fusion).created:
                        self._files[fusion.id] = path
                except Exception as e:  # one bad file must not keep the others (or the server) down
                    failed.append((name, str(e)))
        finally:
            self._loading = False
        return failed

    def _check_room(self, fusion: Fusion, replaced: str | None) -> None:
        """413 when one more fusion (less the one it replaces) would pass the count or bytes limit."""
        held = {f.id for f in self.unloaded.values()} | set(self._by_id)
        held.discard(replaced)
        if len(held) + 1 > self.max_fusions:
            raise too_large(f"{len(held)} fusions are registered (or unloaded and kept), the limit is "
                            f"{self.max_fusions}; delete some first", ["graph"])
        n = graph_bytes(fusion)
        used = sum(self._bytes.get(k, 0) for k in held)
        if used + n > self.max_fusion_bytes:
            raise too_large(f"this graph's {n} bytes of JSON would bring the registered fusions to {used + n} "
                            f"bytes, over the limit of {self.max_fusion_bytes}", ["graph"])

    @property
    def bytes(self) -> int:
        """graph_bytes of every fusion held (registered, and unloaded ones kept for reload)."""
        held = {f.id for f in self.unloaded.values()} | set(self._by_id)
        return sum(self._bytes.get(k, 0) for k in held)

    def resolve(self, key: str) -> Fusion:
        """By id, else by name; 404 otherwise."""
        f = self._by_id.get(key)
        if f is None and key in self._by_name:
            f = self._by_id[self._by_name[key]]
        if f is None:
            raise not_found("fusion", key)
        return f

    def delete(self, key: str) -> Fusion:
        f = self.resolve(key)
        self._forget_file(f.id)
        del self._by_id[f.id]
        if self._by_name.get(f.name) == f.id:
            del self._by_name[f.name]
        if all(u.id != f.id for u in self.unloaded.values()):
            self._bytes.pop(f.id, None)
        return f

    def unload(self, key: str) -> Fusion:
        """Unregister, remembering the graph for a later `reload` (the repository API's unload);
        its file in the repository directory stays (a restart loads it again, as Triton does)."""
        directory, self.directory = self.directory, None
        try:
            f = self.delete(key)
        finally:
            self.directory = directory
        self.unloaded[f.name] = f
        self._bytes[f.id] = graph_bytes(f)
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
