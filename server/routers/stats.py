"""Triton's statistics extension: GET /v2/models/stats, /v2/models/{m}/stats and
/v2/models/{m}/versions/{v}/stats (server/stats.py records them; the field mapping is there)."""

from __future__ import annotations

from fastapi import APIRouter

from ..deps import AnyState, errors
from ..protocol import MODEL_VERSION, check_version

router = APIRouter(tags=["statistics"])

STATS_EXAMPLE = {"model_stats": [{
    "name": "moe_problem_sizes", "version": "1", "last_inference": 1796000000000, "inference_count": 1,
    "execution_count": 1, "inference_stats": {k: {"count": 1, "ns": 1000} for k in (
        "success", "queue", "compute_input", "compute_infer", "compute_output")} | {
        k: {"count": 0, "ns": 0} for k in ("fail", "cache_hit", "cache_miss")},
    "response_stats": {}, "batch_stats": [], "memory_usage": []}]}
RESPONSES = {200: {"description": "Triton's statistics shape",
                   "content": {"application/json": {"example": STATS_EXAMPLE}}}}


@router.get("/v2/models/stats", summary="Statistics of every fusion", responses={**RESPONSES, **errors(401)})
async def all_stats(rt: AnyState) -> dict:
    return {"model_stats": [rt.stats.model_stats(f, MODEL_VERSION) for f in rt.fusions.all()]}


@router.get("/v2/models/{model}/stats", summary="Statistics of one fusion", responses={**RESPONSES, **errors(401, 404)})
async def model_stats(rt: AnyState, model: str) -> dict:
    return {"model_stats": [rt.stats.model_stats(rt.fusions.resolve(model), MODEL_VERSION)]}


@router.get("/v2/models/{model}/versions/{version}/stats", summary="Statistics of one fusion version",
            responses={**RESPONSES, **errors(401, 404)})
async def version_stats(rt: AnyState, model: str, version: str) -> dict:
    f = rt.fusions.resolve(model)
    check_version(f, version)
    return {"model_stats": [rt.stats.model_stats(f, version)]}
