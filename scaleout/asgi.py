"""HTTP requests as plain values: a request is (method, raw path, query, raw headers, body), a
response (status, raw headers, body). The control endpoint forwards and combines them; a shard keeps
registrations as them (to replay into new runtimes and, through the registry, a restarted shard)."""

from __future__ import annotations

import orjson
from segfuse.server.errors import error_body
from starlette.requests import Request
from starlette.responses import Response

from .routing import SHARD_HEADER

Call = tuple  # (method: str, raw_path: bytes, query: bytes, headers: list[(bytes, bytes)], body: bytes)
Answer = tuple  # (status: int, headers: list[(bytes, bytes)], body: bytes)


async def call_of(request: Request) -> Call:
    """The request as received (below the app's root path, if it is mounted under one)."""
    scope = request.scope
    raw_path = scope.get("raw_path") or scope["path"].encode()
    prefix = scope.get("root_path", "").encode()
    if prefix and raw_path.startswith(prefix):
        raw_path = raw_path[len(prefix):] or b"/"
    return (request.method, raw_path, scope.get("query_string", b""), list(request.headers.raw), await request.body())


def response_of(answer: Answer, shard: str | None = None) -> Response:
    """The answer unchanged, plus Segfuse-Shard naming the shard that gave it (if one did)."""
    status, headers, body = answer
    response = Response(body, status_code=status)
    response.raw_headers = list(headers) + ([(SHARD_HEADER.lower().encode(), shard.encode())] if shard else [])
    return response


def error(status: int, message: str, loc: list, headers: dict | None = None) -> Answer:
    body = orjson.dumps(error_body(message, [{"loc": loc, "msg": message}]))
    extra = [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()]
    return status, [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *extra], body


def with_body(answer: Answer, body: bytes, content_type: bytes | None = None) -> Answer:
    """The answer with another body (its Content-Length, and Content-Type if given, follow)."""
    status, headers, _ = answer
    fixed = []
    for k, v in headers:
        if k.lower() == b"content-length":
            v = str(len(body)).encode()
        elif content_type is not None and k.lower() == b"content-type":
            v = content_type
        fixed.append((k, v))
    return status, fixed, body


def header(headers: list, name: bytes) -> str | None:
    return next((v.decode("latin-1") for k, v in headers if k.lower() == name), None)
