"""What every gRPC call goes through, as every HTTP request goes through GuardMiddleware: the bearer
token (the `authorization` metadata, checked as HTTP checks its header), a request id for the log
lines, the error mapping, and the request counter.

Errors: the exception a call raised is answered as HTTP would answer it (server/errors.py
`error_parts`: its status and segfuse's message), and that status becomes the gRPC code Triton's
gRPC front end uses for the same failure: 400 -> INVALID_ARGUMENT, 404 -> NOT_FOUND, a full run
queue (429) or a server that is not ready (503) -> UNAVAILABLE, and so on (`GRPC_CODES`). The
error body (message and `details` with their `loc`) also travels as JSON in the trailing metadata
`segfuse-error`; a 429's Retry-After as `retry-after`.
"""

from __future__ import annotations

import functools
import json

import grpc

from ..errors import error_body, logged_error_parts
from ..logs import REQUEST_ID
from ..middleware import bearer_problem, request_id
from .messages import SERVICE

OPEN_METHODS = frozenset({"ServerLive", "ServerReady"})  # as HTTP's /v2/health/live and /ready

GRPC_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
              403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.NOT_FOUND,
              408: grpc.StatusCode.DEADLINE_EXCEEDED, 409: grpc.StatusCode.ALREADY_EXISTS,
              413: grpc.StatusCode.RESOURCE_EXHAUSTED, 429: grpc.StatusCode.UNAVAILABLE,
              500: grpc.StatusCode.INTERNAL, 501: grpc.StatusCode.UNIMPLEMENTED,
              503: grpc.StatusCode.UNAVAILABLE, 507: grpc.StatusCode.RESOURCE_EXHAUSTED}


class Unauthenticated(Exception):
    """A call without the server's bearer token (answered 401 -> UNAUTHENTICATED)."""


def grpc_code(status: int) -> grpc.StatusCode:
    return GRPC_CODES.get(status) or (grpc.StatusCode.INVALID_ARGUMENT if status < 500 else grpc.StatusCode.INTERNAL)


def _metadata(context) -> dict:
    return {k: v for k, v in (context.invocation_metadata() or ()) if isinstance(v, str)}


def _authorize(token: str | None, method: str, metadata: dict) -> None:
    if token and method not in OPEN_METHODS:
        msg = bearer_problem(metadata.get("authorization", ""), token)
        if msg is not None:
            raise Unauthenticated(msg)


def error_parts(e: BaseException, method: str, rid: str) -> tuple[int, dict, dict | None]:
    """(HTTP status, error body, headers) for an exception of a call, logged as HTTP logs one."""
    if isinstance(e, Unauthenticated):
        msg = str(e)
        return 401, error_body(msg, [{"loc": ["metadata", "authorization"], "msg": msg}]), None
    return logged_error_parts(e, {"method": "gRPC", "path": f"/{SERVICE}/{method}", "segfuse.request_id": rid})


# A client takes at most 8 KiB of trailing metadata by default (grpc.max_metadata_size), the status
# message included: a longer message is cut, and the error body keeps the details that fit.
MAX_MESSAGE_CHARS = 2048
MAX_BODY_CHARS = 4096


def abort_args(status: int, body: dict, headers: dict | None) -> tuple:
    """(code, message, trailing metadata) of an error answered with `status` and `body`."""
    message = body["error"]
    if len(message) > MAX_MESSAGE_CHARS:
        message = message[:MAX_MESSAGE_CHARS - 3] + "..."
    details = list(body.get("details") or [])
    text = json.dumps({"error": message, "details": details})
    while len(text) > MAX_BODY_CHARS and details:
        details.pop()
        text = json.dumps({"error": message, "details": details})
    trailers = [("segfuse-error", text)] if len(text) <= MAX_BODY_CHARS else []
    trailers += [(k.lower(), str(v)) for k, v in (headers or {}).items() if k.lower() == "retry-after"]
    return grpc_code(status), message, tuple(trailers)


def unary(fn):
    """A unary RPC of the servicer (self.state: the ServerState): auth, request id, errors, counting."""
    method = fn.__name__
    endpoint = f"/{SERVICE}/{method}"

    @functools.wraps(fn)
    async def call(self, request, context):
        metadata = _metadata(context)
        rid = request_id(metadata.get("x-request-id", "").encode("latin-1") or None)
        rid_context = REQUEST_ID.set(rid)
        status = 500  # (a call cancelled before its answer counts as GuardMiddleware counts one)
        try:
            _authorize(self.state.settings.token, method, metadata)
            response = await fn(self, request, context)
            status = 200
            return response
        except Exception as e:
            status, body, headers = error_parts(e, method, rid)
            code, message, trailers = abort_args(status, body, headers)
            await context.abort(code, message, trailing_metadata=trailers)
        finally:
            REQUEST_ID.reset(rid_context)
            self.state.metrics.request_done(endpoint, "POST", status)  # (gRPC calls are HTTP/2 POSTs)

    return call


def streaming(fn):
    """ModelStreamInfer: the call is authorized once; `fn(self, requests, context, rid)` yields
    its responses (an error of one request is that response's error_message, as Triton does)."""
    method = fn.__name__

    @functools.wraps(fn)
    async def call(self, requests, context):
        metadata = _metadata(context)
        rid = request_id(metadata.get("x-request-id", "").encode("latin-1") or None)
        try:
            _authorize(self.state.settings.token, method, metadata)
        except Unauthenticated as e:
            status, body, headers = error_parts(e, method, rid)
            self.state.metrics.request_done(f"/{SERVICE}/{method}", "POST", status)
            code, message, trailers = abort_args(status, body, headers)
            await context.abort(code, message, trailing_metadata=trailers)
        async for response in fn(self, requests, context, rid):
            yield response

    return call
