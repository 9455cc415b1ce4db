"""segfuse's compiler: graph format, op registry, validation, segmenter, codegen, backends.

The public names load on first use (PEP 562), so importing one small module of the package (the
client needs only `segfuse.compiler.dtypes`) does not load the planner, the code generator, sympy
and pydantic."""

from __future__ import annotations

import importlib

# public name -> the module (relative to this package) that defines it
_EXPORTS = {
    "FusionDefinition": ".builder", "Tensor": ".builder",
    "CodegenOptions": ".codegen.options",
    "DataType": ".builder_dtypes", "DType": ".dtypes",
    "Engine": ".engine", "RunResult": ".engine",
    "BindError": ".errors", "GraphError": ".errors", "Issue": ".errors", "RunError": ".errors",
    "SegfuseError": ".errors",
    "Fusion": ".ir", "Limits": ".ir",
    "run_graph": ".numpy_backend",
}

__all__ = sorted([*_EXPORTS, "load_fusion"])


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        try:  # a submodule (segfuse.compiler.engine, ...) reached as an attribute
            return importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def load_fusion(source, limits=None):
    """A validated Fusion from a dict, a JSON string, a path, or a FusionDefinition."""
    import os

    from .builder import FusionDefinition
    from .ir import Fusion, Limits

    if isinstance(source, FusionDefinition):
        return source.fusion()
    if isinstance(source, os.PathLike) or (isinstance(source, str) and not source.lstrip().startswith("{")):
        with open(source) as f:
            source = f.read()
    return Fusion.from_json(source, limits or Limits())
