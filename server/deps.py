"""FastAPI dependencies shared by the routers."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from .state import ServerState


async def get_state(request: Request) -> ServerState:
    return request.app.state.server_state


async def ready_state(rt: Annotated[ServerState, Depends(get_state)]) -> ServerState:
    """The server's state, or 503 until the backend is initialised."""
    rt.require_ready()
    return rt


AnyState = Annotated[ServerState, Depends(get_state)]
ReadyState = Annotated[ServerState, Depends(ready_state)]  # 503 until the backend is initialised

ERROR_RESPONSES = {
    status: {"model": "ErrorBody", "description": text} for status, text in {
        400: "invalid request: malformed, or wrong for the graph or the data (invalid graph, inputs, a failed run)",
        401: "missing or bad bearer token",
        403: "needs a server with a token (turning warning or error logging off)", 404: "unknown buffer or fusion",
        409: "name conflict", 413: "over a size limit",
        429: "run queue full (retry after Retry-After seconds)",
        501: "not supported by this server (CUDA shared memory without a GPU)", 503: "not ready"}.items()
}


def errors(*statuses: int) -> dict:
    from .models import ErrorBody

    return {s: {"model": ErrorBody, "description": ERROR_RESPONSES[s]["description"]} for s in statuses}
