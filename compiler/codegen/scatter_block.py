"""Scatters inside a single-block segment: batched index loads, warp-group replicas of the target in
shared memory, and the multi-block histogram that shares a long first phase among the grid's
blocks. `BlockScatterRenderer` extends the grid family's `ScatterRenderer` (scatter_kernels.py).
"""

from __future__ import annotations

import re

from ..limits import HIST_BLOCK_SOURCES
from ..ops.registry import OpKind
from . import ctypes_ as ct
from . import scatter as _sc
from .geometry import align
from .layout import numel
from .lazy import delinearize
from .scatter_kernels import ScatterRenderer


class BlockScatterRenderer(ScatterRenderer):
    def _block_scatter_loop(self, nd, target_ref, mode, W=None, blocks: int = 1) -> str:
        """The single-block scatter loop, batched: each thread first loads the indices of its next
        BLOCK_BATCH sources, then applies them. One SM walks the whole domain, so without batching
        every iteration waits one global-load latency (the compiler does not move loads above the
        previous iteration's atomic). Bad indices are reported after the loop. With `blocks` > 1
        the blocks of the grid share the domain (the first phase of a multi-block histogram)."""
        dom, pre, lin, val, reduce, include_self, selft, cs = self.parts(nd)
        m = _PRE_INDEX.match(pre)
        U = BLOCK_BATCH
        start, step = "threadIdx.x", f"{U} * blockDim.x"
        if blocks > 1:
            start, step = f"(blockIdx.x * {U} * blockDim.x + threadIdx.x)", f"{U} * blockDim.x * {blocks}"
        if m is None or self.I != "int":
            s0, st = (("threadIdx.x", "blockDim.x") if blocks == 1 else
                      ("(blockIdx.x * blockDim.x + threadIdx.x)", f"(blockDim.x * {blocks})"))
            return _defer_index_errors(self._scatter_loop(nd, s0, st, target_ref, mode, W))
        expr, rest = m.group(1), m.group(2)
        act = _sc.act(self, selft, reduce, lin, val, target_ref, mode, W)
        n = numel(dom)
        # (upper-case L0: the outer loop is not one of the unrolled block loops)
        loop = (f"  for (int L0 = {start}; L0 < {n}; L0 += {step}) {{\n"
                f"    long long sf_ix[{U}];\n"
                f"    #pragma unroll\n"
                f"    for (int u = 0; u < {U}; ++u) {{ int l = L0 + u * blockDim.x; if (l < {n}) {{\n"
                f"      {delinearize('l', dom, 'int')}\n      sf_ix[u] = (long long)({expr}); }} }}\n"
                f"    #pragma unroll\n"
                f"    for (int u = 0; u < {U}; ++u) {{ int l = L0 + u * blockDim.x; if (l >= {n}) break;\n"
                f"      {delinearize('l', dom, 'int')}\n      long long ix = sf_ix[u]; {rest}\n      {act}\n    }}\n  }}")
        return _defer_index_errors(loop)

    def _privatized(self, nd):
        """(replica type, target accumulation type, replica bytes, replicas) when a single-block
        scatter accumulates in warp-group replicas of its target in shared memory; else None."""
        dom, pre, lin, val, reduce, include_self, selft, cs = self.parts(nd)
        n_out, n_dom = numel(selft.shape), numel(dom)
        Wd = ct.WIDE[selft.dtype]
        Wt = Wd
        if reduce == "add" and self._small_int_counts(nd, n_dom):
            Wd = "int"  # 32-bit shared atomics: 64-bit ones cost several times more on one SM
        wsz = 8 if Wd in ("long long", "double") else 4
        reps = 1
        while reps < 32 and n_out * wsz * reps * 2 <= 64 * 1024:
            reps *= 2
        if reduce != "none" and include_self and n_dom >= 8 * n_out and reps >= 2 and nd.outputs[0] in self.stage:
            return Wd, Wt, wsz, reps
        if _sc.rounds_every_source(selft, reduce) and n_out * wsz <= WIDE_REPLICA_BYTES:
            return Wd, Wt, wsz, reps  # (float replicas: the target rounds once, when they are folded in)
        return None

    def histogram_blocks(self, phases) -> int:
        """Blocks for a single-block segment that starts with a privatized scatter over many
        sources: that phase is bound by one SM's loads (MoE histogram of 32768 ids: 7 us), so the
        grid's blocks share it, each writing its partial histogram to scratch; the last block to
        finish (a ticket counter) combines them and runs the rest of the segment alone."""
        if not phases or phases[0][0] != "anchor" or phases[0][1].op.kind is not OpKind.scatter:
            return 1
        nd = phases[0][1]
        if self._privatized(nd) is None:
            return 1
        blocks = min(self.sm, -(-numel(self.parts(nd)[0]) // HIST_BLOCK_SOURCES))
        return blocks if blocks >= 4 else 1

    def block_body(self, nd, free_off: int, scratch: int, blocks: int = 1) -> tuple[str, int, int]:
        """(code, extra shared memory at free_off, where the segment's scratch ends after it: it
        ends at byte `scratch` before). Many sources per target: warp-group replicas of the target
        in shared memory take the atomics (little contention), then one thread per element
        combines them into the target. With `blocks` > 1, see `histogram_blocks`."""
        dom, pre, lin, val, reduce, include_self, selft, cs = self.parts(nd)
        o = nd.outputs[0]
        staged = o in self.stage
        tgt = self._dst(o)
        out = []
        n_out = numel(selft.shape)
        priv = self._privatized(nd)
        if priv is not None:
            Wd, Wt, wsz, reps = priv
            op = ct.combine_fn(reduce)
            S = ct.storage(selft.dtype)
            rep = f"(({Wd}*)(sf_smem + {free_off}))"
            init = [self._init_target(nd, tgt, "threadIdx.x", "blockDim.x")]
            if not include_self:  # the targeted elements start from the identity, not from self
                init += ["  __syncthreads();", self._block_scatter_loop(nd, tgt, "identity")]
            if blocks == 1:
                out.extend(init)
            out.append(f"  for (int j = threadIdx.x; j < {n_out * reps}; j += blockDim.x) {rep}[j] = {op}::id<{Wd}>();")
            out.append("  __syncthreads();")
            out.append(f"  {{ {Wd}* sf_rep = {rep} + ((threadIdx.x >> 5) % {reps}) * {n_out};")
            out.append(self._block_scatter_loop(nd, "sf_rep", "atomic", W=Wd, blocks=blocks) + " }")
            out.append("  __syncthreads();")
            fold = (f"{Wd} hv = {rep}[j];\n"
                    f"    for (int r = 1; r < {reps}; ++r) hv = {op}::f<{Wd}>(hv, {rep}[r * {n_out} + j]);")
            if blocks > 1:
                part, scratch = scratch, align(scratch + blocks * n_out * wsz)
                P = f"(({Wd}*)(sf_scratch + {part}))"
                out.append(f"  for (int j = threadIdx.x; j < {n_out}; j += blockDim.x) {{ {fold}\n"
                           f"    {P}[blockIdx.x * {n_out} + j] = hv; }}")
                out.append(_LAST_BLOCK)
                out.extend(init)
                out.append("  __syncthreads();")
                fold = (f"{Wd} hv = {op}::id<{Wd}>();\n"
                        f"    for (int b = 0; b < {blocks}; ++b) hv = {op}::f<{Wd}>(hv, __ldcg(&{P}[b * {n_out} + j]));")
            out.append(f"  for (int j = threadIdx.x; j < {n_out}; j += blockDim.x) {{ {fold}\n"
                       f"    if (hv != {op}::id<{Wd}>()) {tgt}[j] = sf_cvt<{S}>({op}::f<{Wt}>(sf_cvt<{Wt}>({tgt}[j]), ({Wt})hv)); }}")
            t = self.types[o]
            out.append("  __syncthreads();")
            out.append(f"  for (int j = threadIdx.x; j < {numel(t.shape)}; j += blockDim.x) {self.loc[o].ref}[j] = {tgt}[j];")
            return "\n".join(out), n_out * wsz * reps, scratch
        if staged or o not in self.aliased:
            out.append(self._init_target(nd, tgt, "threadIdx.x", "blockDim.x"))
            out.append("  __syncthreads();")
        if reduce != "none" and not include_self:
            out.append(self._block_scatter_loop(nd, tgt, "identity"))
            out.append("  __syncthreads();")
        out.append(self._block_scatter_loop(nd, tgt, "store" if reduce == "none" else "atomic"))
        if staged:
            t = self.types[o]
            out.append("  __syncthreads();")
            out.append(f"  for (int j = threadIdx.x; j < {numel(t.shape)}; j += blockDim.x) {self.loc[o].ref}[j] = {tgt}[j];")
        return "\n".join(out), 0, scratch



# Single-block scatter loops load this many indices per thread before applying them.
BLOCK_BATCH = 8
# A 16-bit float sum or product accumulates in float replicas of its target (`_privatized`) up to
# this size: every target of a single-block segment (at most 32768 elements). A segment whose
# shared memory then passes SMEM_PER_BLOCK is split; grid kernels accumulate in scratch.
WIDE_REPLICA_BYTES = 128 * 1024
# Sources per block of a multi-block histogram (`histogram_blocks`): limits.HIST_BLOCK_SOURCES, one
# batch of its 1024 threads (BLOCK_BATCH of them each); at least 4 blocks.
# The end of a multi-block histogram's shared phase: each block's partial is stored; the last block
# to take a ticket (sf_ctr[0], zero between launches: that block zeroes it again) goes on alone.
_LAST_BLOCK = """  { __shared__ int sf_last; __threadfence(); __syncthreads();
    if (threadIdx.x == 0) sf_last = atomicAdd(sf_ctr, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!sf_last) return;
    if (threadIdx.x == 0) *sf_ctr = 0u;
    __threadfence(); }"""
_PRE_INDEX = re.compile(r"long long ix = \(long long\)\((.*)\); (if \(ix < .*)$", re.S)
_FAIL = re.compile(r"sf_fail\(sf_err, 1, (\d+), (\w+), (-?\d+), (\d+)\); continue;")


def _defer_index_errors(loop: str) -> str:
    """A single-block scatter loop reports a bad index after the loop instead of inside it: a
    global store in the loop body would keep the compiler from issuing later iterations' index
    loads early (they might alias the error word). The bad index is still skipped, and the run
    still fails naming the op and one bad index."""
    found = _FAIL.findall(loop)
    if not found or len({(op, dim, size) for op, _, dim, size in found}) != 1:
        return loop
    op, _, dim, size = found[0]
    body = _FAIL.sub(lambda m: f"sf_bad = {m.group(2)}; sf_has_bad = 1; continue;", loop)
    return ("  { long long sf_bad = 0; int sf_has_bad = 0;\n" + body +
            f"\n  if (sf_has_bad) sf_fail(sf_err, 1, {op}, sf_bad, {dim}, {size}); }}")
