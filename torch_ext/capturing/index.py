"""Lowerings of ATen's scatter, index and gather ops onto the registry's scatter family (scatter,
index_add, index_reduce, index_put) and its gathers (gather, take_along_axis, index_select).

gather, index_select and index_add are the registry ops of their names and PyTorch's argument
order, so the generic lowering takes them. The others are mapped here, keeping PyTorch's meaning
where the registry op differs:
- reduce names: PyTorch's "sum", "prod", "multiply" are the registry's "add", "mul";
- `x[idx]` and `take_along_dim` count negative indices from the end; the registry's gathers
  refuse them, so the index is wrapped first (an index out of range stays out of range, and the
  gather refuses it, where PyTorch's CPU take_along_dim wraps it around);
- `index_put` of a dim other than the first moves that dim to the front and back (the registry's
  index_put indexes dim 0); a boolean mask with one value (`x[mask] = v`) is a `where`.
Several index tensors at once, or a mask selecting a data-dependent number of elements, are
refused with the way to write them.
"""

from __future__ import annotations

import torch
from segfuse.compiler.builder import Tensor
from segfuse.compiler.ops.indexing import TORCH_REDUCE_NAMES

from .lowering import lowers, suggest

aten = torch.ops.aten

_SEVERAL_INDICES = ("index one dim with one tensor: flatten the indexed dims and index them with one "
                    "linear index, x.flatten(0, 1)[i * x.shape[1] + j]")

suggest("masked_select", "torch.where(mask, x, fill) keeps x's shape (masked_select's length depends on the data)")
suggest("masked_scatter", "torch.where(mask, source, x) with source of x's shape")
suggest("index_copy", "y = x.clone(); y[:, index] = source (dim 1; y[index] = source for dim 0)")
suggest("index_fill", "y = x.clone(); y[:, index] = torch.full((), value, dtype=x.dtype) (dim 1)")
suggest("put", "x.flatten().index_put((index.flatten(),), source.flatten()).view_as(x)")
suggest("take", "x.flatten()[index]")


def _reduce(name: str) -> str:
    """A PyTorch reduce name ("sum", "prod", "multiply", "amax", ...) as the registry's."""
    return TORCH_REDUCE_NAMES.get(name, name)


def _wrap_negative(cx, index: Tensor, size) -> Tensor:
    """`index` with negative entries counted from `size`, as PyTorch's x[i] and take_along_dim."""
    ops = cx.fd.ops
    return ops.where(ops.lt(index, 0), ops.add(index, cx.size_operand(size)), index)


# ---- scatter ------------------------------------------------------------------------------
@lowers(aten.scatter)
def scatter(cx, x, dim, index, src=None, value=None, *, reduce=None):
    """scatter.src and .value (duplicates: the last write wins, which PyTorch leaves unspecified);
    scatter.reduce and .value_reduce ("add", "multiply")."""
    src = value if src is None else src
    return cx.fd.ops.scatter(x, dim, index, src, reduce=_reduce(reduce) if reduce is not None else "none")


@lowers(aten.scatter_add)
def scatter_add(cx, x, dim, index, src):
    return cx.fd.ops.scatter(x, dim, index, src, reduce="add")


@lowers(aten.scatter_reduce)
def scatter_reduce(cx, x, dim, index, src, reduce, *, include_self=True):
    return cx.fd.ops.scatter(x, dim, index, src, reduce=_reduce(reduce), include_self=include_self)


@lowers(aten.index_reduce)
def index_reduce(cx, x, dim, index, source, reduce, *, include_self=True):
    return cx.fd.ops.index_reduce(x, dim, index, source, reduce=_reduce(reduce), include_self=include_self)


