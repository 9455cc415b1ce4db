"""Lowerings of ATen shape ops: views, movement, cat/split, copies that are identities.

Views and expands take their result shape from PyTorch's value of the node, so -1 and sizes
computed from symbolic dims (`x.reshape(-1)`, `x.view(T * K)`) become the graph's size expressions.
permute, unsqueeze, select, cat and pad map generically by name; transpose, t, unbind, split and
narrow arrive as permute, select and slice (torch's decompositions). A segfuse graph has values, not
storage: clone, contiguous, alias and detach return their input.
"""

from __future__ import annotations

import sympy
import torch
from segfuse.compiler.shapes import dims_equal, parse_size

from .lowering import LowerContext, lowers, suggest

aten = torch.ops.aten

_END = (1 << 63) - 1  # PyTorch's "to the end" for a slice


@lowers(aten.view.default, aten.reshape.default, aten._unsafe_view.default, aten.view_copy.default,
        aten._reshape_copy.default)
def _reshape(cx, x, size):
    shape = cx.shape()
    if _same(x.shape, shape):
        return x
    return cx.fd.ops.reshape(x, shape)


def _same(shape, sizes) -> bool:
    return len(shape) == len(sizes) and all(
        dims_equal(a, b if isinstance(b, int) else parse_size(b)) is True for a, b in zip(shape, sizes))


@lowers(aten.expand.default, aten.expand_copy.default)
def _expand(cx, x, size, *, implicit=False):
    shape = cx.shape()
    if _same(x.shape, shape):
        return x
    return cx.fd.ops.expand(x, shape)


@lowers(aten.permute_copy.default)
def _permute(cx, x, dims):
    return cx.fd.ops.permute(x, dims)


@lowers(aten.squeeze.default, aten.squeeze.dim, aten.squeeze.dims, aten.squeeze_copy.default,
        aten.squeeze_copy.dim, aten.squeeze_copy.dims)
def _squeeze(cx, x, dim=None):
    rank = len(x.shape)
    dims = range(rank) if dim is None else ([dim] if isinstance(dim, int) else list(dim))
    drop = sorted({d % max(rank, 1) for d in dims if rank and x.shape[d % rank] == 1})
    return cx.fd.ops.squeeze(x, drop) if drop else x


@lowers(aten.unsqueeze_copy.default)
def _unsqueeze(cx, x, dim):
    return cx.fd.ops.unsqueeze(x, dim)


@lowers(aten.select.int, aten.select_copy.int)
def _select(cx, x, dim, index):
    if isinstance(index, str):  # a size: written from the end (T - 1 -> -1)
        d = dim % max(len(x.shape), 1)
        size_index, index = index, _from_end(cx, index, x.shape[d], "index")
        if index is None:
            cx.refuse(f"the index {size_index} is the dim's size, out of range")
    return cx.fd.ops.select(x, dim, index)


@lowers(aten.constant_pad_nd.default)
def _constant_pad(cx, x, pad, value=0):
    if any(isinstance(p, str) for p in pad):
        cx.refuse("padding by a symbolic size is not supported; pad amounts are numbers")
    return cx.fd.ops.pad(x, list(pad), value)


@lowers(aten.slice.Tensor, aten.slice_copy.Tensor)
def _slice(cx, x, dim=0, start=None, end=None, step=1):
    rank = len(x.shape)
    d = dim % max(rank, 1)
    size = x.shape[d]
    start = _bound(cx, start, size, "start")
    end = _bound(cx, end, size, "end")
    if start in (None, 0) and end is None and step == 1:
        return x
    return cx.fd.ops.slice(x, d, start, end, step)


def _bound(cx: LowerContext, b, size, what: str):
    """A slice bound as segfuse's slice takes it: an int (negative from the end) or None (the end).
    A symbolic bound is written relative to the dim's size (T - 1 -> -1)."""
    if b is None:
        return None
    if isinstance(b, int):
        if b >= _END or (isinstance(size, int) and b >= size and what == "end"):
            return None
        return b
    diff = _from_end(cx, b, size, f"slice {what}")
    if diff is None and what != "end":
        cx.refuse("a slice that starts at the dim's size is empty")
    return diff


def _from_end(cx: LowerContext, b: str, size, what: str):
    """A position given as a size expression, as a negative position from the end of a dim of
    `size` (None: the end itself); refused where it is not the size minus a number."""
    diff = sympy.simplify(parse_size(b) - size)
    if not diff.is_Integer or int(diff) > 0:
        cx.refuse(f"the {what} {b} is a size that segfuse cannot write against the dim's size {size}",
                  alternative="a number, or the dim's size minus a number")
    return int(diff) or None


@lowers(aten.split_with_sizes.default, aten.split_with_sizes_copy.default)
def _split_with_sizes(cx, x, split_sizes, dim=0):
    d = dim % max(len(x.shape), 1)
    if any(isinstance(s, str) for s in split_sizes):
        cx.refuse("split sizes that are symbolic are not supported; split by numbers")
    out, at = [], 0
    for s in split_sizes:
        out.append(cx.fd.ops.slice(x, d, at, at + s, 1))
        at += s
    return tuple(out)


@lowers(aten.split.Tensor, aten.split_copy.Tensor)
def _split(cx, x, split_size, dim=0):
    return _split_with_sizes(cx, x, [cx.size(t.shape[dim]) for t in cx.out], dim)


@lowers(aten.unbind.int, aten.unbind_copy.int)
def _unbind(cx, x, dim=0):
    return tuple(cx.fd.ops.select(x, dim, i) for i in range(len(cx.out)))


@lowers(aten.repeat.default)
def _repeat(cx, x, repeats):
    """x tiled: each dim gets a new size-r dim in front of it (expand), then the pairs merge."""
    ops = cx.fd.ops
    if any(isinstance(r, str) for r in repeats):
        cx.refuse("repeat counts that are symbolic are not supported")
    shape = [1] * (len(repeats) - len(x.shape)) + cx.shape(x)
    paired = [v for s in shape for v in (1, s)]
    wide = [v for r, s in zip(repeats, shape) for v in (r, s)]
    t = ops.reshape(x, paired)
    t = ops.expand(t, wide)
    return ops.reshape(t, cx.shape())


@lowers(aten.clone.default, aten.alias.default, aten.alias_copy.default, aten.detach.default,
        aten.detach_copy.default, aten.lift_fresh_copy.default, aten.contiguous.default)
def _identity(cx, x, *args, **kwargs):
    return x


@lowers(aten.copy.default)
def _copy(cx, x, src, non_blocking=False):
    """x.copy_(src), functional: src in x's dtype, broadcast to x's shape."""
    ops = cx.fd.ops
    v = src if src.dtype is x.dtype else ops.cast(src, x.dtype)
    return v if _same(v.shape, cx.shape()) else ops.expand(v, cx.shape())


suggest("flip", "index_select with a reversed arange")
suggest("roll", "cat of two slices")
suggest("as_strided", "view, permute, slice or expand")
