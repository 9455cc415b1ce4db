"""Lazy tensors: each non-anchor op of a segment becomes a C++ lambda `vK(c0, .., cR-1)` that
returns the tensor's value at a coordinate. Views and movement are index transforms, creation
ops are expressions, gathers read their data operand at a checked index. The kernel body calls
the lambdas of what it materializes; NVRTC inlines them, so a chain of ops costs no memory.

One renderer per op family, looked up by the op's registry trait `lowering` (`RENDERERS`).
"""

from __future__ import annotations

import numpy as np

from ..dtypes import DType
from ..ops.pointwise import opmath
from ..ops.registry import LAZY_KINDS, Guard, Lowering, Scalar, TensorType
from ..ops.shape_ops import _slice_bounds
from . import ctypes_ as ct


class Unsupported(Exception):
    """The codegen cannot render this; the runtime falls back to a library/host path."""


def coords(rank: int) -> list[str]:
    return [f"c{k}" for k in range(rank)]


def linearize(cs: list[str], shape, I: str) -> str:
    if not shape:
        return "0"
    expr = f"(({I}){cs[0]})"
    for c, d in zip(cs[1:], shape[1:]):
        expr = f"({expr} * {d} + {c})"
    return expr


def delinearize(lin: str, shape, I: str, prefix: str = "c") -> str:
    """Statements declaring prefix0..prefixR-1 from a linear index."""
    r = len(shape)
    if r == 0:
        return ""
    out = [f"{I} {prefix}_r = {lin};"]
    for k in range(r - 1, 0, -1):
        out.append(f"{I} {prefix}{k} = {prefix}_r % {shape[k]}; {prefix}_r /= {shape[k]};")
    out.append(f"{I} {prefix}0 = {prefix}_r;")
    return " ".join(out)


# The prelude's checker of each operand guard (it writes the error word and returns a safe value).
_GUARD_CHECKER = {Guard.nonzero: "sf_nz", Guard.nonnegative: "sf_nonneg"}


def _pointwise(ctx, node, out_t):
    op = node.op
    types = [ctx.operand_type(x) for x in node.inputs]
    cd = op.compute_dtype(types, node.attrs)
    work_dt = opmath(cd)
    work = ct.value(work_dt)
    R = len(out_t.shape)
    args = []
    for k, x in enumerate(node.inputs):
        if isinstance(x, Scalar):
            e = ct.literal(x.value)
        else:
            t = types[k]
            off = R - t.rank
            cs = ["0" if t.shape[j] == 1 else f"c{j + off}" for j in range(t.rank)]
            e = ctx.call(x, cs)
        if k not in op.raw_operands:
            # operands round to the common dtype first (a literal becomes float16 for a float16
            # result, as in PyTorch), then compute in opmath; mul/div/floor_divide read a 0-d
            # second operand at opmath precision (the reference does the same)
            scalar_opmath = k == 1 and op.scalar_opmath and (isinstance(x, Scalar) or types[k].rank == 0)
            if cd is not work_dt and op.round_operands and not scalar_opmath:
                e = ct.cvt(e, ct.storage(cd))
            e = ct.cvt(e, work)
        g = op.guard
        if g and g[0] == k and work_dt.is_int and not _literal_passes(x, cd, g[1]):
            e = f"{_GUARD_CHECKER[g[1]]}({e}, sf_err, {node.index})"
        args.append(e)
    return f"return {ct.cvt(op.cuda(*args), ct.value(out_t.dtype))};"


def _literal_passes(x, cd, guard: Guard) -> bool:
    """A literal operand that always passes its guard (`x // 8`: the divisor is never zero) needs
    no check, so the kernel cannot fail there. The test uses the literal as the kernel sees it:
    rounded to the common dtype (256 wraps to 0 in an int8 division)."""
    if not isinstance(x, Scalar) or isinstance(x.value, float):
        return False
    with np.errstate(all="ignore"):
        v = int(np.array(x.value).astype(cd.np)) if cd.is_int else int(x.value)
    return v != 0 if guard is Guard.nonzero else v >= 0


