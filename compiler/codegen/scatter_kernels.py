"""The scatter family (scatter, index_add, index_put): the per-source statements, the grid-stride
loops, and the grid-mode kernels (privatized shared-memory histograms, or global atomics over L2
windows; building blocks in scatter.py). `ScatterRenderer` reads a `KernelInput` (kernel_input.py).
"""

from __future__ import annotations

from ..ops.registry import Lowering, OpKind, Scalar
from . import ctypes_ as ct
from . import scatter as _sc
from .geometry import THREADS, align
from .kernel_input import KernelInput, Rendered
from .layout import numel
from .lazy import Unsupported, coords, delinearize, linearize
from .pointwise import LambdaCtx


# What one source of each scatter-family op writes: (domain shape, its coordinates, statements
# computing the index `ix` with its check, target coordinates, value), by the op's lowering.
def _scatter_source(ctx, nd, selft, vt, chk):
    d = nd.attrs.dim % selft.rank
    idx, src = nd.inputs[1], nd.inputs[2]
    dom = ctx.types[idx].shape
    cs = coords(len(dom))
    if len(dom) != selft.rank or (not isinstance(src, Scalar) and ctx.types[src].rank != selft.rank):
        # an empty index of another rank (or a source of another rank): no source, self unchanged
        return dom, cs, "long long ix = 0;", ["0"] * selft.rank, ct.literal(0, vt)
    pre = f"long long ix = (long long)({ctx.call(idx, cs)}); {chk('ix', selft.shape[d], d, index=idx)}"
    tc = list(cs)
    tc[d] = f"({ctx.I})ix"
    return dom, cs, pre, tc, ct.cvt(ctx.call(src, cs), vt)


def _index_add_source(ctx, nd, selft, vt, chk):
    d = nd.attrs.dim % selft.rank
    idx, src = nd.inputs[1], nd.inputs[2]
    dom = ctx.types[src].shape
    cs = coords(len(dom))
    it = ctx.types[idx]
    pre = f"long long ix = (long long)({ctx.call(idx, [cs[d]] if it.rank else [])}); {chk('ix', selft.shape[d], d)}"
    tc = list(cs)
    tc[d] = f"({ctx.I})ix"
    alpha = nd.attrs.alpha
    val = ct.cvt(ctx.call(src, cs), vt)
    if alpha != 1:
        val = f"sf_mul({val}, {ct.literal(alpha, vt)})"
    return dom, cs, pre, tc, val


def _index_put_source(ctx, nd, selft, vt, chk):
    idx, vals = nd.inputs[1], nd.inputs[2]
    it = ctx.types[idx]
    dom = tuple(it.shape) + tuple(selft.shape[1:])
    cs = coords(len(dom))
    pre = f"long long ix = (long long)({ctx.call(idx, cs[:it.rank])}); {chk('ix', selft.shape[0], 0, neg=True)}"
    tc = [f"({ctx.I})ix"] + cs[it.rank:]
    if isinstance(vals, Scalar):
        val = ct.literal(vals.value, vt)
    else:
        vtt = ctx.types[vals]
        off = len(dom) - vtt.rank
        vcs = ["0" if vtt.shape[j] == 1 else cs[j + off] for j in range(vtt.rank)]
        val = ct.cvt(ctx.call(vals, vcs), vt)
    return dom, cs, pre, tc, val


_SOURCES = {Lowering.scatter: _scatter_source, Lowering.index_add: _index_add_source,
            Lowering.index_put: _index_put_source}


