"""The sort family (argsort, sort, topk): a bitonic sort of (key, index) pairs in shared memory, stable
because ties break by index; in one block, long rank-1 integer rows use the block radix sort
(radix.py). `SortRenderer` reads a `KernelInput` (kernel_input.py).
"""

from __future__ import annotations

from ..limits import SMEM_PER_BLOCK, bitonic_sort_bytes
from ..ops.registry import Lowering
from . import ctypes_ as ct
from . import radix
from .geometry import align
from .kernel_input import KernelInput
from .layout import numel
from .lazy import Unsupported, delinearize, linearize


class SortRenderer:
    LOWERINGS = frozenset({Lowering.sort})

    def __init__(self, inp: KernelInput):
        self.types, self.I, self.sm, self._lambdas, self._dst = inp.types, inp.I, inp.sm, inp.lambdas, inp.dst

    # ---- sorts (bitonic on (key, index) pairs: stable because ties break by index) -------
    def parts(self, nd):
        x = nd.inputs[0]
        xt = self.types[x]
        if xt.rank == 0:
            raise Unsupported("sort of a 0-d tensor")
        d = nd.attrs.dim % xt.rank
        L = xt.shape[d]
        P = 1 << max(0, (max(L, 1) - 1).bit_length())
        V = ct.value(xt.dtype)
        nbytes = bitonic_sort_bytes(P, 8 if V in ("double", "long long") else 4)
        return x, xt, d, L, P, V, nbytes

    def body(self, nd, row0, rowstep, smem_off) -> str:
        """Rows row0, row0 + rowstep, ... sorted by one block in shared memory at `smem_off`."""
        x, xt, d, L, P, V, nbytes = self.parts(nd)
        I = self.I
        # every sort keeps the first out-shape positions of a row (all for sort and argsort)
        desc, k = nd.attrs.descending, self.types[nd.outputs[0]].shape[d]
        other = [j for j in range(xt.rank) if j != d]
        R = numel([xt.shape[j] for j in other])
        cs = [None] * xt.rank
        for i, j in enumerate(other):
            cs[j] = f"r{i}"
        cs[d] = "j"
        _, names = self._lambdas()
        outs = nd.outputs
        idx_out = outs[-1]
        val_out = outs[0] if len(outs) == 2 else None
        out_shape = self.types[idx_out].shape
        lin = linearize(cs, out_shape, I)
        before = ("sf_less(kb, ka)" if desc else "sf_less(ka, kb)", "sf_less(ka, kb)" if desc else "sf_less(kb, ka)")
        stores = f"{self._dst(idx_out)}[{lin}] = (long long)si[j];"
        if val_out is not None:
            stores += f" {self._dst(val_out)}[{lin}] = {ct.cvt('sk[j]', ct.storage(xt.dtype))};"
        return (f"  {{ {V}* sk = ({V}*)(sf_smem + {smem_off}); int* si = (int*)(sf_smem + {smem_off + align(P * (8 if V in ('double', 'long long') else 4))});\n"
                f"  auto before = [&](int a, int b) -> bool {{ int ia = si[a], ib = si[b];\n"
                f"    if (ia >= {L}) return false; if (ib >= {L}) return true;\n"
                f"    {V} ka = sk[a], kb = sk[b]; if ({before[0]}) return true; if ({before[1]}) return false; return ia < ib; }};\n"
                f"  for ({I} row = {row0}; row < ({I}){R}; row += {rowstep}) {{\n"
                f"    {delinearize('row', [xt.shape[j] for j in other], I, 'r')}\n"
                f"    for (int j = threadIdx.x; j < {P}; j += blockDim.x) {{ if (j < {L}) {{ sk[j] = {ct.cvt(f'{names[x]}({chr(44).join(cs)})', V)}; si[j] = j; }} else si[j] = 0x7fffffff; }}\n"
                f"    __syncthreads();\n"
                f"    for (int kk = 2; kk <= {P}; kk <<= 1) for (int s = kk >> 1; s > 0; s >>= 1) {{\n"
                f"      for (int j = threadIdx.x; j < {P}; j += blockDim.x) {{ int p = j ^ s; if (p > j) {{\n"
                f"        bool sw = (j & kk) == 0 ? before(p, j) : before(j, p);\n"
                f"        if (sw) {{ {V} tk = sk[j]; sk[j] = sk[p]; sk[p] = tk; int ti = si[j]; si[j] = si[p]; si[p] = ti; }} }} }}\n"
                f"      __syncthreads();\n    }}\n"
                f"    for (int j = threadIdx.x; j < {k}; j += blockDim.x) {{ {stores} }}\n"
                f"    __syncthreads();\n  }} }}")

    def radix_body(self, nd, smem_off, scratch) -> tuple[str, int]:
        """Stable LSD radix sort of one rank-1 integer row in one block of 1024 threads (see
        radix.py): 8-bit digits over only the bits of the keys' range, warp-level ranking. Its
        scratch starts at byte `scratch`; (the body, where the scratch used ends)."""
        x, xt, d, L, P, V, nbytes = self.parts(nd)
        if xt.rank != 1:
            raise Unsupported("radix sort of a multi-row tensor in one block")
        desc, k = nd.attrs.descending, self.types[nd.outputs[0]].shape[0]
        _, names = self._lambdas()
        base = scratch
        signed = xt.dtype.is_signed
        bits = xt.dtype.itemsize * 8
        flip = f"(1ULL << {bits - 1})" if signed else "0ULL"
        mask = "~0ULL" if bits == 64 else f"((1ULL << {bits}) - 1ULL)"

        def key(j):
            u = f"(((unsigned long long)(long long)({names[x]}({j})) & {mask}) ^ {flip})"
            return f"(~{u} & {mask})" if desc else u

        def value(u):  # the element whose key is u
            if desc:
                u = f"(~({u}) & {mask})"
            return ct.cvt(f"({V})(long long)(({u}) ^ {flip})", ct.storage(xt.dtype))

        idx_ref = self._dst(nd.outputs[-1])
        val_ref = self._dst(nd.outputs[0]) if len(nd.outputs) == 2 else None
        return radix.radix_body(
            L=L, k=k, key=key, base=base, smem_off=smem_off,
            store_idx=lambda pos, i: f"{idx_ref}[{pos}] = (long long)({i});",
            store_val=(lambda pos, u: f"{val_ref}[{pos}] = {value(u)};") if val_ref is not None else None), \
            align(base + radix.scratch_bytes(L))

    def grid_kernel(self, nd):
        """(body, grid, block, smem, vector flag): a block per row."""
        x, xt, d, L, P, V, nbytes = self.parts(nd)
        if nbytes > SMEM_PER_BLOCK:
            raise Unsupported(f"sort of {L} elements does not fit in shared memory")
        R = numel(xt.shape) // max(L, 1) if L else 0
        lam, _ = self._lambdas()
        body = self.body(nd, "blockIdx.x", "gridDim.x", 0)
        threads = max(32, min(1024, P // 2))
        return (lam + "\n" + body, max(1, min(R, self.sm * 16)), threads, nbytes, None)
