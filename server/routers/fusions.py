"""Fusion registry: register (idempotent by content hash), list, inspect, delete, plan."""

from __future__ import annotations

import re
from typing import Any

from fastapi import APIRouter, Query, Request, Response
from segfuse.compiler import Fusion

from ..deps import AnyState, ReadyState, errors
from ..errors import ApiError, bad_request
from ..fusions import fusion_info
from ..jsonio import loads
from ..models import (
    Deleted,
    ErrorBody,
    FusionDetail,
    FusionInfo,
    FusionList,
    FusionRegistered,
    KernelSource,
    PlanResponse,
)
from ..state import ServerState
from ..tensors import size_from_digits
from .links import fusion_links

router = APIRouter(prefix="/v2/fusions", tags=["fusions"])

MOE_EXAMPLE = {
    "format": "segfuse.fusion/1", "name": "moe_problem_sizes",
    "inputs": [{"name": "topk_ids", "dtype": "int64", "shape": ["T", "K"]}],
    "ops": [{"op": "reshape", "out": "flat", "inputs": ["topk_ids"], "shape": [-1]},
            {"op": "full", "out": "zeros", "shape": [16], "value": 0, "dtype": "int64"},
            {"op": "full_like", "out": "ones", "inputs": ["flat"], "value": 1},
            {"op": "scatter", "out": "counts", "inputs": ["zeros", "flat", "ones"], "dim": 0, "reduce": "add"}],
    "outputs": ["counts"]}

# The body is read by hand (so `curl -d @graph.json`, sent as form data, works too); documented here.
GRAPH_BODY_DOC = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": {"$ref": "#/components/schemas/GraphSpec"},
    "examples": {"moe_problem_sizes": {"summary": "MoE problem sizes", "value": MOE_EXAMPLE}}}}}}


# With a fusion repository (--fusion-dir), a change the disk refuses (full, read-only) changes nothing.
STORAGE_ERROR = {507: {"model": ErrorBody, "description": "the fusion repository could not keep the change "
                                                          "(disk full or not writable); nothing was changed"}}


def json_body(body: bytes) -> Any:
    return loads(body)


async def register(rt: ServerState, graph: Any, replace: bool) -> tuple[Fusion, dict]:
    if not isinstance(graph, dict):
        raise bad_request("a graph must be a JSON object", ["body"])
    fusion = await rt.validate(graph)  # its own threads, under the work budget (server/executors.py)
    reg = await rt.fusions.register_async(fusion, replace)  # 507 (nothing registered) if the repository fails
    rt.metrics.fusions.set(len(rt.fusions))
    return fusion, {"created": reg.created, "replaced": reg.replaced}


@router.post("", response_model=FusionRegistered, summary="Register a fusion graph", openapi_extra=GRAPH_BODY_DOC,
             responses={200: {"links": fusion_links()},
                        201: {"model": FusionRegistered, "description": "registered", "links": fusion_links()},
                        **errors(400, 401, 409, 413), **STORAGE_ERROR})
async def register_fusion(rt: AnyState, request: Request, response: Response,
                          replace: bool = Query(False, description="replace a different graph with the same name"),
                          ) -> FusionRegistered:
    fusion, reg = await register(rt, json_body(await request.body()), replace)
    response.status_code = 201 if reg["created"] else 200
    return FusionRegistered(**fusion_info(fusion), **reg)


@router.get("", response_model=FusionList, summary="List fusions", responses=errors(401))
async def list_fusions(rt: AnyState) -> FusionList:
    return FusionList(fusions=[FusionInfo(**fusion_info(f)) for f in rt.fusions.all()])


@router.get("/{key}", response_model=FusionDetail, summary="A fusion (by id or name) with its graph",
            responses=errors(401, 404))
async def get_fusion(rt: AnyState, key: str) -> FusionDetail:
    f = rt.fusions.resolve(key)
    return FusionDetail(**fusion_info(f), graph=f.to_json())


@router.delete("/{key}", response_model=Deleted, summary="Unregister a fusion (runs in progress finish)",
               responses={**errors(401, 404), **STORAGE_ERROR})
async def delete_fusion(rt: AnyState, key: str) -> Deleted:
    f = await rt.fusions.delete_async(key)
    rt.metrics.fusions.set(len(rt.fusions))
    return Deleted(deleted=f.id)


