"""Data types: names, NumPy equivalents, and PyTorch's type-promotion rules."""

from __future__ import annotations

from enum import Enum

import ml_dtypes
import numpy as np


class DType(str, Enum):
    bool = "bool"
    uint8 = "uint8"
    int8 = "int8"
    int16 = "int16"
    int32 = "int32"
    int64 = "int64"
    float16 = "float16"
    bfloat16 = "bfloat16"
    float32 = "float32"
    float64 = "float64"

    def __str__(self) -> str:  # so f-strings print 'int64', not 'DType.int64'
        return self.value

    @property
    def np(self) -> np.dtype:
        return _NP[self]

    @property
    def itemsize(self) -> int:
        return _NP[self].itemsize

    @property
    def is_bool(self) -> bool:
        return self is DType.bool

    @property
    def is_int(self) -> bool:
        """Integral, bool excluded (PyTorch's isIntegralType(includeBool=False))."""
        return self in _INTS

    @property
    def is_float(self) -> bool:
        return self in _FLOATS

    @property
    def is_signed(self) -> bool:
        return self.is_float or self in (DType.int8, DType.int16, DType.int32, DType.int64)

    @property
    def category(self) -> int:
        """0 bool, 1 integer, 2 floating (the order PyTorch promotes across)."""
        return 0 if self.is_bool else (1 if self.is_int else 2)


_NP = {
    DType.bool: np.dtype(np.bool_),
    DType.uint8: np.dtype(np.uint8),
    DType.int8: np.dtype(np.int8),
    DType.int16: np.dtype(np.int16),
    DType.int32: np.dtype(np.int32),
    DType.int64: np.dtype(np.int64),
    DType.float16: np.dtype(np.float16),
    DType.bfloat16: np.dtype(ml_dtypes.bfloat16),
    DType.float32: np.dtype(np.float32),
    DType.float64: np.dtype(np.float64),
}
_FROM_NP = {v: k for k, v in _NP.items()}
_INTS = (DType.uint8, DType.int8, DType.int16, DType.int32, DType.int64)
_FLOATS = (DType.float16, DType.bfloat16, DType.float32, DType.float64)

DEFAULT_FLOAT = DType.float32  # torch.get_default_dtype()
DEFAULT_INT = DType.int64

# KServe v2 / Triton datatype names.
KSERVE_NAMES = {
    DType.bool: "BOOL", DType.uint8: "UINT8", DType.int8: "INT8", DType.int16: "INT16",
    DType.int32: "INT32", DType.int64: "INT64", DType.float16: "FP16", DType.bfloat16: "BF16",
    DType.float32: "FP32", DType.float64: "FP64",
}
FROM_KSERVE = {v: k for k, v in KSERVE_NAMES.items()}


def from_numpy(dt) -> DType:
    """DType of a NumPy dtype (or anything np.dtype accepts); ValueError if unsupported."""
    d = np.dtype(dt)
    try:
        return _FROM_NP[d]
    except KeyError:
        raise ValueError(f"unsupported dtype {d}; supported: {', '.join(t.value for t in DType)}") from None


def promote_types(a: DType, b: DType) -> DType:
    """torch.promote_types for the dtypes we support."""
    if a is b:
        return a
    if a.is_bool:
        return b
    if b.is_bool:
        return a
    if a.is_float and b.is_float:
        if {a, b} == {DType.float16, DType.bfloat16}:
            return DType.float32
        return a if a.itemsize >= b.itemsize else b
    if a.is_float:
        return a
    if b.is_float:
        return b
    # two integer types: NumPy's lattice equals PyTorch's for these (uint8+int8 -> int16)
    return from_numpy(np.promote_types(a.np, b.np))


def literal_dtype(value) -> DType:
    """The dtype a Python number literal has when it stands alone (a wrapped number)."""
    if isinstance(value, bool):
        return DType.bool
    if isinstance(value, int):
        return DEFAULT_INT
    return DEFAULT_FLOAT


def result_type(tensors: list[tuple[DType, int]], literals: list[object]) -> DType:
    """torch.result_type over tensors given as (dtype, rank) and Python-number literals.

    PyTorch ranks participants in three priority groups: tensors with dims, zero-dim
    tensors, then wrapped numbers. A lower group only matters when it brings a higher
    category (bool < int < float); then its *category default* is used for literals.
    """
    groups: list[DType | None] = [None, None, None]
    for dt, rank in tensors:
        g = 0 if rank > 0 else 1
        groups[g] = dt if groups[g] is None else promote_types(groups[g], dt)
    for v in literals:
        dt = literal_dtype(v)
        groups[2] = dt if groups[2] is None else promote_types(groups[2], dt)
    return _combine(groups[0], _combine(groups[1], groups[2]))


def _combine(higher: DType | None, lower: DType | None) -> DType | None:
    # c10::combine_categories
    if higher is None:
        return lower
    if lower is None:
        return higher
    if higher.is_float:
        return higher
    if higher.is_bool or lower.is_float:
        return promote_types(higher, lower)
    return higher


def can_cast(src: DType, dst: DType) -> bool:
    """torch.can_cast: used where PyTorch refuses to write a result into a narrower category."""
    return src.category <= dst.category
