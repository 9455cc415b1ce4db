"""The JSON graph format, version 1, as pydantic models (the JSON Schema is generated from these
and from each op's attribute model in the registry)."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, create_model, field_validator

from .dtypes import DType
from .ops.registry import NONFINITE, Number, literal_from_json

FORMAT = "segfuse.fusion/1"


def _not_a_literal(name: str) -> str:
    if name in NONFINITE:
        raise ValueError(f"'{name}' is reserved: in an op's inputs it is the literal {name}, not a tensor")
    return name


Size = Union[int, str]
_NAME = dict(min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
GraphName = Annotated[str, Field(**_NAME)]
# a tensor's name: also not one of the NaN and infinity literals an op's inputs may hold
Name = Annotated[str, Field(**_NAME, json_schema_extra={"not": {"enum": ["NaN", "Infinity"]}}),
                 AfterValidator(_not_a_literal)]
# NaN and infinite literals are written as the strings "NaN", "Infinity", "-Infinity" (JSON has
# no number for them), and read back as floats
_SPEC = ConfigDict(extra="forbid", ser_json_inf_nan="strings")


class InputSpec(BaseModel):
    model_config = _SPEC
    name: Name
    dtype: DType
    shape: list[Size] = Field(description="ints, or symbolic sizes (names) bound when the graph runs")


class OutputSpec(BaseModel):
    model_config = _SPEC
    name: Name
    alias_of: Name | None = Field(None, description="an input this output updates in place")


class OpSpec(BaseModel):
    """One op. Attributes other than `op`, `out` and `inputs` are the op's own (see the registry)."""

    model_config = ConfigDict(extra="allow", ser_json_inf_nan="strings")
    op: str
    out: Name | list[Name]
    inputs: list[Union[Name, Number]] = Field(default_factory=list)

    @field_validator("inputs", mode="before")
    @classmethod
    def _literals(cls, v):
        """"NaN", "Infinity", "-Infinity" among the operands are literals, not tensor names."""
        return [literal_from_json(x) for x in v] if isinstance(v, list) else v

    def attrs(self) -> dict:
        return dict(self.model_extra or {})

    def outs(self) -> list[str]:
        return [self.out] if isinstance(self.out, str) else list(self.out)


class GraphSpec(BaseModel):
    model_config = _SPEC
    format: Literal["segfuse.fusion/1"] = FORMAT
    name: GraphName = "fusion"
    inputs: list[InputSpec] = Field(default_factory=list)
    ops: list[OpSpec]
    outputs: list[Union[Name, OutputSpec]]

    def output_specs(self) -> list[OutputSpec]:
        return [OutputSpec(name=o) if isinstance(o, str) else o for o in self.outputs]


def json_schema() -> dict:
    """JSON Schema of the graph format with one variant per registered op."""
    from .ops import REGISTRY

    variants = []
    for name, op in sorted(REGISTRY.items()):
        fields = {k: (f.annotation, f) for k, f in op.attrs.model_fields.items()}
        model = create_model(
            f"Op_{name}", __config__=ConfigDict(extra="forbid", title=f"op '{name}'"),
            op=(Literal[name], ...),  # type: ignore[valid-type]
            out=(Union[Name, list[Name]], ...),
            inputs=(list[Union[Name, Number]], Field(default_factory=list,
                                                    description=f"operands: {', '.join(op.operands)}")),
            **fields,
        )
        model.__doc__ = op.doc or name
        variants.append(model)
    AnyOp = Annotated[Union[tuple(variants)], Field(discriminator="op")]  # type: ignore[valid-type]
    Graph = create_model("FusionGraph", __base__=GraphSpec, ops=(list[AnyOp], ...))
    schema = Graph.model_json_schema()
    schema["$id"] = "https://segfuse.dev/schema/fusion-1.json"
    schema["title"] = "segfuse fusion graph, format segfuse.fusion/1"
    return schema
