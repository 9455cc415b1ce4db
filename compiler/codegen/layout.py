"""Sizes and row-major strides of concrete shapes, for the code generator's kernel families."""

from __future__ import annotations

import math


def numel(shape) -> int:
    return math.prod(shape) if shape else 1


def contiguous_strides(shape) -> tuple:
    s, acc = [], 1
    for d in reversed(shape):
        s.append(acc)
        acc *= d
    return tuple(reversed(s))
