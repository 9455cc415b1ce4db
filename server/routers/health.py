"""KServe v2 health and server metadata."""

from __future__ import annotations

from fastapi import APIRouter, Response

from ..deps import AnyRuntime, errors
from ..errors import error_response
from ..models import ServerMetadata

router = APIRouter(tags=["health"])

EXTENSIONS = ["binary_tensor_data", "segfuse_buffers", "segfuse_fusions", "segfuse_plan", "segfuse_execute",
              "system_shared_memory", "cuda_shared_memory"]


@router.get("/v2/health/live", summary="The process is up", responses={200: {"description": "live"}})
async def live() -> Response:
    return Response(status_code=200)


@router.get("/v2/health/ready", summary="The backend is initialised", responses={
    200: {"description": "ready"}, **errors(503)})
async def ready(rt: AnyRuntime) -> Response:
    if rt.ready:
        return Response(status_code=200)
    why = rt.init_error or "the backend is starting"
    return error_response(503, f"not ready: {why}", [{"loc": [], "msg": why}])


@router.get("/v2", response_model=ServerMetadata, summary="Server metadata", responses=errors(401))
async def server_metadata(rt: AnyRuntime) -> ServerMetadata:
    from .. import __version__

    return ServerMetadata(name="segfuse", version=__version__, extensions=EXTENSIONS,
                          backend=rt.backend_name, device=rt.device)