class ScatterRenderer:
    LOWERINGS = frozenset(_SOURCES)

    def __init__(self, inp: KernelInput):
        self.seg, self.types, self.strides, self.loc, self.stage = inp.seg, inp.types, inp.strides, inp.loc, inp.stage
        self.I, self.sm, self.copies, self.producer, self.aliased = inp.I, inp.sm, inp.copies, inp.producer, inp.aliased
        self._lambdas, self._dst, self._grid = inp.lambdas, inp.dst, inp.grid

    # ---- scatter -----------------------------------------------------------------------
    def parts(self, nd):
        """(domain shape, statements computing `lin` (target offset) + `val`, reduce, value type)."""
        selft = self.types[nd.inputs[0]]
        if selft.rank == 0:
            raise Unsupported("scatter into a 0-d tensor")
        _, names = self._lambdas()
        I = self.I
        vt = ct.value(selft.dtype)
        ctx = LambdaCtx(self.types, I, names)

        def chk(var, size, dim, neg=False, index=None):
            if index is not None and self._index_within(index, size):
                return ""  # provably in range: no check, so the kernel cannot fail on it
            lo = f"-{size}" if neg else "0"
            wrap = f" if ({var} < 0) {var} += {size};" if neg else ""
            return (f"if ({var} < {lo} || {var} >= {size}) {{ sf_fail(sf_err, 1, {nd.index}, {var}, {dim}, {size}); "
                    f"continue; }}{wrap}")

        source = _SOURCES.get(nd.op.lowering)
        if source is None:
            raise Unsupported(f"scatter op {nd.op.name}")
        dom, cs, pre, tc, val = source(ctx, nd, selft, vt, chk)
        lin = linearize(tc, selft.shape, I)
        return dom, pre, lin, val, nd.attrs.reduce, nd.attrs.include_self, selft, cs

    def _small_int_counts(self, nd, n_dom: int) -> bool:
        """True for a `scatter` add into an integer target of a constant integer c (a histogram:
        `full_like(ids, 1)`) with n_dom * |c| < 2^31, so per-block partial sums fit 32 bits."""
        if nd.op.lowering is not Lowering.scatter or not self.types[nd.outputs[0]].dtype.is_int:
            return False
        src = nd.inputs[2]
        if isinstance(src, Scalar):
            c = src.value
        else:
            prod = self.producer.get(src)
            if prod is None or prod.op.kind is not OpKind.creation:
                return False
            c = getattr(prod.attrs, "value", None)
        if isinstance(c, bool):
            c = int(c)
        return isinstance(c, int) and n_dom * abs(c) < 2**31

    def _index_within(self, name, size) -> bool:
        """True when every value of tensor `name` lies in [0, size): the indices a sort-kind op
        (argsort, sort, topk: indices are their last output) of this segment produces along a row
        of at most `size` elements (MoE's inverse
        permutation scatters by an argsort's order, so its kernel needs no check and cannot fail)."""
        nd = self.producer.get(name)
        if nd is None or nd.op.kind is not OpKind.sort or name != nd.outputs[-1]:
            return False
        xt = self.types[nd.inputs[0]]
        row = xt.shape[nd.attrs.dim % xt.rank] if xt.rank else 1
        return row <= size

    def _scatter_loop(self, nd, start, step, target_ref, mode, W=None, window=None) -> str:
        """mode: 'none' store, 'identity' store identity, else atomic reduce into target (type W).
        window (lo, hi): apply only the sources whose target offset falls in it."""
        dom, pre, lin, val, reduce, include_self, selft, cs = self.parts(nd)
        I = self.I
        act = _sc.act(self, selft, reduce, lin, val, target_ref, mode, W, window)
        n = numel(dom)
        return (f"  for ({I} l = {start}; l < ({I}){n}; l += {step}) {{\n"
                f"    {delinearize('l', dom, I)}\n    {pre}\n    {act}\n  }}")

    def _init_target(self, nd, target_ref, start, step, window=None, S=None) -> str:
        """Copy self into the target (of storage type S; default: the output's)."""
        selfn = nd.inputs[0]
        t = self.types[nd.outputs[0]]
        _, names = self._lambdas()
        I = self.I
        lo, hi = window or (0, numel(t.shape))
        return (f"  for ({I} l = ({I}){lo} + {start}; l < ({I}){hi}; l += {step}) {{\n"
                f"    {delinearize('l', t.shape, I)}\n"
                f"    {target_ref}[l] = {ct.cvt(f'{names[selfn]}({chr(44).join(coords(t.rank))})', S or ct.storage(t.dtype))};\n  }}")

    def grid_kernels(self, nd, scratch: int) -> Rendered:
        """The kernels of scatter `nd` in grid mode; the segment's scratch ends at byte `scratch`
        (a float accumulator goes after it)."""
        dom, pre, lin, val, reduce, include_self, selft, cs = self.parts(nd)
        o = nd.outputs[0]
        dst = self.loc[o].ref
        I = self.I
        gstart = f"(({I})blockIdx.x * blockDim.x + threadIdx.x)"
        gstep = f"(({I})gridDim.x * blockDim.x)"
        lam, _ = self._lambdas()
        n_out, n_dom = numel(selft.shape), numel(dom)
        res = []
        if reduce == "none":
            if o not in self.aliased:
                res.append((lam + "\n" + self._init_target(nd, dst, gstart, gstep), self._grid(n_out), THREADS, 0, None))
            res.append((lam + "\n" + self._scatter_loop(nd, gstart, gstep, dst, "store"), self._grid(n_dom), THREADS, 0, None))
            return Rendered(res, scratch)
        vec = _sc.vector_plan(self, nd)  # (leaves, V): a 16-byte-load variant goes before each scalar kernel
        Wd = ct.WIDE[selft.dtype]
        wsize = 8 if Wd in ("long long", "double") else 4
        # acc: what the atomics combine into (storage St). A 16-bit float sum or product goes into a
        # float copy of the target in scratch, rounded into the target by a last kernel.
        acc, St, W = dst, ct.storage(selft.dtype), None
        wide = _sc.rounds_every_source(selft, reduce)
        if wide:
            off, scratch = scratch, align(scratch + n_out * 4)
            acc, St, W = f"((float*)(sf_scratch + {off}))", "float", "float"
        fresh = wide or o not in self.aliased  # acc does not hold self's data yet
        if n_out * wsize <= _sc.PRIV_SMEM and n_dom >= 8 * n_out and n_dom >= 4096:
            if fresh:
                res.append((lam + "\n" + self._init_target(nd, acc, gstart, gstep, S=St), self._grid(n_out), THREADS, 0, None))
            if not include_self:
                res.append((lam + "\n" + self._scatter_loop(nd, gstart, gstep, acc, "identity", W=W), self._grid(n_dom),
                            THREADS, 0, None))
            # Privatize: per-block histograms in shared memory (one replica per group of warps, so
            # warps rarely contend for a bin), one global atomic per bin per block.
            op = ct.combine_fn(reduce)
            threads = _sc.HIST_THREADS
            reps = 1
            while reps < min(32, threads // 32) and n_out * wsize * reps * 2 <= _sc.PRIV_SMEM:
                reps *= 2
            head = (lam + "\n"
                    f"  {Wd}* h = ({Wd}*)sf_smem + (threadIdx.x >> 5) % {reps} * {n_out};\n"
                    f"  for (int j = threadIdx.x; j < {n_out * reps}; j += blockDim.x) (({Wd}*)sf_smem)[j] = {op}::id<{Wd}>();\n"
                    f"  __syncthreads();\n")
            tail = ("\n  __syncthreads();\n"
                    f"  for (int j = threadIdx.x; j < {n_out}; j += blockDim.x) {{ {Wd} hv = (({Wd}*)sf_smem)[j];\n"
                    f"    for (int r = 1; r < {reps}; ++r) hv = {op}::f<{Wd}>(hv, (({Wd}*)sf_smem)[r * {n_out} + j]);\n"
                    f"    if (hv != {op}::id<{Wd}>()) sf_atomic<{op}, {St}, {Wd}>(&{acc}[j], hv); }}")
            smem = align(n_out * wsize * reps)
            if vec is not None:
                leaves, V = vec
                loop = _sc.vector_loop(
                    self, nd, leaves, V, threads, pre + "\n" + _sc.act(self, selft, reduce, lin, val, "h", "atomic", Wd),
                    self._scatter_loop(nd, f"sf_l0 + {gstart}", gstep, "h", "atomic", W=Wd))
                res.append((head + loop + tail, _sc.vector_blocks(self, n_dom, V, threads, _sc.HIST_BLOCKS_PER_SM, 16),
                            threads, smem, True))
            blocks = max(1, min(-(-n_dom // (threads * 16)), self.sm * _sc.HIST_BLOCKS_PER_SM))
            res.append((head + self._scatter_loop(nd, gstart, gstep, "h", "atomic", W=Wd) + tail, blocks, threads, smem, None))
            return Rendered(res + self._round_wide(nd, acc, dst, gstart, gstep) if wide else res, scratch)
        # Global atomics. A target larger than L2 is split into windows, one pass over the sources
        # each, so the random atomics of a pass hit L2 (see scatter.py).
        wins = _sc.window_bounds(n_out, _sc.windows(n_out * (4 if wide else selft.dtype.itemsize), n_dom))
        # initializing each window right before its pass also leaves it hot in L2 (stream order
        # makes the copy complete before the pass starts)
        init_each = fresh and include_self and wins[0] is not None
        if fresh and not init_each:
            res.append((lam + "\n" + self._init_target(nd, acc, gstart, gstep, S=St), self._grid(n_out), THREADS, 0, None))
        if not include_self:
            res.append((lam + "\n" + self._scatter_loop(nd, gstart, gstep, acc, "identity", W=W), self._grid(n_dom),
                        THREADS, 0, None))
        for win in wins:
            if init_each:
                res.append((lam + "\n" + self._init_target(nd, acc, gstart, gstep, win, S=St), self._grid(win[1] - win[0]),
                            THREADS, 0, None))
            if vec is not None:
                leaves, V = vec
                threads = _sc.ATOMIC_THREADS
                loop = _sc.vector_loop(
                    self, nd, leaves, V, threads,
                    pre + "\n" + _sc.act(self, selft, reduce, lin, val, acc, "atomic", W=W, window=win),
                    self._scatter_loop(nd, f"sf_l0 + {gstart}", gstep, acc, "atomic", W=W, window=win))
                res.append((lam + "\n" + loop, _sc.vector_blocks(self, n_dom, V, threads, _sc.ATOMIC_VEC_BLOCKS_PER_SM),
                            threads, 0, True))
            res.append((lam + "\n" + self._scatter_loop(nd, gstart, gstep, acc, "atomic", W=W, window=win),
                        self._grid(n_dom, per_sm=_sc.ATOMIC_BLOCKS_PER_SM), THREADS, 0, None))
        return Rendered(res + self._round_wide(nd, acc, dst, gstart, gstep) if wide else res, scratch)

    def _round_wide(self, nd, acc: str, dst: str, gstart: str, gstep: str) -> list:
        """The last kernel of a 16-bit float sum or product: its float accumulator, rounded once."""
        t = self.types[nd.outputs[0]]
        body = (f"  for ({self.I} l = {gstart}; l < ({self.I}){numel(t.shape)}; l += {gstep}) "
                f"{dst}[l] = {ct.cvt(f'{acc}[l]', ct.storage(t.dtype))};")
        return [(body, self._grid(numel(t.shape)), THREADS, 0, None)]

