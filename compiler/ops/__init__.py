"""The op registry. Importing this package registers every op."""

from . import composites, creation, index_reduce, indexing, pointwise, reductions, shape_ops  # noqa: F401  (registration)
from .registry import REGISTRY, Attrs, InferCtx, OpDef, OpKind, Scalar, TensorType, get

__all__ = ["REGISTRY", "Attrs", "InferCtx", "OpDef", "OpKind", "Scalar", "TensorType", "get"]
