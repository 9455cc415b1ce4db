"""segfuse's compiler: graph format, op registry, validation, segmenter, codegen, backends."""

from .builder import FusionDefinition, Tensor
from .dtypes import DType
from .engine import Engine, RunResult
from .errors import BindError, GraphError, Issue, RunError, SegfuseError
from .ir import Fusion, Limits
from .numpy_backend import run_graph

__all__ = [
    "BindError", "DType", "Engine", "Fusion", "FusionDefinition", "GraphError", "Issue", "Limits",
    "RunError", "RunResult", "SegfuseError", "Tensor", "load_fusion", "run_graph",
]


def load_fusion(source, limits: Limits | None = None) -> Fusion:
    """A validated Fusion from a dict, a JSON string, a path, or a FusionDefinition."""
    import os

    if isinstance(source, FusionDefinition):
        return source.fusion()
    if isinstance(source, os.PathLike) or (isinstance(source, str) and not source.lstrip().startswith("{")):
        with open(source) as f:
            source = f.read()
    return Fusion.from_json(source, limits or Limits())