# ---- gathers ------------------------------------------------------------------------------
@lowers(aten.take_along_dim)
def take_along_dim(cx, x, indices, dim=None):
    """take_along_dim(x, indices, dim): negative indices count from the end; with dim None, x and
    indices flattened, and negative indices refused (PyTorch's gather of the flat tensors)."""
    fd = cx.fd
    if dim is None:
        return fd.ops.take_along_axis(fd.ops.reshape(x, [-1]), fd.ops.reshape(indices, [-1]), 0)
    shape = cx.shape(x)
    size = shape[dim % len(shape)] if shape else 1
    return fd.ops.take_along_axis(x, _wrap_negative(cx, indices, size), dim)


def _one_index(cx, indices):
    """(dim, index tensor) of an advanced-indexing list with one tensor and None elsewhere."""
    given = [(k, t) for k, t in enumerate(indices) if t is not None]
    if len(given) != 1:
        cx.refuse(f"indexing with {len(given)} index tensors at once (segfuse indexes one dim at a time)",
                  alternative=_SEVERAL_INDICES)
    return given[0]


@lowers(aten.index)
def index(cx, x, indices):
    """x[..., idx, ...] with one integer index tensor of any rank: index_select of the flattened,
    wrapped index, reshaped so the index's dims take the indexed dim's place."""
    fd = cx.fd
    d, idx = _one_index(cx, indices)
    if idx.dtype.is_bool:
        cx.refuse("indexing with a boolean mask gives a data-dependent number of elements",
                  alternative="torch.where(mask, x, fill) or x.masked_fill(~mask, fill), which keep x's shape")
    shape, ishape = cx.shape(x), cx.shape(idx)
    flat = idx if len(ishape) == 1 else fd.ops.reshape(idx, [-1])
    out = fd.ops.index_select(x, d, _wrap_negative(cx, flat, shape[d]))
    if len(ishape) != 1:
        out = fd.ops.reshape(out, shape[:d] + ishape + shape[d + 1:])
    return out


@lowers(aten.index_put)
def index_put(cx, x, indices, values, accumulate=False):
    """x[..., idx, ...] = values (+= with accumulate, duplicates adding up) with one integer index
    tensor; a boolean mask with a single value is where(mask, value, x)."""
    fd = cx.fd
    d, idx = _one_index(cx, indices)
    if idx.dtype.is_bool:
        return _masked_put(cx, x, d, idx, values, accumulate)
    if d == 0:
        return fd.ops.index_put(x, idx, values, accumulate=accumulate)
    # dim d to the front: x, and the values broadcast to the indexed region (x's dims before d,
    # the index's dims, x's dims after d) with the index's dims moved to the front
    shape, ishape = cx.shape(x), cx.shape(idx)
    rank, irank = len(shape), len(ishape)
    if isinstance(values, Tensor):
        region = shape[:d] + ishape + shape[d + 1:]
        vals = fd.ops.expand(values, region)
        values = fd.ops.permute(vals, list(range(d, d + irank)) + list(range(d)) +
                                list(range(d + irank, len(region))))
    perm = [d] + [k for k in range(rank) if k != d]
    moved = fd.ops.index_put(fd.ops.permute(x, perm), idx, values, accumulate=accumulate)
    return fd.ops.permute(moved, [perm.index(k) for k in range(rank)])


def _masked_put(cx, x, d, mask, values, accumulate):
    fd = cx.fd
    shape, mshape = cx.shape(x), cx.shape(mask)
    vshape = cx.shape(values) if isinstance(values, Tensor) else []
    if any(s != 1 for s in vshape):
        cx.refuse("x[mask] = values with a tensor of values writes a data-dependent number of elements",
                  alternative="torch.where(mask, values, x) with values of x's shape")
    # the mask covers dims d .. d + its rank; the value is one element
    mask = fd.ops.reshape(mask, [1] * d + mshape + [1] * (len(shape) - d - len(mshape)))
    if isinstance(values, Tensor) and vshape:
        values = fd.ops.reshape(values, [])
    if accumulate:
        return fd.ops.add(x, fd.ops.where(mask, values, fd.ops.full_like(x, 0)))
    return fd.ops.where(mask, values, x)
