"""`DataType`: nvFuser's names of data types, for code written against nvFuser's frontend.

`FusionDefinition` takes a dtype as a `DataType`, a segfuse `DType`, its name ("int64"), or a
`torch.dtype`, wherever it takes one (`define_tensor`, `define_scalar`, `cast`, `full`, `iota`, a
reduction's `dtype=`). nvFuser's types that segfuse does not compute in (complex, 8- and 4-bit
floats, uint64) are refused where they are used, naming what segfuse has.
"""

from __future__ import annotations

from enum import Enum

from .dtypes import DType


class DataType(Enum):
    """nvFuser's `DataType`; each member's value is the segfuse dtype it means (None: none)."""

    Double = "float64"
    Float = "float32"
    Half = "float16"
    BFloat16 = "bfloat16"
    Int = "int64"
    Int32 = "int32"
    # nvFuser's index type is int64 unless it narrows a kernel's indexing to 32 bits (its choice);
    # sharing Int's value, it is Enum's alias of Int
    Index = "int64"
    Bool = "bool"
    UInt64 = "uint64"
    Float8_e4m3fn = "float8_e4m3fn"
    Float8_e5m2 = "float8_e5m2"
    Float8_e8m0fnu = "float8_e8m0fnu"
    Float4_e2m1fn = "float4_e2m1fn"
    Float4_e2m1fn_x2 = "float4_e2m1fn_x2"
    ComplexFloat = "complex64"
    ComplexDouble = "complex128"
    Null = "null"  # "no dtype": a reduction's or a scan's default

    @property
    def dtype(self) -> DType:
        """The segfuse dtype; TypeError for a type segfuse does not compute in."""
        try:
            return DType(self.value)
        except ValueError:
            raise TypeError(unsupported(f"DataType.{self.name}", self.name.startswith("Complex"))) from None


def unsupported(what: str, is_complex: bool) -> str:
    kind = "complex numbers" if is_complex else "this type"
    return (f"{what} is not supported: segfuse does not compute in {kind}; its dtypes are "
            f"{', '.join(d.value for d in DType)} (DataType: Bool, Int32, Int, Half, BFloat16, Float, Double)")


def dtype_name(value) -> str | None:
    """The segfuse dtype name of a dtype given as a DataType, a DType, a torch.dtype or a name;
    None for None and DataType.Null. Names segfuse does not know pass through unchanged, so the
    graph's validation reports them (with its hints: "float" -> "float32")."""
    if value is None or value is DataType.Null:
        return None
    if isinstance(value, DataType):
        return value.dtype.value
    if isinstance(value, DType):
        return value.value
    text = str(value)
    if type(value).__module__ == "torch" and text.startswith("torch."):  # torch.float32, torch.long, ...
        name = text.removeprefix("torch.")
        if name.startswith("complex"):
            raise TypeError(unsupported(text, True))
        return name
    return text