def _full(ctx, node, out_t):
    return f"return {ct.literal(node.attrs.value, ct.value(out_t.dtype))};"


def _iota(ctx, node, out_t):
    a = node.attrs
    if out_t.dtype.is_int:
        e = f"({ct.literal(int(a.start))} + {ct.literal(int(a.step))} * (long long)c0)"
    else:
        e = f"((double){float(a.start)!r} + (double){float(a.step)!r} * (double)c0)"
    return f"return {ct.cvt(e, ct.value(out_t.dtype))};"


def _reshape(ctx, node, out_t):
    x = node.inputs[0]
    in_t = ctx.types[x]
    I = ctx.I
    lin = linearize(coords(out_t.rank), out_t.shape, I)
    body = delinearize(lin, in_t.shape, I, "d")
    return f"{body} return {ctx.call(x, [f'd{k}' for k in range(in_t.rank)])};"


def _expand(ctx, node, out_t):
    x = node.inputs[0]
    in_t = ctx.types[x]
    off = out_t.rank - in_t.rank
    cs = ["0" if in_t.shape[j] == 1 else f"c{j + off}" for j in range(in_t.rank)]
    return f"return {ctx.call(x, cs)};"


def _broadcast_in_dim(ctx, node, out_t):
    x = node.inputs[0]
    in_t = ctx.types[x]
    bd = node.attrs.broadcast_dims
    cs = ["0" if in_t.shape[i] == 1 else f"c{bd[i]}" for i in range(in_t.rank)]
    return f"return {ctx.call(x, cs)};"


def _permute(ctx, node, out_t):
    x = node.inputs[0]
    in_t = ctx.types[x]
    cs = [None] * in_t.rank
    for k, d in enumerate(node.attrs.dims):
        cs[d % max(in_t.rank, 1)] = f"c{k}"
    return f"return {ctx.call(x, cs)};"


def _slice(ctx, node, out_t):
    x = node.inputs[0]
    in_t = ctx.types[x]
    a = node.attrs
    d = a.dim % in_t.rank
    start, _ = _slice_bounds(in_t.shape[d], a.start, a.end, a.step)
    cs = coords(in_t.rank)
    cs[d] = f"({start} + {a.step} * c{d})"
    return f"return {ctx.call(x, cs)};"


def _select(ctx, node, out_t):
    x = node.inputs[0]
    in_t = ctx.types[x]
    d = node.attrs.dim % in_t.rank
    cs = coords(out_t.rank)
    cs.insert(d, str(node.attrs.index % in_t.shape[d]))
    return f"return {ctx.call(x, cs)};"


