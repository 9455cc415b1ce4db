"""The protocol's messages, in a protobuf descriptor pool of segfuse's own.

The definitions are Triton's grpc_service.proto and model_config.proto as tritonclient's generated
modules carry them (their serialized FileDescriptorProto, read from the module files without
importing them). Importing those modules would add `inference.*` to protobuf's default pool, where
kserve's and MLServer's generated messages define the same symbols, and one process cannot hold both
(kserve/kserve#3099); in a pool of its own, the server starts in any process, and tritonclient.grpc,
kserve or MLServer import in that process as they would without it.
"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path
from types import SimpleNamespace

from google.protobuf import descriptor_pool, message_factory

SERVICE = "inference.GRPCInferenceService"
# tritonclient's generated modules, each with the proto file it registers (dependencies first)
MODULES = (("model_config_pb2.py", "model_config.proto"), ("service_pb2.py", "grpc_service.proto"))


def _serialized(path: Path) -> bytes:
    """The bytes a generated module passes to `AddSerializedFile`."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "AddSerializedFile" and node.args \
                and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, bytes):
            return node.args[0].value
    raise ImportError(f"{path}: no serialized descriptor (an unexpected tritonclient layout)")


def _pool() -> descriptor_pool.DescriptorPool:
    spec = importlib.util.find_spec("tritonclient")  # (the top-level package only: its grpc part is not imported)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("segfuse's gRPC protocol needs tritonclient's generated messages: pip install 'segfuse[grpc]'")
    folder = Path(next(iter(spec.submodule_search_locations))) / "grpc"
    pool = descriptor_pool.DescriptorPool()
    for module, _ in MODULES:
        pool.AddSerializedFile(_serialized(folder / module))
    return pool


POOL = _pool()


def _classes(proto: str) -> SimpleNamespace:
    """The message classes of one proto file, by name (nested ones as their attributes)."""
    found = POOL.FindFileByName(proto).message_types_by_name
    return SimpleNamespace(**{name: message_factory.GetMessageClass(d) for name, d in found.items()})


model_config = _classes("model_config.proto")
pb = _classes("grpc_service.proto")


def methods():
    """(name, request class, response class, whether both sides stream) of every RPC of the service."""
    for m in POOL.FindServiceByName(SERVICE).methods:
        yield (m.name, message_factory.GetMessageClass(m.input_type), message_factory.GetMessageClass(m.output_type),
               m.client_streaming and m.server_streaming)
