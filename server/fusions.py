"""Registry of validated fusions by id (content hash) and by name (one fusion per name)."""

from __future__ import annotations

from dataclasses import dataclass

from segfuse.compiler import Fusion, Limits

from .errors import conflict, not_found, too_large
from .protocol import check_name
from .tensors import kserve_name


@dataclass
class Registered:
    created: bool
    replaced: str | None = None


class FusionRegistry:
    def __init__(self, limits: Limits):
        self.limits = limits
        self._by_id: dict[str, Fusion] = {}
        self._by_name: dict[str, str] = {}
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
        self.unloaded.pop(fusion.name, None)
        old = self._by_name.get(fusion.name)
        if old is not None and not replace:
            raise conflict(f"the name '{fusion.name}' is taken by fusion {old}, a different graph; "
                           "pass ?replace=true to replace it", ["graph", "name"])
        if old is not None:
            del self._by_id[old]
        self._by_id[fusion.id] = fusion
        self._by_name[fusion.name] = fusion.id
        return Registered(created=True, replaced=old)

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
        del self._by_id[f.id]
        if self._by_name.get(f.name) == f.id:
            del self._by_name[f.name]
        return f

    def unload(self, key: str) -> Fusion:
        """Unregister, remembering the graph for a later `reload` (the repository API's unload)."""
        f = self.delete(key)
        self.unloaded[f.name] = f
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
