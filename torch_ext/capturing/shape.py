"""Lowerings of ATen shape ops: views, movement (flip, roll), cat/split, writes into a slice
(slice_scatter), copies that are identities.

Views and expands take their result shape from PyTorch's value of the node, so -1 and sizes
computed from symbolic dims (`x.reshape(-1)`, `x.view(T * K)`) become the graph's size expressions.
permute, unsqueeze and cat map generically by name; transpose, t, unbind, split and narrow arrive
as permute, select and slice, F.pad as constant_pad_nd or (reflect, replicate, circular) index ops and
slice_scatter, x[:, i] = v as a where on an arange mask (torch's decompositions). A segfuse graph has
values, not storage: clone, contiguous, alias and detach return their input.
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


# ---- flip, roll ------------------------------------------------------------------------------
@lowers(aten.flip.default)
def _flip(cx, x, dims):
    """Each dim of `dims` read backwards: index_select with n-1, n-2, ..., 0."""
    ops = cx.fd.ops
    shape = cx.shape(x)
    for d in sorted({d % len(shape) for d in dims} if shape else ()):
        n = shape[d]
        if isinstance(n, int):
            if n > 1:
                x = ops.index_select(x, d, ops.iota(n, n - 1, -1))
            continue
        x = ops.index_select(x, d, ops.sub(ops.sub(cx.size_operand(n), 1), ops.iota(n)))
    return x


@lowers(aten.roll.default)
def _roll(cx, x, shifts, dims=()):
    """out[i] = x[(i - shift) mod n] along each dim (index_select); with no dims, of x flattened."""
    ops = cx.fd.ops
    if any(isinstance(s, str) for s in shifts):
        cx.refuse("a shift that is a size is not supported; shifts are numbers",
                  alternative="torch.cat((x[-k:], x[:-k])) with a number k")
    if not dims:
        if len(shifts) != 1:
            cx.refuse(f"{len(shifts)} shifts with no dims")
        flat = x if len(x.shape) == 1 else ops.reshape(x, [-1])
        out = _rolled(cx, flat, shifts[0], 0)
        return out if len(x.shape) == 1 else ops.reshape(out, cx.shape())
    if len(shifts) != len(dims):
        cx.refuse(f"{len(shifts)} shifts for {len(dims)} dims")
    for s, d in zip(shifts, dims):
        x = _rolled(cx, x, s, d % max(len(x.shape), 1))
    return x


def _rolled(cx, x, shift: int, d: int):
    ops = cx.fd.ops
    n = x.size(d)
    if isinstance(n, int):
        if n == 0 or shift % n == 0:
            return x
        return ops.index_select(x, d, ops.remainder(ops.iota(n, -shift % n, 1), n))
    return ops.index_select(x, d, ops.remainder(ops.sub(ops.iota(n), shift), cx.size_operand(n)))


# ---- writes into a slice ----------------------------------------------------------------------
@lowers(aten.slice_scatter.default)
def _slice_scatter(cx, x, src, dim=0, start=None, end=None, step=1):
    """x with x[..., start:end:step, ...] = src (what `x[2:5] = v` and `x[:, :k].copy_(v)` become):
    where(start <= i < start + len(src), src placed with pad, x) for a step of 1 and numbers; with a
    step, or sizes that are symbolic, src's element (i - start) // step where that is a whole step
    inside src (index_select)."""
    ops = cx.fd.ops
    rank = len(x.shape)
    d = dim % max(rank, 1)
    n, m = cx.shape(x)[d], cx.shape(src)[d]
    if isinstance(step, str) or step < 1:
        cx.refuse(f"slice step {step} (slice_scatter takes steps that are positive numbers)")
    if src.dtype is not x.dtype:
        src = ops.cast(src, x.dtype)
    start = _slice_start(cx, start, n)
    if m == 0:
        return x
    where_d = [1] * d + [n] + [1] * (rank - d - 1)  # (a mask along dim d, broadcast over the others)
    pos = ops.iota(n)
    if isinstance(n, int) and isinstance(start, int) and isinstance(m, int) and step == 1:
        if start == 0 and m == n:
            return src
        placed = ops.pad(src, [0, 0] * (rank - 1 - d) + [start, n - start - m], 0)
        inside = ops.logical_and(ops.ge(pos, start), ops.lt(pos, start + m))
        return ops.where(ops.reshape(inside, where_d), placed, x)
    rel = ops.sub(pos, cx.size_operand(start))
    k = ops.floor_divide(rel, step) if step != 1 else rel
    count = cx.size_operand(m)
    inside = ops.logical_and(ops.ge(rel, 0), ops.lt(k, count))
    if step != 1:
        inside = ops.logical_and(inside, ops.eq(ops.remainder(rel, step), 0))
    last = m - 1 if isinstance(m, int) else ops.sub(count, 1)
    index = ops.maximum(ops.minimum(k, last), 0)
    return ops.where(ops.reshape(inside, where_d), ops.index_select(src, d, index), x)


def _slice_start(cx: LowerContext, start, n):
    """A slice's start as a position in [0, n]: an int, or a size expression."""
    if start is None:
        return 0
    if isinstance(start, str):
        return start
    if start < 0:
        return max(start + n, 0) if isinstance(n, int) else f"{n} - {-start}"
    return min(start, n) if isinstance(n, int) else start


suggest("as_strided", "view, permute, slice or expand")
