"""Triton's model repository and model configuration extensions, mapped onto the fusion registry.

- POST /v2/repository/index: every registered fusion (READY, or UNAVAILABLE while the backend is
  not ready) and every fusion unloaded through this API (UNAVAILABLE, "unloaded");
- POST /v2/repository/models/{m}/load: without a body, 200 if the fusion is registered, or
  registers again a fusion unloaded through this API; with `parameters.config` (a segfuse.fusion/1
  graph, as a JSON string like tritonclient's `load_model(config=...)` sends it, or an object)
  registers that graph under the name {m}, replacing a different graph of that name (Triton's
  "load or reload"). Model files (`file:` parameters) are refused: a fusion has none. With a
  fusion repository (--fusion-dir) the graph's file is written before the fusion is registered, and
  the file of the graph it replaces (registered or unloaded) removed: 507 and nothing changed when
  the disk refuses;
- POST /v2/repository/models/{m}/unload: unregisters the fusion (runs in progress finish) and
  remembers it for a later load; `unload_dependents` is accepted (fusions have no dependents). Its
  repository file stays: a restart registers it again, as Triton's repository does;
- GET /v2/models/{m}[/versions/{v}]/config: a Triton-style model configuration of the fusion.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from segfuse.compiler import Fusion
from segfuse.compiler.errors import GraphError, Issue

from ..deps import AnyState, errors
from ..errors import ApiError, bad_request
from ..fusions import dims, fusion_info
from ..jsonio import loads
from ..protocol import MODEL_VERSION, check_version
from ..state import ServerState
from ..tensors import kserve_name
from .fusions import STORAGE_ERROR, json_body, register
from .links import fusion_links, link

router = APIRouter(tags=["model repository"])

TRITON_CONFIG_KEYS = {"backend", "platform", "input", "output", "max_batch_size", "instance_group"}


def _params(body: bytes) -> dict:
    """The `parameters` object of an optional JSON body {"parameters": {...}}; 400 on anything else."""
    doc = json_body(body) if body.strip() else {}
    if not isinstance(doc, dict):
        raise bad_request("the body must be a JSON object", ["body"])
    extra = sorted(set(doc) - {"parameters"})
    if extra:
        raise bad_request(f"unknown field(s) {', '.join(extra)}; the body is {{\"parameters\": {{...}}}}",
                          ["body", extra[0]])
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise bad_request("parameters must be an object", ["body", "parameters"])
    return params


def checked_params(params: dict, allowed: set[str]) -> dict:
    """`params` (a load or unload request's parameters), 400 for a key other than `allowed`."""
    for key in sorted(params):
        if key.startswith("file:"):
            raise bad_request(f"'{key}': a fusion has no model files; send the graph as parameters.config",
                              ["body", "parameters", key])
        if key not in allowed:
            raise bad_request(f"unknown parameter '{key}' (known: {', '.join(sorted(allowed))})",
                              ["body", "parameters", key])
    return params


def _entry(name: str, state: str, reason: str = "") -> dict:
    return {"name": name, "version": MODEL_VERSION, "state": state, "reason": reason}


@router.post("/v2/repository/index", summary="Fusions known to the server, with their state",
             responses=errors(400, 401))
async def repository_index(rt: AnyState, request: Request) -> list[dict]:
    body = await request.body()
    doc = json_body(body) if body.strip() else {}
    if not isinstance(doc, dict) or set(doc) - {"ready"} or not isinstance(doc.get("ready", False), bool):
        raise bad_request('the body is empty or {"ready": true|false}', ["body"])
    return repository_entries(rt, doc.get("ready", False))


def repository_entries(rt: ServerState, ready_only: bool) -> list[dict]:
    """The index's entries (only READY ones with `ready_only`); the gRPC front door answers with them too."""
    why = "" if rt.ready else (rt.init_error or "the backend is starting")
    out = [_entry(f.name, "READY" if rt.ready else "UNAVAILABLE", why) for f in rt.fusions.all()]
    if not ready_only:
        out += [_entry(name, "UNAVAILABLE", "unloaded") for name in sorted(rt.fusions.unloaded)]
    return [e for e in out if e["state"] == "READY"] if ready_only else out


def _graph_of(config: Any, model: str) -> dict:
    loc = ["body", "parameters", "config"]
    if isinstance(config, str):
        config = loads(config, loc, "parameters.config")
    if not isinstance(config, dict):
        raise bad_request("parameters.config must be a segfuse.fusion/1 graph (a JSON object)", loc)
    if "ops" not in config and TRITON_CONFIG_KEYS & set(config):
        raise bad_request("parameters.config looks like a Triton model configuration; segfuse loads a "
                          "segfuse.fusion/1 graph here (see docs/graph-format.md)", loc)
    name = config.setdefault("name", model)
    if name != model:
        raise bad_request(f"graph.name '{name}' differs from the model name of the URL, '{model}'",
                          [*loc, "name"])
    return config


@router.post("/v2/repository/models/{model}/load", summary="Load (register) a fusion",
             responses={200: {"links": fusion_links()}, **errors(400, 401, 404, 413), **STORAGE_ERROR})
async def load_model(rt: AnyState, model: str, request: Request) -> dict:
    return await load(rt, model, _params(await request.body()))


async def load(rt: ServerState, model: str, params: dict) -> dict:
    """Load `model` with the request's `parameters` (HTTP's and gRPC's RepositoryModelLoad)."""
    checked_params(params, {"config"})
    if "config" in params:
        graph = _graph_of(params["config"], model)
        try:
            fusion, reg = await register(rt, graph, replace=True)
        except GraphError as e:  # locations inside the request
            raise GraphError([Issue(("parameters", "config", *i.loc), i.msg) for i in e.issues]) from None
        return {**fusion_info(fusion), **reg}
    loaded = await rt.fusions.load_async(model)  # registers again a fusion unloaded through this API
    if loaded is None:
        msg = (f"fusion '{model}' not found; register it (POST /v2/fusions) or send its graph as "
               "parameters.config")
        raise ApiError(404, msg, [{"loc": ["path", "model"], "msg": msg}])
    fusion, reg = loaded
    rt.metrics.fusions.set(len(rt.fusions))
    return {**fusion_info(fusion), "created": reg.created, "replaced": reg.replaced}


@router.post("/v2/repository/models/{model}/unload", summary="Unload (unregister) a fusion",
             responses={200: {"links": {"Load": link("/v2/repository/models/{model}/load", "post", "load it again",
                                                     model="$response.body#/name")}},
                        **errors(400, 401, 404)})
async def unload_model(rt: AnyState, model: str, request: Request) -> dict:
    return await unload(rt, model, _params(await request.body()))


async def unload(rt: ServerState, model: str, params: dict) -> dict:
    """Unload `model` with the request's `parameters` (HTTP's and gRPC's RepositoryModelUnload)."""
    checked_params(params, {"unload_dependents"})
    if not isinstance(params.get("unload_dependents", False), bool):
        raise bad_request("unload_dependents must be true or false", ["body", "parameters", "unload_dependents"])
    f = await rt.fusions.unload_async(model)
    rt.stats.forget(f.id)
    rt.metrics.fusions.set(len(rt.fusions))
    return {**_entry(f.name, "UNAVAILABLE", "unloaded"), "id": f.id}


def model_config(fusion: Fusion) -> dict:
    def tensor(name: str, t) -> dict:
        return {"name": name, "data_type": "TYPE_" + kserve_name(t.dtype), "dims": dims(t.shape)}

    return {"name": fusion.name, "platform": "segfuse", "backend": "segfuse",
            "version_policy": {"latest": {"num_versions": 1}}, "max_batch_size": 0,
            "input": [{**tensor(n, t), "format": "FORMAT_NONE", "optional": False} for n, t in fusion.inputs],
            "output": [tensor(o.name, fusion.types[o.name]) for o in fusion.outputs],
            "parameters": {"segfuse_id": {"string_value": fusion.id},
                           "segfuse_symbols": {"string_value": ",".join(sorted(fusion.symbols))}}}


@router.get("/v2/models/{model}/config", summary="Triton-style model configuration", responses=errors(401, 404))
async def get_config(rt: AnyState, model: str) -> dict:
    return model_config(rt.fusions.resolve(model))


@router.get("/v2/models/{model}/versions/{version}/config", summary="Model configuration of a version",
            responses=errors(401, 404))
async def get_version_config(rt: AnyState, model: str, version: str) -> dict:
    f = rt.fusions.resolve(model)
    check_version(f, version)
    return model_config(f)
