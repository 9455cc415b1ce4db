"""FastAPI dependencies shared by the routers."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from .runtime import Runtime


async def get_runtime(request: Request) -> Runtime:
    return request.app.state.runtime


async def ready_runtime(rt: Annotated[Runtime, Depends(get_runtime)]) -> Runtime:
    """The runtime, or 503 until the backend is initialised."""
    rt.require_ready()
    return rt


AnyRuntime = Annotated[Runtime, Depends(get_runtime)]
ReadyRuntime = Annotated[Runtime, Depends(ready_runtime)]  # 503 until the backend is initialised

ERROR_RESPONSES = {
    status: {"model": "ErrorBody", "description": text} for status, text in {
        400: "malformed request", 401: "missing or bad bearer token",
        403: "needs a server with a token (turning warning or error logging off)", 404: "unknown buffer or fusion",
        409: "name conflict", 413: "over a size limit", 422: "semantic error (graph, inputs, run)",
        429: "run queue full (retry after Retry-After seconds)",
        501: "not supported by this server (CUDA shared memory without a GPU)", 503: "not ready"}.items()
}


def errors(*statuses: int) -> dict:
    from .models import ErrorBody

    return {s: {"model": ErrorBody, "description": ERROR_RESPONSES[s]["description"]} for s in statuses}
