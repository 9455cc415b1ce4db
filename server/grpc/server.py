"""The gRPC server of `--grpc-port`: grpcio's asyncio server on the HTTP server's event loop, started
and stopped by the FastAPI app's lifespan (server/app.py), serving the same ServerState: its
fusions, buffers, regions, run queue, statistics and metrics.

Limits: a request message is refused past --max-body-bytes (gRPC's own RESOURCE_EXHAUSTED; a
protobuf message holds at most 2 GiB); the run limits are the run path's. SO_REUSEPORT is off, so
a port another process holds fails the start instead of sharing the port.
"""

from __future__ import annotations

import logging

import grpc

from ..state import ServerState
from .messages import SERVICE, methods
from .service import InferenceService

log = logging.getLogger("segfuse.server")

MAX_MESSAGE_BYTES = 2 ** 31 - 1  # protobuf's limit on one message
STOP_GRACE_SECONDS = 5.0  # calls in flight may finish this long after the server stops taking new ones


class GrpcServer:
    def __init__(self, server: grpc.aio.Server, port: int):
        self.server, self.port = server, port

    @classmethod
    async def start(cls, state: ServerState) -> GrpcServer:
        s = state.settings
        limit = min(s.max_body_bytes, MAX_MESSAGE_BYTES)
        server = grpc.aio.server(options=[("grpc.max_receive_message_length", limit),
                                          ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                                          ("grpc.so_reuseport", 0)])
        server.add_generic_rpc_handlers((_handlers(InferenceService(state)),))
        host = f"[{s.host}]" if ":" in s.host and not s.host.startswith("[") else s.host
        try:
            port = server.add_insecure_port(f"{host}:{s.grpc_port}")
        except RuntimeError as e:
            raise RuntimeError(f"gRPC: cannot listen on {host}:{s.grpc_port}: {e}") from None
        if not port:  # (older grpcio answers 0 instead of raising)
            raise RuntimeError(f"gRPC: cannot listen on {host}:{s.grpc_port}")
        await server.start()
        log.info("gRPC (KServe v2, inference.GRPCInferenceService) on %s:%d", host, port)
        return cls(server, port)

    async def stop(self) -> None:
        await self.server.stop(STOP_GRACE_SECONDS)


def _handlers(service: InferenceService) -> grpc.GenericRpcHandler:
    """The service's methods by RPC name, with their messages' (de)serializers (messages.py)."""
    handlers = {}
    for name, request, response, streams in methods():
        kind = grpc.stream_stream_rpc_method_handler if streams else grpc.unary_unary_rpc_method_handler
        handlers[name] = kind(getattr(service, name), request_deserializer=request.FromString,
                              response_serializer=response.SerializeToString)
    return grpc.method_handlers_generic_handler(SERVICE, handlers)
