"""The row-persistent family: a `row_reduction` segment (compiler/segmenter/row_fusion.py) as one
kernel in which a block (or a warp, for short rows) owns a row at a time.

Per row: the row's cacheable inputs are copied once into shared memory (16-byte vector loads in
the vector variant), then each reduction combines its input's lambda over the row and a block
(warp) reduction hands every thread the result, which later lambdas read as a register; last,
the row-shaped outputs are stored element by element and the per-row outputs once. Rows whose
inputs do not fit `limits.ROW_CACHE_BYTES` re-read them from global memory in each pass (two
passes or more: the formulation nvFuser falls back to past its persistent buffer limit).

Everything op-specific comes from the registry's traits: the combiner and identity of each
reduction (`OpDef.combiner`, `divide_by_count`) and the pointwise renderings (lazy.py, through
the shared lambdas). A mixin of `SegmentCodegen` (segment.py).
"""

from __future__ import annotations

from ..limits import ROW_CACHE_BYTES, SMEM_PER_BLOCK, row_threads
from ..ops.pointwise import opmath
from ..segmenter.row_fusion import analyze
from . import ctypes_ as ct
from .geometry import align
from .layout import contiguous_strides, numel
from .lazy import Unsupported, delinearize, linearize

ROWS_PER_SM = 32  # grid cap, in blocks per SM (the row loop strides over the rest)
WARP_BLOCK = 256  # threads of a block of warp-per-row slots