def _pad(ctx, node, out_t):
    x = node.inputs[0]
    in_t = ctx.types[x]
    a = node.attrs
    cs, conds = coords(in_t.rank), []
    for k in range(len(a.pad) // 2):
        d = in_t.rank - 1 - k
        lo = a.pad[2 * k]
        cs[d] = f"(c{d} - ({lo}))"
        conds.append(f"{cs[d]} >= 0 && {cs[d]} < {in_t.shape[d]}")
    vt = ct.value(out_t.dtype)
    v = a.value  # PyTorch pads with the value as a double: 2^53 + 1 pads 2^53 (an int that is one stays as written)
    fill = ct.literal(float(v) if type(v) is int and float(v) != v else v, vt)
    if not conds:
        return f"return {ctx.call(x, cs)};"
    return f"if ({' && '.join(conds)}) return {ctx.call(x, cs)}; return {fill};"


def _cat(ctx, node, out_t):
    d = node.attrs.dim % out_t.rank
    vt = ct.value(out_t.dtype)
    parts, off = [], 0
    for x in node.inputs:
        t = ctx.types[x]
        cs = coords(t.rank)
        cs[d] = f"(c{d} - {off})"
        off += t.shape[d]
        parts.append((off, ct.cvt(ctx.call(x, cs), vt)))
    body = "".join(f"if (c{d} < {end}) return {e}; " for end, e in parts[:-1])
    return body + f"return {parts[-1][1]};"


def _check(ctx, node, var: str, size: int, dim: int, allow_negative=False) -> str:
    lo = f"-{size}" if allow_negative else "0"
    wrap = f" if ({var} < 0) {var} += {size};" if allow_negative else ""
    return (f"if ({var} < {lo} || {var} >= {size}) {{ sf_fail(sf_err, 1, {node.index}, {var}, {dim}, {size}); "
            f"{var} = 0; }}{wrap}")


def _gather(ctx, node, out_t):
    x, idx = node.inputs[0], node.inputs[1]
    xt = ctx.types[x]
    if xt.rank == 0:
        raise Unsupported("gather on a 0-d tensor")
    if ctx.types[idx].rank != xt.rank:  # an empty index of another rank: nothing is read
        return f"return {ct.literal(0, ct.value(out_t.dtype))};"
    d = node.attrs.dim % xt.rank
    body = f"long long ix = (long long)({ctx.call(idx, coords(out_t.rank))}); {_check(ctx, node, 'ix', xt.shape[d], d)} "
    cs = coords(xt.rank)
    cs[d] = f"({ctx.I})ix"
    return body + f"return {ctx.call(x, cs)};"


def _take_along_axis(ctx, node, out_t):
    x, idx = node.inputs[0], node.inputs[1]
    xt, it = ctx.types[x], ctx.types[idx]
    if xt.rank == 0:
        raise Unsupported("take_along_axis on a 0-d tensor")
    d = node.attrs.dim % xt.rank
    ics = ["0" if (k != d and it.shape[k] == 1) else f"c{k}" for k in range(it.rank)]
    body = f"long long ix = (long long)({ctx.call(idx, ics)}); {_check(ctx, node, 'ix', xt.shape[d], d)} "
    xcs = ["0" if (k != d and xt.shape[k] == 1) else f"c{k}" for k in range(xt.rank)]
    xcs[d] = f"({ctx.I})ix"
    return body + f"return {ctx.call(x, xcs)};"


def _index_select(ctx, node, out_t):
    x, idx = node.inputs[0], node.inputs[1]
    xt, it = ctx.types[x], ctx.types[idx]
    if xt.rank == 0:
        raise Unsupported("index_select on a 0-d tensor")
    d = node.attrs.dim % xt.rank
    body = f"long long ix = (long long)({ctx.call(idx, [f'c{d}'] if it.rank else [])}); " \
           f"{_check(ctx, node, 'ix', xt.shape[d], d)} "
    cs = coords(xt.rank)
    cs[d] = f"({ctx.I})ix"
    return body + f"return {ctx.call(x, cs)};"


RENDERERS = {
    Lowering.pointwise: _pointwise, Lowering.fill: _full, Lowering.iota: _iota, Lowering.relinearize: _reshape,
    Lowering.expand: _expand, Lowering.broadcast_in_dim: _broadcast_in_dim, Lowering.permute: _permute,
    Lowering.slice: _slice, Lowering.select: _select, Lowering.pad: _pad, Lowering.cat: _cat, Lowering.gather: _gather,
    Lowering.take_along_axis: _take_along_axis, Lowering.index_select: _index_select,
}
__all__ = ["LAZY_KINDS", "RENDERERS", "Unsupported", "coords", "delinearize", "linearize", "render_lazy"]


def render_lazy(ctx, node, out_t: TensorType) -> str:
    fn = RENDERERS.get(node.op.lowering)
    if fn is None:
        raise Unsupported(f"no lazy renderer for op {node.op.name}")
    return fn(ctx, node, out_t)


_ = DType
