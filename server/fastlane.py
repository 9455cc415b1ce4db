"""The fast lane: the hot routes (infer, health) served straight from ASGI, past FastAPI's routing,
dependency injection and response classes.

Why by hand: on the GPU host those layers cost more per request than the run itself (the issue's
profile: starlette/FastAPI middleware and routing around each request, ~360 us of server time for
a 19 us run). The fast lane answers with the same functions as the FastAPI routes (which stay, for
the OpenAPI schema and for `app.state.fast_lane = False`), inside the same GuardMiddleware (auth,
body limit, request metrics), with the same error bodies (`errors.error_parts`). Everything else
goes to FastAPI.
"""

from __future__ import annotations

import re

from .codec import LARGE
from .errors import ApiError, logged_error_parts
from .jsonio import dumps
from .request_bodies import read_body
from .routers.health import live_status, ready_status
from .routers.infer import infer_body, infer_target

_INFER = re.compile(r"/v2/models/([^/]+)(?:/versions/([^/]+))?/infer")
_JSON = [(b"content-type", b"application/json")]


class Route:
    """What GuardMiddleware reads to label request metrics (FastAPI's routes have `.path` too)."""

    __slots__ = ("path",)

    def __init__(self, path: str):
        self.path = path


INFER_ROUTE, LIVE_ROUTE, READY_ROUTE = Route("/v2/models/{model}/infer"), Route("/v2/health/live"), \
    Route("/v2/health/ready")
VERSIONED_INFER_ROUTE = Route("/v2/models/{model}/versions/{version}/infer")


class FastLane:
    def __init__(self, runtime):
        self.runtime = runtime

    def match(self, scope) -> bool:
        """Whether the fast lane serves this request; sets scope["route"] when it does."""
        path, method = scope["path"], scope["method"]
        if method == "POST":
            m = _INFER.fullmatch(path)
            if m is not None:
                scope["route"] = INFER_ROUTE if m.group(2) is None else VERSIONED_INFER_ROUTE
                scope["path_params"] = {"model": m.group(1), "version": m.group(2)}
                return True
        elif method == "GET":
            if path == "/v2/health/live":
                scope["route"] = LIVE_ROUTE
                return True
            if path == "/v2/health/ready":
                scope["route"] = READY_ROUTE
                return True
        return False

    async def __call__(self, scope, receive, send):
        route = scope["route"]
        try:
            if route is INFER_ROUTE or route is VERSIONED_INFER_ROUTE:
                header_length = declared = None
                for k, v in scope["headers"]:
                    if k == b"inference-header-content-length":
                        header_length = v.decode("latin-1")
                    elif k == b"content-length" and v.isdigit() and len(v) <= 19:
                        declared = int(v)
                params = scope["path_params"]
                rt, model, version = self.runtime, params["model"], params["version"]
                fusion = infer_target(rt, model, version)
                message = await receive()
                body = message.get("body", b"")
                if message["type"] != "http.request" or message.get("more_body") or len(body) >= LARGE:
                    # (a small body in one message, the hot path, is used as it came)
                    body = await read_body(rt, _chunks(receive, message), declared, header_length)
                payload, headers = await infer_body(rt, fusion, model, body, header_length, version)
                return await _send(send, 200, headers, payload)
            status, body = live_status() if route is LIVE_ROUTE else ready_status(self.runtime)
            return await _send(send, status, _JSON, dumps(body))
        except Exception as e:
            status, body, headers = logged_error_parts(e, scope)
            extra = [(k.lower().encode(), str(v).encode()) for k, v in (headers or {}).items()]
            return await _send(send, status, _JSON + extra, dumps(body))


async def _chunks(receive, message):
    """The body's chunks, from `message` (received already) on."""
    while True:
        if message["type"] == "http.disconnect":
            raise ApiError(400, "the client went away before sending the whole body")
        yield message.get("body", b"")
        if not message.get("more_body"):
            return
        message = await receive()


async def _send(send, status: int, headers: list, payload: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [*headers, (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})
