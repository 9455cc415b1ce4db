"""index_reduce: self[..., index[i], ...] (reduce)= source[..., i, ...] along dim, torch.index_reduce,
with reduce mul (PyTorch's "prod"), mean, amax, amin (and add), and include_self.

Shapes are index_add's (a 1-D index; source of self's shape but the index's length along dim). It
renders as index_add does (Lowering.index_add: those kernels read the scatter family's `reduce` and
`include_self` traits, and `alpha`, which is 1 here); reduce "mean" is composite (indexing.expand_mean).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from ..errors import OpError
from .indexing import TORCH_REDUCE_NAMES, _accumulate, expand_mean, index_family_infer, index_family_ref
from .registry import Attrs, Lowering, OpDef, OpKind, register, tensor


class IndexReduceAttrs(Attrs):
    dim: int
    reduce: Literal["add", "mul", "mean", "amax", "amin"]
    include_self: bool = True

    synonyms = {**Attrs.synonyms, "reduce": TORCH_REDUCE_NAMES}
    alpha = property(lambda self: 1)  # (the index_add renderer's scale of the source)


_shape_rule = index_family_infer("index_reduce")


def _infer(ctx, operands, attrs):
    if tensor(operands, 0, "self").dtype.is_bool:
        raise OpError("index_reduce is not supported for bool (as in PyTorch)", ("inputs", 0))
    return _shape_rule(ctx, operands, attrs)


def _index_reduce(x, i, src, d, attrs):
    if i.size == 0:
        return x.copy()
    coords = list(np.indices(src.shape))
    coords[d] = i[coords[d]]
    return _accumulate(x.copy(), tuple(coords), src, attrs.reduce, attrs.include_self)


def _decompose(e, inputs, types, attrs):
    if attrs.reduce != "mean":
        return False
    expand_mean(e, "index_reduce", inputs, attrs, types[0], source_tensor=True)


register(OpDef("index_reduce", OpKind.scatter, ("self", "index", "source"), _infer,
               index_family_ref("index_reduce", _index_reduce), attrs=IndexReduceAttrs,
               extra={"signature": ("self", "dim", "index", "source")}, lowering=Lowering.index_add,
               decompose=_decompose,
               doc="index_reduce(self, dim, index, source, reduce, include_self=True): self[..., index[i], ...] "
                   "(reduce)= source[..., i, ...]; reduce mul (PyTorch's 'prod'), mean, amax, amin, add; not bool. "
                   "reduce 'mean' is composite: index_reduce add of source and of ones (the count), maximum, "
                   "div (floor_divide for integers)"))
