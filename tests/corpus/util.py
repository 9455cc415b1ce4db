"""The corpus's graph and random-input helpers (corpus.py, corpus_ops.py)."""

from __future__ import annotations

import numpy as np
from helpers.graphs import graph
from segfuse.compiler.dtypes import DType


def _graph(name, inputs, ops, outputs):
    return graph(inputs, ops, outputs, name)


def rand(rng, shape, dt: DType, lo=-4, hi=5, nonzero=False):
    if dt is DType.bool:
        return rng.random(shape) < 0.5
    if dt.is_int:
        lo2 = 0 if dt is DType.uint8 else lo
        a = rng.integers(lo2, hi, size=shape).astype(dt.np)
        if nonzero:
            a[a == 0] = 1
        return a
    a = (rng.standard_normal(shape) * 2).astype(np.float64)
    if nonzero:
        a[np.abs(a) < 0.1] = 1.0
    return a.astype(dt.np)
