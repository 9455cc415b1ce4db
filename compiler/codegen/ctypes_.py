"""C types and literals for segfuse dtypes.

Each dtype has a storage type (what sits in memory) and a value type (what expressions compute
with): float16/bfloat16 are stored as 16-bit structs and computed in float.
"""

from __future__ import annotations

import math

from ..dtypes import DType
from ..ops.registry import Combiner

STORAGE = {
    DType.bool: "bool", DType.uint8: "unsigned char", DType.int8: "signed char", DType.int16: "short",
    DType.int32: "int", DType.int64: "long long", DType.float16: "sf_half", DType.bfloat16: "sf_bf16",
    DType.float32: "float", DType.float64: "double",
}
VALUE = dict(STORAGE, **{DType.float16: "float", DType.bfloat16: "float"})

# The type scatter privatization accumulates in (shared memory): wide enough for native atomics.
WIDE = {
    DType.bool: "int", DType.uint8: "int", DType.int8: "int", DType.int16: "int", DType.int32: "int",
    DType.int64: "long long", DType.float16: "float", DType.bfloat16: "float", DType.float32: "float",
    DType.float64: "double",
}


def storage(dt: DType) -> str:
    return STORAGE[dt]


def value(dt: DType) -> str:
    return VALUE[dt]


def literal(v, ctype: str | None = None) -> str:
    """A C literal for a Python number, converted to `ctype` when given."""
    if isinstance(v, bool):
        text = "true" if v else "false"
    elif isinstance(v, int):
        if v == -(2**63):
            # C has no literal for it (-9223372036854775808LL negates a literal too large for long
            # long); written as an unsigned one it read +2^63 in a float expression
            text = "((long long)(-9223372036854775807LL - 1LL))"
        else:
            text = f"((long long){v}LL)" if -(2**63) < v < 2**63 else f"((unsigned long long){v % 2**64}ULL)"
    elif math.isnan(v):
        text = "sf_nan()"
    elif math.isinf(v):
        text = "sf_inf()" if v > 0 else "(-sf_inf())"
    else:
        text = f"({float(v)!r})"
    return f"sf_cvt<{ctype}>({text})" if ctype else text


def cvt(expr: str, ctype: str) -> str:
    return f"sf_cvt<{ctype}>({expr})"


def combine_fn(reduce) -> str:
    """A reduction's or scatter-reduce's combine function in the prelude: sf_op_<Combiner value>
    (`reduce`: a registry Combiner or a scatter's reduce attribute, which uses the same names)."""
    return f"sf_op_{Combiner(reduce).value}"
