"""KServe v2 health and server metadata."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse

from ..deps import AnyState, errors
from ..errors import error_body
from ..models import ServerMetadata
from ..version import __version__

router = APIRouter(tags=["health"])

# Health checks stay open when a token is set (GuardMiddleware's OPEN_PATHS): say so over the
# document's global security requirement.
OPEN = {"security": []}

# Triton's extension names for what exists here, in Triton 2.51's order, then segfuse's own. Not
# listed: `classification` (class_count is refused, 400) and `sequence` (no sequence batcher: sequence_id
# is accepted and ignored, as Triton does for a model without one). `schedule_policy` is its request
# parameters: `timeout` is honoured, `priority` accepted with one priority level (one run queue).
EXTENSIONS = ["model_repository", "model_repository(unload_dependents)", "schedule_policy", "model_configuration",
              "system_shared_memory", "cuda_shared_memory", "binary_tensor_data", "parameters", "statistics",
              "trace", "logging", "segfuse_buffers", "segfuse_fusions", "segfuse_plan", "segfuse_execute"]


def live_status() -> tuple[int, dict]:
    """(status, JSON body) of /v2/health/live; the fast lane (server/fastlane.py) answers with it too.
    KServe's REST client reads the body; Triton's reads the status."""
    return 200, {"live": True}


def ready_status(rt) -> tuple[int, dict]:
    if rt.ready:
        return 200, {"ready": True}
    why = rt.init_error or "the backend is starting"
    return 503, error_body(f"not ready: {why}", [{"loc": [], "msg": why}])


@router.get("/v2/health/live", summary="The process is up", openapi_extra=OPEN,
            responses={200: {"description": "live", "content": {"application/json": {"example": {"live": True}}}}})
async def live() -> Response:
    status, body = live_status()
    return JSONResponse(body, status_code=status)


@router.get("/v2/health/ready", summary="The backend is initialised", openapi_extra=OPEN, responses={
    200: {"description": "ready", "content": {"application/json": {"example": {"ready": True}}}}, **errors(503)})
async def ready(rt: AnyState) -> Response:
    status, body = ready_status(rt)
    return JSONResponse(body, status_code=status)


@router.get("/v2", response_model=ServerMetadata, summary="Server metadata", responses=errors(401))
async def server_metadata(rt: AnyState) -> ServerMetadata:
    return ServerMetadata(name="segfuse", version=__version__, extensions=EXTENSIONS,
                          backend=rt.backend_name, device=rt.device, shard=rt.shard, gpu=rt.gpu)
