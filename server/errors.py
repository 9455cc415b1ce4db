"""One error body for every failure: {"error": "<message>", "details": [{"loc": [...], "msg": "..."}]}.

Every invalid request is a 400, as Triton answers: a malformed one (bad JSON, a field of the wrong
type) and one that is well formed but disagrees with the graph or the data (compiler errors); the
message and `loc` say which. `ApiError` carries any other status. A 500 means a bug in segfuse,
never bad input.
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from segfuse.compiler.errors import BindError, GraphError, RunError, SegfuseError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

log = logging.getLogger("segfuse.server")


class ApiError(Exception):
    def __init__(self, status: int, message: str, details: list[dict] | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.details = details or []
        self.headers = headers


def bad_request(msg: str, loc: tuple | list = ()) -> ApiError:
    return ApiError(400, msg, [{"loc": list(loc), "msg": msg}])


def not_found(what: str, name: str, loc: tuple | list = ()) -> ApiError:
    msg = f"{what} '{name}' not found"
    return ApiError(404, msg, [{"loc": list(loc), "msg": msg}])


def conflict(msg: str, loc: tuple | list = ()) -> ApiError:
    return ApiError(409, msg, [{"loc": list(loc), "msg": msg}])


def too_large(msg: str, loc: tuple | list = ()) -> ApiError:
    return ApiError(413, msg, [{"loc": list(loc), "msg": msg}])


def error_body(message: str, details: list[dict] | None = None) -> dict:
    return {"error": message, "details": details or []}


def error_response(status: int, message: str, details: list[dict] | None = None,
                   headers: dict | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, details), status_code=status, headers=headers)


_SEGFUSE_TITLES = {GraphError: "invalid graph", BindError: "inputs disagree with the graph",
                   RunError: "run failed"}


def segfuse_message(e: SegfuseError) -> str:
    title = next((t for cls, t in _SEGFUSE_TITLES.items() if isinstance(e, cls)), "error")
    return f"{title}: {e}"


def error_parts(e: BaseException, where: str = "") -> tuple[int, dict, dict | None]:
    """(status, body, headers) for any exception a request raised: the one mapping both the
    FastAPI exception handlers and the fast lane (server/fastlane.py) answer with."""
    if isinstance(e, ApiError):
        return e.status, error_body(e.message, e.details), e.headers
    if isinstance(e, SegfuseError):  # the graph, the inputs or the data refused: an invalid request
        return 400, error_body(segfuse_message(e), e.details()), None
    if isinstance(e, RequestValidationError):
        # The request does not have the documented structure (bad JSON, a field of the wrong type,
        # a malformed path or query parameter).
        details = [{"loc": list(err.get("loc", ())), "msg": err.get("msg", "")} for err in e.errors()]
        first = details[0] if details else {"loc": [], "msg": "invalid request"}
        loc = ".".join(str(p) for p in first["loc"])
        msg = f"invalid request: {loc}: {first['msg']}" if loc else f"invalid request: {first['msg']}"
        return 400, error_body(msg, details), None
    if isinstance(e, StarletteHTTPException):
        msg = e.detail if isinstance(e.detail, str) else "error"
        return e.status_code, error_body(msg, getattr(e, "details", None) or []), getattr(e, "headers", None)
    if isinstance(e, MemoryError):
        # The request asked for more memory than the host had free: too large for this server now,
        # not a bug (a 5xx would say the server is broken; a retry with less data can succeed).
        log.warning("out of memory on %s", where)
        msg = "the server has not enough memory for this request; send less data or smaller shapes"
        return 413, error_body(msg, [{"loc": [], "msg": msg}]), None
    if isinstance(e, ClientDisconnect):
        msg = "the client went away before sending the whole body"
        return 400, error_body(msg, [{"loc": ["body"], "msg": msg}]), None
    log.error("internal error on %s", where, exc_info=e)
    return 500, error_body(f"internal error: {type(e).__name__}: {e}"), None


def logged_error_parts(e: BaseException, scope) -> tuple[int, dict, dict | None]:
    """error_parts, with the failure logged at INFO (5xx at ERROR, with the traceback) under the
    request's id (GuardMiddleware's X-Request-ID), so an operator can find what a client saw."""
    where = f"{scope.get('method', '')} {scope.get('path', '')} [{scope.get('segfuse.request_id', '-')}]"
    status, body, headers = error_parts(e, where)
    if status < 500:
        log.info("%s -> %d: %s", where, status, body.get("error", ""))
    return status, body, headers


METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def allowed_methods(app, scope) -> str:
    """Every method some route serves at the request's path. Starlette's 405 names only the
    methods of the first route whose path matches, where segfuse's routers serve GET and POST of
    one path in two routes (RFC 9110: Allow lists all of the resource's methods). Asked through
    Starlette's own matching, which sees into included routers."""
    from starlette.routing import Match

    def served(method: str) -> bool:
        probe = {**scope, "method": method}
        return any(route.matches(probe)[0] is Match.FULL for route in app.router.routes)

    return ", ".join(m for m in METHODS if served(m))


def install(app: FastAPI) -> None:
    async def handle(request: Request, e: Exception):
        status, body, headers = logged_error_parts(e, request.scope)
        if status == 405:
            headers = {**(headers or {}), "Allow": allowed_methods(app, request.scope)}
        return JSONResponse(body, status_code=status, headers=headers)

    # Exception's handler is ServerErrorMiddleware's, which answers and then re-raises (uvicorn then
    # closes the connection): GuardMiddleware answers any other exception first (server/middleware.py).
    for cls in (ApiError, SegfuseError, RequestValidationError, StarletteHTTPException, MemoryError, Exception):
        app.add_exception_handler(cls, handle)
