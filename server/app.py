"""`create_app(settings)`: the FastAPI application (tests build one per settings)."""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager

from fastapi import FastAPI, Response
from fastapi.openapi.utils import get_openapi
from segfuse.compiler.schema import GraphSpec

from . import docs_pages, errors, gpu_info
from .compression import CompressionMiddleware
from .fastlane import FastLane
from .launch import launch_batch
from .metrics_port import MetricsListener, MetricsPortError
from .middleware import OPEN_PATHS, GuardMiddleware
from .models import BufferJson, BufferJsonOut, ErrorBody, ExecuteRequest, InferRequest
from .routers import PROTOCOL_ROUTERS, buffers, fusions, health, infer, shm
from .runs import commit_batch
from .settings import Settings
from .state import ServerState
from .version import __version__

log = logging.getLogger("segfuse.server")

DESCRIPTION = """Segmented fusion executor. Register tensor fusion graphs, keep named buffers on the
device, and run fusions on them through KServe v2 style inference requests (with the binary tensor
data extension). Errors: `{"error": "...", "details": [{"loc": [...], "msg": "..."}]}`."""

# Models used only in hand-written request bodies (binary framing, content negotiation).
EXTRA_SCHEMAS = (InferRequest, ExecuteRequest, BufferJson, BufferJsonOut, ErrorBody, GraphSpec)


class SegfuseApp(FastAPI):
    """FastAPI with the fast lane in front: the hot routes (server/fastlane.py) are answered before
    FastAPI's own middleware stack and router, inside the same GuardMiddleware."""

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.state.fast_lane and self.fast_lane.match(scope):
            return await self.fast_guarded(scope, receive, send)
        return await super().__call__(scope, receive, send)


def create_app(settings: Settings | None = None) -> SegfuseApp:
    settings = settings or Settings.from_env()
    settings.check()
    server_state = ServerState(settings)
    server_metrics = server_state.metrics
    server_metrics.watch(server_state.stats.counts,
                         lambda: [gpu_info.usage(server_state.gpu)] if server_state.gpu else [])

    def exposition() -> bytes:
        """/metrics on either port: the gauges read now, then every family."""
        if server_state.executor is not None:
            server_metrics.runs_admitted.set(server_state.executor.admitted)
        server_metrics.fusion_bytes.set(server_state.fusions.bytes)
        return server_metrics.render()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        metrics_port = start_metrics_port(settings, exposition)  # first: a port in use stops the start here
        app.state.metrics_port = metrics_port.port if metrics_port else None  # (the bound one: 0 picks)
        try:
            grpc_server = await start_grpc(server_state) if settings.grpc_port is not None else None
        except BaseException:  # (a port in use): the metrics listener must not outlive the failed start
            if metrics_port is not None:
                await asyncio.to_thread(metrics_port.stop)
            raise
        app.state.grpc_port = grpc_server.port if grpc_server else None  # (the bound one: --grpc-port 0 picks)
        # Initialise in the background: /v2/health/live answers at once, /ready says 503 until done.
        starting = asyncio.create_task(server_state.start(launch_batch, commit_batch))
        app.state.starting = starting
        try:
            yield
        finally:
            if grpc_server is not None:
                await grpc_server.stop()
            await starting
            await server_state.stop()
            if metrics_port is not None:
                await asyncio.to_thread(metrics_port.stop)

    app = SegfuseApp(title="segfuse", version=__version__, description=DESCRIPTION, lifespan=lifespan,
                     **docs_pages.offline_docs_kwargs())
    app.state.server_state = server_state
    app.state.settings = settings
    app.state.fast_lane = True
    app.fast_lane = FastLane(server_state)
    app.fast_guarded = GuardMiddleware(CompressionMiddleware(app.fast_lane, settings=settings), runtime=server_state)
    errors.install(app)
    docs_pages.install(app)  # /docs and /redoc with local scripts (no CDN)
    app.add_middleware(CompressionMiddleware, settings=settings)  # inside the guard: auth and limits first
    app.add_middleware(GuardMiddleware, runtime=server_state)
    # Fixed /v2/models/ routes (stats, ...) before infer's /v2/models/{model}.
    for r in (health.router, *PROTOCOL_ROUTERS, buffers.router, fusions.router, infer.router, shm.router):
        app.include_router(r)

    @app.get("/metrics", tags=["health"], summary="Prometheus metrics", response_class=Response,
             responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format"}})
    async def metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST

        return Response(exposition(), media_type=CONTENT_TYPE_LATEST)

    def openapi() -> dict:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
        comps = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in EXTRA_SCHEMAS:
            s = model.model_json_schema(ref_template="#/components/schemas/{model}")
            comps.update(s.pop("$defs", {}))
            comps.setdefault(model.__name__, s)
        if settings.token:
            comps_root = schema["components"]
            comps_root["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
            schema["security"] = [{"bearer": []}]
        document_errors(schema, bool(settings.token))
        app.openapi_schema = schema
        return schema

    app.openapi = openapi
    return app


_ERROR = {"$ref": "#/components/schemas/ErrorBody"}


def document_errors(schema: dict, token: bool) -> None:
    """The statuses the server really sends, with its own error body: FastAPI lists a 422
    `HTTPValidationError` for every route with parameters, where segfuse answers a malformed
    request with 400 and the ErrorBody; 400 wherever a route takes parameters or a body; 401 on
    every route but health when a token is set."""
    for path, item in schema.get("paths", {}).items():
        for op in item.values():
            if not isinstance(op, dict) or "responses" not in op:
                continue
            responses = op["responses"]
            auto = responses.get("422", {})
            ref = auto.get("content", {}).get("application/json", {}).get("schema", {}).get("$ref", "")
            if ref.endswith("/HTTPValidationError"):
                del responses["422"]
            if op.get("parameters") or op.get("requestBody"):
                responses.setdefault("400", {"description": "malformed request (a field, a parameter, the body)",
                                             "content": {"application/json": {"schema": _ERROR}}})
            if token and path not in OPEN_PATHS:
                responses.setdefault("401", {"description": "missing or bad bearer token",
                                             "content": {"application/json": {"schema": _ERROR}}})
    comps = schema.get("components", {}).get("schemas", {})
    uses = str(schema.get("paths", {}))
    for name in ("HTTPValidationError", "ValidationError"):
        if name in comps and f"/{name}'" not in uses:
            del comps[name]


async def start_grpc(server_state: ServerState):
    """The KServe v2 gRPC server of --grpc-port, on this event loop (server/grpc; the grpc extra)."""
    try:
        from .grpc.server import GrpcServer
    except ImportError as e:
        raise RuntimeError(f"--grpc-port needs the grpc extra: pip install 'segfuse[grpc]' ({e})") from None
    return await GrpcServer.start(server_state)


def start_metrics_port(settings: Settings, exposition) -> MetricsListener | None:
    """The --metrics-port listener, serving (server/metrics_port.py); None when it is off."""
    if settings.metrics_port is None:
        return None
    listener = MetricsListener(settings.host, settings.metrics_port, exposition)
    try:
        port = listener.start()
    except MetricsPortError as e:
        log.error("%s", e)  # one line before uvicorn's traceback of the failed start
        raise
    log.info("metrics on http://%s:%d/metrics%s", settings.host, port,
             " (without the bearer token, as Triton's metrics port)" if settings.token else "")
    return listener


async def wait_ready(app: FastAPI) -> None:
    """For tests and embedders: wait until the lifespan's background start has finished."""
    starting = getattr(app.state, "starting", None)
    if starting is not None:
        await asyncio.shield(starting)


