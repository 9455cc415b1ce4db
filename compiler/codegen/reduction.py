"""The reduction family: reductions (sum, prod, amax, amin, mean, argmax, argmin) and inclusive scans
(cumsum, cumprod; cummax, cummin with their positions), one row per warp or per block.
`ReductionRenderer` reads a `KernelInput` (kernel_input.py).
"""

from __future__ import annotations

from ..ops.pointwise import opmath
from ..ops.reductions import reduced_dims
from ..ops.registry import Combiner, Lowering
from . import ctypes_ as ct
from .geometry import THREADS
from .kernel_input import KernelInput
from .layout import numel
from .lazy import Unsupported, delinearize, linearize


class ReductionRenderer:
    LOWERINGS = frozenset({Lowering.reduce, Lowering.argreduce, Lowering.scan, Lowering.argscan})

    def __init__(self, inp: KernelInput):
        self.types, self.I, self.sm, self.loc = inp.types, inp.I, inp.sm, inp.loc
        self._lambdas, self._dst, self._grid = inp.lambdas, inp.dst, inp.grid

    # ---- reductions --------------------------------------------------------------------
    def parts(self, nd):
        x = nd.inputs[0]
        xt = self.types[x]
        ot = self.types[nd.outputs[0]]
        op = nd.op
        if op.lowering is Lowering.argreduce:
            rd = tuple(range(xt.rank)) if nd.attrs.dim is None else ((nd.attrs.dim % xt.rank,) if xt.rank else ())
        else:
            rd = reduced_dims(xt, nd.attrs.dims)
        kd = [k for k in range(xt.rank) if k not in rd]
        R = numel([xt.shape[k] for k in kd])
        K = numel([xt.shape[k] for k in rd])
        return x, xt, ot, op, rd, kd, R, K

    def body(self, nd, row0, rowstep, lane, lanes, reducer, dst_ref) -> str:
        x, xt, ot, op, rd, kd, R, K = self.parts(nd)
        I = self.I
        row_decl = delinearize("row", [xt.shape[k] for k in kd], I, "r")
        k_decl = delinearize("k", [xt.shape[k] for k in rd], I, "s")
        cs = [None] * xt.rank
        for i, k in enumerate(kd):
            cs[k] = f"r{i}"
        for i, k in enumerate(rd):
            cs[k] = f"s{i}"
        _, names = self._lambdas()
        load = f"{names[x]}({', '.join(cs)})"
        if op.lowering is Lowering.argreduce:
            v = ct.value(opmath(xt.dtype))
            W = f"sf_argpair<{v}>"
            cmp = ">" if op.combiner is Combiner.amax else "<"
            comb = (f"[&]({W} a, {W} b) -> {W} {{ if (a.i < 0) return b; if (b.i < 0) return a; "
                    f"bool an = a.v != a.v, bn = b.v != b.v; if (an || bn) {{ if (an && bn) return a.i < b.i ? a : b; return an ? a : b; }} "
                    f"if (a.v {cmp} b.v) return a; if (b.v {cmp} a.v) return b; return a.i < b.i ? a : b; }}")
            ident = f"{W}{{({v})0, -1LL}}"
            elem = f"{W}{{{ct.cvt(load, v)}, (long long)k}}"
            post = "acc.i"
        else:
            wdt = opmath(ot.dtype)
            W = ct.value(wdt)
            fn = ct.combine_fn(op.combiner)
            comb = f"[&]({W} a, {W} b) -> {W} {{ return {fn}::f<{W}>(a, b); }}"
            ident = f"{fn}::id<{W}>()"
            elem = ct.cvt(load, W)
            post = f"(acc / ({W}){K})" if op.divide_by_count else "acc"
        red = reducer.format(W=W)
        return (f"  {{ auto comb = {comb};\n"
                f"  for ({I} row = {row0}; row < ({I}){R}; row += {rowstep}) {{\n"
                f"    {row_decl}\n    {W} acc = {ident};\n"
                f"    for ({I} k = {lane}; k < ({I}){K}; k += {lanes}) {{ {k_decl} acc = comb(acc, {elem}); }}\n"
                f"    acc = {red};\n"
                f"    if ({lane} == 0) {dst_ref}[row] = {ct.cvt(post, ct.storage(ot.dtype))};\n  }} }}")

    def grid_kernel(self, nd):
        """(body, grid, block, smem, vector flag): a warp a row for short rows, else a block."""
        x, xt, ot, op, rd, kd, R, K = self.parts(nd)
        lam, _ = self._lambdas()
        dst = self.loc[nd.outputs[0]].ref
        if K <= 256 and R >= 64:
            body = self.body(nd, f"((({self.I})blockIdx.x * blockDim.x + threadIdx.x) >> 5)",
                                     f"((({self.I})gridDim.x * blockDim.x) >> 5)", "(threadIdx.x & 31)", "32",
                                     "sf_warp_reduce(acc, comb)", dst)
            return (lam + "\n" + body, self._grid(R * 32), THREADS, 0, None)
        threads = 1024 if K >= 4096 else max(32, min(1024, 1 << max(5, (K - 1).bit_length())))
        body = self.body(nd, "blockIdx.x", "gridDim.x", "threadIdx.x", "blockDim.x",
                                 "sf_block_reduce(acc, comb)", dst)
        return (lam + "\n" + body, max(1, min(R, self.sm * 16)), threads, 0, None)

    # ---- scans -------------------------------------------------------------------------
    def scan_body(self, nd, row0, rowstep, dst_ref) -> str:
        if nd.op.lowering is Lowering.argscan:
            return self._argscan_body(nd, row0, rowstep, dst_ref)
        x = nd.inputs[0]
        xt, ot = self.types[x], self.types[nd.outputs[0]]
        I = self.I
        if xt.rank == 0:
            raise Unsupported("scan of a 0-d tensor")
        d = nd.attrs.dim % xt.rank
        L = xt.shape[d]
        other = [k for k in range(xt.rank) if k != d]
        R = numel([xt.shape[k] for k in other])
        W = ct.value(opmath(ot.dtype))
        op = ct.combine_fn(nd.op.combiner)
        cs = [None] * xt.rank
        for i, k in enumerate(other):
            cs[k] = f"r{i}"
        cs[d] = "j"
        _, names = self._lambdas()
        lin = linearize(cs, ot.shape, I)
        return (f"  {{ auto comb = [&]({W} a, {W} b) -> {W} {{ return {op}::f<{W}>(a, b); }};\n"
                f"  for ({I} row = {row0}; row < ({I}){R}; row += {rowstep}) {{\n"
                f"    {delinearize('row', [xt.shape[k] for k in other], I, 'r')}\n"
                f"    {W} carry = {op}::id<{W}>();\n"
                f"    for ({I} base = 0; base < ({I}){L}; base += blockDim.x) {{\n"
                f"      {I} j = base + threadIdx.x;\n"
                f"      {W} xv = j < ({I}){L} ? {ct.cvt(f'{names[x]}({chr(44).join(cs)})', W)} : {op}::id<{W}>();\n"
                f"      {W} tot; {W} yv = comb(carry, sf_block_scan(xv, comb, tot));\n"
                f"      if (j < ({I}){L}) {dst_ref}[{lin}] = {ct.cvt('yv', ct.storage(ot.dtype))};\n"
                f"      carry = comb(carry, tot);\n    }}\n  }} }}")

    def _argscan_body(self, nd, row0, rowstep, dst_ref) -> str:
        """cummax/cummin: a block scan of (value, position) pairs; the later of two equal values (and
        of two NaNs) wins, NaN beats any number (PyTorch). A 0-d input is a row of one."""
        x = nd.inputs[0]
        xt, vt = self.types[x], self.types[nd.outputs[0]]
        I = self.I
        d = nd.attrs.dim % xt.rank if xt.rank else 0
        other = [k for k in range(xt.rank) if k != d]
        L, R = (xt.shape[d] if xt.rank else 1), numel([xt.shape[k] for k in other])
        V = ct.value(opmath(xt.dtype))
        W = f"sf_argpair<{V}>"
        wins = ">=" if nd.op.combiner is Combiner.amax else "<="
        cs = [None] * xt.rank
        for i, k in enumerate(other):
            cs[k] = f"r{i}"
        if xt.rank:
            cs[d] = "j"
        _, names = self._lambdas()
        lin = linearize(cs, xt.shape, I)
        none = f"{W}{{({V})0, -1LL}}"
        comb = (f"[&]({W} a, {W} b) -> {W} {{ if (b.i < 0) return a; if (a.i < 0) return b; "
                f"if (b.v != b.v) return b; if (a.v != a.v) return a; return b.v {wins} a.v ? b : a; }}")
        load = ct.cvt(f"{names[x]}({', '.join(cs)})", V)
        return (f"  {{ auto comb = {comb};\n"
                f"  for ({I} row = {row0}; row < ({I}){R}; row += {rowstep}) {{\n"
                f"    {delinearize('row', [xt.shape[k] for k in other], I, 'r')}\n"
                f"    {W} carry = {none};\n"
                f"    for ({I} base = 0; base < ({I}){L}; base += blockDim.x) {{\n"
                f"      {I} j = base + threadIdx.x;\n"
                f"      {W} xv = j < ({I}){L} ? {W}{{{load}, (long long)j}} : {none};\n"
                f"      {W} tot; {W} yv = comb(carry, sf_block_scan(xv, comb, tot));\n"
                f"      if (j < ({I}){L}) {{ {dst_ref}[{lin}] = {ct.cvt('yv.v', ct.storage(vt.dtype))}; "
                f"{self._dst(nd.outputs[1])}[{lin}] = yv.i; }}\n"
                f"      carry = comb(carry, tot);\n    }}\n  }} }}")

    def scan_kernel(self, nd):
        """(body, grid, block, smem, vector flag): a block per row."""
        xt = self.types[nd.inputs[0]]
        L = xt.shape[nd.attrs.dim % xt.rank] if xt.rank else 1
        R = numel(xt.shape) // max(L, 1) if L else 0
        dst = self.loc[nd.outputs[0]].ref
        body = self.scan_body(nd, "blockIdx.x", "gridDim.x", dst)
        lam, _ = self._lambdas()
        threads = max(32, min(1024, 1 << max(5, (max(L, 1) - 1).bit_length())))
        return (lam + "\n" + body, max(1, min(R, self.sm * 16)), threads, 0, None)