class RowReductionKernels:
    def _row_kernels(self) -> list:
        """(body, grid, block, smem, vector flag) of the segment's kernel: the vector variant first
        (the runtime runs it when every pointer is aligned), then the scalar one."""
        region, why = analyze(self.fusion, self.seg.nodes, self.seg.inputs, self.seg.outputs, self.types)
        if region is None:
            raise Unsupported(f"not a row-persistent region: {why}")
        self.scratch_used = 0  # reduction results live in registers
        R, K = numel(region.kept), numel(region.row)
        lanes = row_threads(K, R, self.sm)
        block = WARP_BLOCK if lanes == 32 else lanes
        slots = block // lanes
        cache = [x for x in region.cacheable if self.strides[x] == contiguous_strides(self.types[x].shape)]
        offs, per_slot = {}, 0
        for x in cache:
            offs[x] = per_slot
            per_slot = align(per_slot + K * self.types[x].dtype.itemsize)
        if per_slot * slots > min(ROW_CACHE_BYTES, SMEM_PER_BLOCK) or K == 0:
            cache, offs, per_slot = [], {}, 0
        grid = max(1, min(-(-R // slots), self.sm * ROWS_PER_SM))
        smem = per_slot * slots
        geo = (region, R, K, lanes, slots, cache, offs, per_slot)
        out = []
        if cache and K % 4 == 0:
            out.append((self._row_body(geo, vector=True), grid, block, smem, True))
        out.append((self._row_body(geo, vector=False), grid, block, smem, None))
        return out

    def _row_body(self, geo, vector: bool) -> str:
        region, R, K, lanes, slots, cache, offs, per_slot = geo
        I = self.I
        r, k = region.rank, len(region.dims)
        red_nodes = [self.fusion.nodes[p] for p in region.reductions]
        regs = {nd.outputs[0]: f"rv{i}" for i, nd in enumerate(red_nodes)}
        chs = {x: f"ch{i}" for i, x in enumerate(cache)}
        rowc = [f"r{i}" for i in range(r - k)]

        def leaf(n):
            if n in regs:
                return f"return {regs[n]};"
            if n in chs:
                cs = [f"c{d}" for d in range(r - k, r)]
                return f"return {ct.cvt(f'{chs[n]}[{linearize(cs, region.row, I)}]', ct.value(self.types[n].dtype))};"
            return None

        lam, names = self._lambdas(leaf=leaf)
        sync = "__syncthreads();" if slots == 1 else "__syncwarp();"
        lines = [f"  const int lane = threadIdx.x % {lanes}, slot = threadIdx.x / {lanes};"]
        for nd in red_nodes:
            lines.append(f"  {ct.value(self.types[nd.outputs[0]].dtype)} {regs[nd.outputs[0]]} = 0;")
        for x in cache:
            st = ct.storage(self.types[x].dtype)
            lines.append(f"  {st}* {chs[x]} = ({st}*)(sf_smem + slot * {per_slot} + {offs[x]});")
        lines.append(lam)
        lines.append(f"  for ({I} row = ({I})blockIdx.x * {slots} + slot; row < ({I}){R}; "
                     f"row += ({I})gridDim.x * {slots}) {{")
        lines.append(f"    {delinearize('row', region.kept, I, 'r')}")
        for x in cache:
            lines.append(self._row_load(x, chs[x], K, lanes, vector))
        if cache:
            lines.append(f"    {sync}")
        for nd in red_nodes:
            lines.append(self._row_reduce(nd, names, rowc, regs[nd.outputs[0]], lanes))
        lines.append(self._row_stores(region, names, rowc, K, lanes))
        if cache:
            lines.append(f"    {sync}")  # the next row overwrites the cache
        lines.append("  }")
        return "\n".join(lines)

    def _row_load(self, x, ch, K, lanes, vector) -> str:
        I = self.I
        src = self.loc[x].ref
        if vector:
            v = f"sf_v4<{ct.storage(self.types[x].dtype)}>"
            return (f"    for ({I} q = lane; q < ({I}){K // 4}; q += {lanes}) (({v}*){ch})[q] = "
                    f"sf_vload((const {v}*){src} + row * {K // 4} + q);")
        return f"    for ({I} j = lane; j < ({I}){K}; j += {lanes}) {ch}[j] = {src}[row * {K} + j];"

    def _row_reduce(self, nd, names, rowc, reg, lanes) -> str:
        I = self.I
        x = nd.inputs[0]
        xt, ot = self.types[x], self.types[nd.outputs[0]]
        red_shape = xt.shape[len(rowc):]
        Ki = numel(red_shape)
        W = ct.value(opmath(ot.dtype))
        fn = ct.combine_fn(nd.op.combiner)
        sc = [f"s{i}" for i in range(len(red_shape))]
        load = ct.cvt(f"{names[x]}({', '.join(rowc + sc)})", W)
        post = f"(acc / ({W}){Ki})" if nd.op.divide_by_count else "acc"
        red = "sf_block_reduce(acc, comb)" if lanes > 32 else "sf_shfl(sf_warp_reduce(acc, comb), 0)"
        rounded = ct.cvt(ct.cvt(post, ct.storage(ot.dtype)), ct.value(ot.dtype))
        return (f"    {{ auto comb = [&]({W} a, {W} b) -> {W} {{ return {fn}::f<{W}>(a, b); }};\n"
                f"      {W} acc = {fn}::id<{W}>();\n"
                f"      #pragma unroll 8\n"
                f"      for ({I} k = lane; k < ({I}){Ki}; k += {lanes}) {{ {delinearize('k', red_shape, I, 's')} "
                f"acc = comb(acc, {load}); }}\n"
                f"      acc = {red};\n      {reg} = {rounded}; }}")

    def _row_stores(self, region, names, rowc, K, lanes) -> str:
        I = self.I
        k = len(region.dims)
        out = []
        if region.full_outputs:
            sc = [f"s{i}" for i in range(k)]
            stores = " ".join(
                f"{self.loc[o].ref}[row * {K} + j] = "
                f"{ct.cvt(f'{names[o]}({chr(44).join(rowc + sc)})', ct.storage(self.types[o].dtype))};"
                for o in region.full_outputs)
            out.append(f"    for ({I} j = lane; j < ({I}){K}; j += {lanes}) {{ "
                       f"{delinearize('j', region.row, I, 's')} {stores} }}")
        per = []
        for o in region.row_outputs:
            t = self.types[o]
            cs = rowc + ["0"] * (t.rank - len(rowc))
            per.append(f"{self.loc[o].ref}[row] = {ct.cvt(f'{names[o]}({chr(44).join(cs)})', ct.storage(t.dtype))};")
        if per:
            out.append("    if (lane == 0) { " + " ".join(per) + " }")
        return "\n".join(out)
