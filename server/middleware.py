"""ASGI middleware: bearer-token auth, the request body limit, and request metrics.

Auth and the body limit are middleware rather than route dependencies so they cover every path
(docs, metrics, unknown paths) and refuse an oversized body before any of it is read.
"""

from __future__ import annotations

import hmac
import itertools
import os
import secrets

from fastapi import HTTPException

from .errors import error_body, logged_error_parts
from .logs import REQUEST_ID

OPEN_PATHS = frozenset({"/v2/health/live", "/v2/health/ready"})


class BodyTooLarge(HTTPException):
    """Raised from `receive` (an HTTPException, which FastAPI's body reading passes through)."""

    def __init__(self, limit: int):
        super().__init__(413, f"request body exceeds the limit of {limit} bytes")
        self.details = [{"loc": ["body"], "msg": self.detail}]  # errors.error_parts answers with them


async def _send_json(send, status: int, body: dict, headers: list | None = None) -> None:
    import json

    raw = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": raw})


_PREFIX = f"{os.getpid():x}{secrets.token_hex(2)}"
_COUNTER = itertools.count(1)


def request_id(given: bytes | None) -> str:
    """The client's X-Request-ID when it sent a sane one (printable, at most 128 characters), else
    a new one: unique in this process and across restarts (pid, random, counter), cheap to make."""
    if given and len(given) <= 128:
        text = given.decode("latin-1")
        if text.isprintable() and text.strip() == text:
            return text
    return f"{_PREFIX}-{next(_COUNTER):x}"


def bearer_problem(given: str, token: str) -> str | None:
    """Why `given` (an Authorization value) does not carry the bearer `token`, or None when it does;
    GuardMiddleware and the gRPC front door (server/grpc) check with it."""
    scheme, _, value = given.partition(" ")
    if scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode()):
        return None
    return "missing bearer token" if not given else "invalid bearer token"


class GuardMiddleware:
    def __init__(self, app, runtime):
        self.app = app
        self.runtime = runtime

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        settings, metrics = self.runtime.settings, self.runtime.metrics
        status = 500
        headers = dict(scope.get("headers") or [])
        rid = request_id(headers.get(b"x-request-id"))
        scope["segfuse.request_id"] = rid
        rid_context = REQUEST_ID.set(rid)  # log lines of this request carry it (server/logs.py)
        rid_header = (b"x-request-id", rid.encode())

        started = False

        async def send_counted(message):
            nonlocal status, started
            if message["type"] == "http.response.start":
                status, started = message["status"], True
                message = {**message, "headers": [*message.get("headers", ()), rid_header]}
            await send(message)

        try:
            if settings.token and scope["path"] not in OPEN_PATHS:
                given = headers.get(b"authorization", b"").decode("latin-1")
                msg = bearer_problem(given, settings.token)
                if msg is not None:
                    return await _send_json(send_counted, 401, error_body(msg, [{"loc": ["headers", "Authorization"],
                                                                               "msg": msg}]),
                                            [(b"www-authenticate", b"Bearer")])
            limit = settings.max_body_bytes
            declared = headers.get(b"content-length")
            if declared is not None:
                try:
                    too_big = int(declared) > limit
                except ValueError:
                    return await _send_json(send_counted, 400, error_body("malformed Content-Length header"))
                if too_big:
                    msg = f"request body of {int(declared)} bytes exceeds the limit of {limit} bytes"
                    return await _send_json(send_counted, 413, error_body(msg, [{"loc": ["body"], "msg": msg}]))
            received = 0

            async def receive_limited():
                nonlocal received
                message = await receive()
                if message["type"] == "http.request":
                    received += len(message.get("body", b""))
                    if received > limit:  # chunked bodies declare no length
                        raise BodyTooLarge(limit)
                return message

            try:
                await self.app(scope, receive_limited, send_counted)
            except Exception as e:
                # Answered here, not re-raised: Starlette's ServerErrorMiddleware would answer 500 and
                # re-raise, and uvicorn then closes the client's keep-alive connection.
                if started:
                    raise
                code, body, extra = logged_error_parts(e, scope)
                await _send_json(send_counted, code, body, [(k.lower().encode(), str(v).encode())
                                                            for k, v in (extra or {}).items()])
        finally:
            REQUEST_ID.reset(rid_context)
            route = scope.get("route")
            endpoint = getattr(route, "path", None) or "unmatched"
            metrics.request_done(endpoint, scope.get("method", ""), status)
