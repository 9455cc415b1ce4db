"""KServe v2 health and server metadata."""

from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse

from ..deps import AnyRuntime, errors
from ..errors import error_body
from ..models import ServerMetadata

router = APIRouter(tags=["health"])

EXTENSIONS = ["binary_tensor_data", "segfuse_buffers", "segfuse_fusions", "segfuse_plan", "segfuse_execute"]


def live_status() -> tuple[int, dict | None]:
    """(status, JSON body or None for an empty one) of /v2/health/live; the fast lane answers too."""
    return 200, None


def ready_status(rt) -> tuple[int, dict | None]:
    if rt.ready:
        return 200, None
    why = rt.init_error or "the backend is starting"
    return 503, error_body(f"not ready: {why}", [{"loc": [], "msg": why}])


def _answer(status: int, body: dict | None) -> Response:
    return Response(status_code=status) if body is None else JSONResponse(body, status_code=status)


@router.get("/v2/health/live", summary="The process is up", responses={200: {"description": "live"}})
async def live() -> Response:
    return _answer(*live_status())


@router.get("/v2/health/ready", summary="The backend is initialised", responses={
    200: {"description": "ready"}, **errors(503)})
async def ready(rt: AnyRuntime) -> Response:
    return _answer(*ready_status(rt))


@router.get("/v2", response_model=ServerMetadata, summary="Server metadata", responses=errors(401))
async def server_metadata(rt: AnyRuntime) -> ServerMetadata:
    from .. import __version__

    return ServerMetadata(name="segfuse", version=__version__, extensions=EXTENSIONS,
                          backend=rt.backend_name, device=rt.device)