_BINDING = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(\d+)\s*$")


def parse_symbols(text: str | None, fusion: Fusion) -> dict[str, int]:
    env: dict[str, int] = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        m = _BINDING.match(part)
        if not m:
            raise bad_request(f"shape binding '{part.strip()}' must look like T=4096", ["query", "shape"])
        env[m.group(1)] = size_from_digits(m.group(2), f"shape binding {m.group(1)}=", ["query", "shape"])
    unknown = sorted(set(env) - set(fusion.symbols))
    if unknown:
        raise bad_request(f"unknown symbol(s) {', '.join(unknown)}; fusion '{fusion.name}' has "
                            f"{', '.join(sorted(fusion.symbols)) or 'none'}", ["query", "shape"])
    missing = sorted(set(fusion.symbols) - set(env))
    if missing:
        raise bad_request(f"give a size for {', '.join(missing)}, e.g. ?shape="
                            + ",".join(f"{s}=1024" for s in sorted(fusion.symbols)), ["query", "shape"])
    return env


NO_KERNEL = {"view", "copy", "library"}


def kernel_sources(engine, fusion: Fusion, shapes: dict, plan, plan_dict: dict) -> list[KernelSource]:
    """Per segment of the plan, the CUDA modules a run of contiguous inputs of these shapes
    compiles, as the engine's backend prepares them (`Engine.kernel_modules`: with the aliases,
    strides and splits of a real run; a CPU engine answers for the code generator's nominal GPU).
    A segment split into several launches lists its modules' sources one after another."""
    modules: dict[int, list] = {}
    try:
        prepared = engine.kernel_modules(fusion, shapes, plan)
    except Exception as e:  # a codegen gap a run would hit too: the plan is still useful
        failed = f"{type(e).__name__}: {e}"
        prepared = []
    else:
        failed = None
    for seg_id, module in prepared:
        modules.setdefault(seg_id, []).append(module)
    out = []
    for seg_dict in plan_dict.get("segments", []):
        kind = str(seg_dict.get("kind"))
        seg_id = int(seg_dict.get("id", len(out)))
        entry = KernelSource(segment=seg_id, kind=kind)
        mods = modules.get(seg_id)
        if mods:
            entry.source = "\n".join(m.source for m in mods)
            entry.kernels = [launch.kernel for m in mods for launch in m.launches]
        elif failed:
            entry.unavailable = failed
        elif kind in NO_KERNEL:
            entry.unavailable = f"a {kind} segment launches no generated kernel"
        else:
            entry.unavailable = "no generated kernel: a library routine or the host runs this segment"
        out.append(entry)
    return out


@router.get("/{key}/plan", response_model=PlanResponse, summary="Segments, reasons and kernel sources",
            responses={**errors(400, 401, 404, 503), 501: {"description": "the engine has no planner"}})
async def get_plan(rt: ReadyState, key: str,
                   shape: str | None = Query(None, description="symbol sizes, e.g. T=4096,K=8"),
                   source: bool = Query(True, description="include the generated CUDA source of each kernel"),
                   ) -> PlanResponse:
    fusion = rt.fusions.resolve(key)
    env = parse_symbols(shape, fusion)
    shapes = fusion.input_shapes(env)
    fusion.bind(shapes)  # BindError (400) for sizes the graph cannot take
    engine = rt.engine
    if not hasattr(engine, "plan"):
        raise ApiError(501, f"the {rt.backend_name} engine of this build has no planner (Engine.plan); "
                            "runs work, plans are not available", [{"loc": [], "msg": "no planner"}])
    # Planning (and generating sources) is work like a run: admitted and counted with the runs
    # (429 when the queue is full), so plan requests cannot pile up behind the limit.
    rt.executor.admit()
    try:
        plan = await rt.executor.call(engine.plan, fusion, shapes)
        plan_dict = plan.to_dict() if hasattr(plan, "to_dict") else dict(plan)
        kernels = await rt.executor.call(kernel_sources, engine, fusion, shapes, plan, plan_dict) if source else []
    finally:
        rt.executor.release()
    return PlanResponse(fusion_id=fusion.id, symbols=env, shapes={k: list(v) for k, v in shapes.items()},
                        plan=plan_dict, kernels=kernels)
