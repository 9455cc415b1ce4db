"""The row-persistent family: a `row_reduction` segment (compiler/segmenter/row_fusion.py) as one
kernel in which a block (or a warp, for short rows) owns a row at a time.

Per row: the row's cacheable inputs are read once, then each reduction combines its input's
lambda over the row and a block (warp) reduction hands every thread the result, which later
lambdas read as a register; last, the row-shaped outputs are stored and the per-row outputs once.
Where the row is kept:

- registers, when each thread's share of the cached rows is at most `limits.ROW_REGISTER_ELEMS`
  and every op reads them at the element it computes (the plan's `RowKernel.in_place`): thread `lane`
  owns elements (lane + i * lanes) * V + e (V = 4 in the vector variant, 16-byte or 8-byte
  vector loads and stores),
  every loop over them is unrolled, and the leaf lambda reads element `sf_t` of the thread's
  array, a constant once unrolled. No shared memory, no barrier per row, and the compiler
  computes what two passes share (softmax's exp) once. On the H200 this halved
  the instructions per element of the bfloat16 rows, which were bound by issue, not bandwidth
  (benchmarks/README.md, ncu of 2026-12-01 21:53 UTC). The vector loads carry L1/L2 evict-last
  hints (`sf_vload_last`, CodegenOptions.row_load_hints), as torch.compile's loads of a row do. Inputs of
  the row's shape broadcast over the rows (weights) may be held the same way, loaded once before the row loop
  (`CodegenOptions.row_register_weights`; 2-byte ones only while the rows do not fill the SMs);
  Few rows longer than `limits.ROW_SPLIT_MIN_LENGTH` are split over a thread-block cluster
  (`limits.row_split`): each block holds a contiguous part of its row in registers, and each
  reduction combines the blocks' partials through distributed shared memory (prelude
  CLUSTER_REDUCE), so 8 rows use up to 64 SMs;
- shared memory otherwise (16-byte vector loads in the vector variant), element by element;
- global memory, re-read in each pass, for rows that do not fit `limits.ROW_CACHE_BYTES` (two
  passes or more: the formulation nvFuser falls back to past its persistent buffer limit).

Everything op-specific comes from the registry's traits: the combiner and identity of each
reduction (`OpDef.combiner`, `divide_by_count`) and the pointwise renderings (lazy.py, through
the shared lambdas). `RowKernelRenderer` reads a `KernelInput` (kernel_input.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..limits import (
    ROW_CACHE_BYTES,
    ROW_REGISTER_ELEMS,
    ROW_SPLIT_MAX,
    SMEM_PER_BLOCK,
    row_split,
    row_threads,
)
from ..ops.pointwise import opmath
from ..plan import RowKernel
from . import ctypes_ as ct
from .geometry import align
from .kernel_input import KernelInput, Rendered
from .layout import contiguous_strides, numel
from .lazy import Unsupported, delinearize, linearize

# Grid cap of warp-per-row kernels, in blocks per SM (the row loop strides over the rest). Kernels
# of a block per row launch a block for every row instead: on the H200 a persistent grid of 32 blocks an SM looping over
# the rows ran 1-5% slower at 32768 rows (RMSNorm float32 [32768, 8192] 533 -> 509 us), its DRAM
# throughput 82% of peak under ncu against torch.compile's 88% with a program per row.
ROWS_PER_SM = 32
BLOCK_ROWS_PER_SM = None  # None: no cap (a block per row); a number caps them the same way
WARP_BLOCK = 256  # threads of a block of warp-per-row slots


def _share(K: int, lanes: int) -> int:
    """Elements of a row each thread holds: the vector variant's share (vectors of 4), the
    larger one."""
    return -(-K // (4 * lanes)) * 4


@dataclass(frozen=True)
class RowsAt:
    """A segment's row kernel (`plan.RowKernel`, the planner's decisions) at the run's sizes."""

    reductions: tuple
    rank: int
    dims: tuple
    kept: tuple  # the kept dims' sizes (the rows)
    row: tuple  # the reduced dims' sizes of the row-shaped outputs and cached inputs
    full_outputs: tuple
    row_outputs: tuple
    cacheable: tuple
    in_place: frozenset
    combined: tuple


def rows_at(rk: RowKernel, fusion, seg, types) -> RowsAt:
    """`rk` at concrete `types`: the rows are the first reduction input's kept dims; a row is the
    trailing dims of the first row-shaped output the segment writes (else of that input). Outputs
    the segment does not write (views made after it) are left out."""
    x0 = types[fusion.nodes[rk.reductions[0]].inputs[0]]
    k = len(rk.dims)
    full = tuple(o for o in seg.outputs if o in rk.full_outputs)
    row = tuple((types[full[0]] if full else x0).shape[rk.rank - k:])
    return RowsAt(tuple(rk.reductions), rk.rank, tuple(rk.dims), tuple(x0.shape[:rk.rank - k]), row, full,
                  tuple(o for o in seg.outputs if o in rk.row_outputs),
                  tuple(x for x in seg.inputs if x in rk.cached_inputs), frozenset(rk.in_place), tuple(rk.combined))


class RowKernelRenderer:
    """The row_reduction segment's kernel, from its `KernelInput` (the plan's `RowKernel` at the
    run's sizes)."""

    def __init__(self, inp: KernelInput):
        self.fusion, self.seg, self.types, self.strides = inp.fusion, inp.seg, inp.types, inp.strides
        self.loc, self.I, self.sm, self.options, self._lambdas = inp.loc, inp.I, inp.sm, inp.options, inp.lambdas

    def render(self) -> Rendered:
        """The kernel's vector variant first (the runtime runs it when every pointer is aligned),
        then the scalar one; reduction results live in registers (no scratch)."""
        if self.seg.row is None:
            raise Unsupported("a row_reduction segment without its plan's row kernel")
        region = rows_at(self.seg.row, self.fusion, self.seg, self.types)
        R, K = numel(region.kept), numel(region.row)
        split = row_split(K, R, self.sm, ROW_SPLIT_MAX)
        out = None
        if split > 1:  # (a split needs the row in registers: else a block per row after all)
            out = self._row_kernels_in(region, R, K, split)
        return out or self._row_kernels_in(region, R, K, 1)

    def _row_kernels_in(self, region, R, K, S) -> Rendered | None:
        """The kernels with S blocks (a cluster: __cluster_dims__) a row; None when S > 1 and the
        parts of the row do not fit registers."""
        Kc = K if S == 1 else -(-K // (4 * S)) * 4  # a block's part: a multiple of 4 (vector loads)
        lanes = row_threads(Kc, R * S, self.sm, S)
        block = WARP_BLOCK if lanes == 32 else lanes
        slots = block // lanes
        cache = [x for x in region.cacheable if self.strides[x] == contiguous_strides(self.types[x].shape)]
        offs, per_slot = {}, 0
        for x in cache:
            offs[x] = per_slot
            per_slot = align(per_slot + Kc * self.types[x].dtype.itemsize)
        if per_slot * slots > min(ROW_CACHE_BYTES, SMEM_PER_BLOCK) or K == 0:
            cache, offs, per_slot = [], {}, 0
        # (a block per row has rows of more than ROW_WARP_MAX elements, so under 32-bit indexing
        # R < 2^22 and the row loop's step past the end, at most R, cannot overflow)
        per_sm = ROWS_PER_SM if lanes == 32 else BLOCK_ROWS_PER_SM
        grid = max(1, min(-(-R // slots), 2**31 - 1 if per_sm is None else self.sm * per_sm))
        in_regs = bool(cache) and self._rows_in_registers(region, cache, Kc, lanes)
        if S > 1:
            if not in_regs or lanes == 32:
                return None
            grid = R * S  # (R * S <= the SM count: limits.row_split)
        smem = 0 if in_regs else per_slot * slots
        geo = (region, R, K, lanes, slots, cache, offs, per_slot)
        weights = self._row_weights(region, cache, Kc, lanes, few_rows=R <= self.sm) if in_regs else []
        if in_regs:
            # (the last field: a block, or cluster, has one row and the rows fit the SMs: row_weights_after_row)
            geo += (weights, S, Kc, grid * slots >= R * S and R <= self.sm)
        body = self._row_body_registers if in_regs else self._row_body
        narrow = in_regs and lanes > 32 and R > self.sm and all(self.types[x].dtype.itemsize <= 2 for x in (*cache, *weights))
        # (__launch_bounds__; pointless while the rows do not fill the SMs)
        min_blocks = self.options.row_min_resident_threads_2byte // block if narrow else 0
        out = []
        if cache and K % 4 == 0:
            out.append((body(geo, vector=True), grid, block, smem, True))
        out.append((body(geo, vector=False), grid, block, smem, None))
        return Rendered(out, 0, min_blocks, S)  # (no scratch: the reductions' results live in registers)

    def _rows_in_registers(self, region, cache, K, lanes) -> bool:
        """Registers hold the cached rows (K elements a block: a row, or its part of a split row):
        each thread's share fits, every reader reads them in place, and every reduction and
        row-shaped output runs over the same elements."""
        per_thread = _share(K, lanes)
        if per_thread * len(cache) > ROW_REGISTER_ELEMS:
            return False
        k = len(region.dims)

        # (the row each reduction combines, an identity pad's source's: the outputs' rows are longer
        # after a pad along the row)
        if any(tuple(self.types[x].shape[region.rank - k:]) != tuple(region.row) for x in region.combined):
            return False
        return all(x in region.in_place for x in cache)

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

    def _row_weights(self, region, cache, K, lanes, few_rows: bool) -> list:
        """Inputs of the row's shape broadcast over the rows, read in place, that a thread holds in
        registers for all its rows (within `row_register_weights` elements a thread); 2-byte ones
        only for `few_rows` (measured slower on full SMs: codegen/options.py)."""
        per_thread = _share(K, lanes)
        most = self.options.row_register_weights
        if per_thread > most:
            return []
        r, k = region.rank, len(region.dims)
        out = []
        for x in self.seg.inputs:
            t = self.types[x]
            if x in cache or (t.dtype.itemsize < 4 and not few_rows):
                continue
            if t.rank > r or tuple(t.shape[t.rank - k:]) != tuple(region.row) or \
                    any(d != 1 for d in t.shape[:t.rank - k]) or self.strides[x] != contiguous_strides(t.shape):
                continue
            if (len(out) + 1) * per_thread <= most and x in region.in_place:
                out.append(x)
        return out

    def _row_body_registers(self, geo, vector: bool) -> str:
        """The row kept in registers: thread `lane` owns elements (lane + i * lanes) * V + e; the
        weights (`_row_weights`) likewise, loaded once before the row loop. A row split over a
        cluster of S blocks (S > 1): block `sf_rank` of the cluster owns elements [sf_c0, sf_c1)
        of its row, Kc of them (the last block fewer), and each reduction combines the blocks'
        partials through distributed shared memory (sf_cluster_reduce)."""
        region, R, K, lanes, slots, cache, _offs, _per_slot, weights, S, Kc, few_one_row = geo
        I = self.I
        r, k = region.rank, len(region.dims)
        V = 4 if vector else 1
        N = -(-Kc // (V * lanes))  # vectors (elements) per thread
        split = S > 1
        first = "sf_c0 + " if split else ""  # a block's first element of the row
        end = "sf_c1" if split else f"({I}){K}"
        red_nodes = [self.fusion.nodes[p] for p in region.reductions]
        regs = {nd.outputs[0]: f"rv{i}" for i, nd in enumerate(red_nodes)}
        arrs = {x: f"xr{i}" for i, x in enumerate(cache)}
        arrs.update({x: f"wr{i}" for i, x in enumerate(weights)})
        rowc = [f"r{i}" for i in range(r - k)]
        sc = [f"s{i}" for i in range(k)]

        def leaf(n):
            if n in regs:
                return f"return {regs[n]};"
            if n in arrs:
                return f"return {ct.cvt(f'{arrs[n]}[sf_t]', ct.value(self.types[n].dtype))};"
            return None

        def each(var, body) -> str:  # the thread's elements, unrolled; `sf_t` indexes its arrays
            head = (f"      #pragma unroll\n      for (int sf_i = 0; sf_i < {N}; ++sf_i) {{\n"
                    f"        #pragma unroll\n        for (int sf_e = 0; sf_e < {V}; ++sf_e) {{ "
                    f"const {I} {var} = {first}(lane + ({I})sf_i * {lanes}) * {V} + sf_e; sf_t = sf_i * {V} + sf_e;\n")
            return head + (f"          if ({var} < {end}) {{ {delinearize(var, region.row, I, 's')} {body} }} }} }}")

        lam, names = self._lambdas(leaf=leaf)
        lines = [f"  const int lane = threadIdx.x % {lanes}, slot = threadIdx.x / {lanes};", "  int sf_t = 0;"]
        if split:
            lines += [f"  const unsigned sf_rank = blockIdx.x % {S};  // the block's part of its row: its rank in the cluster",
                      f"  const {I} sf_c0 = ({I})sf_rank * {Kc}, sf_c1 = min(sf_c0 + ({I}){Kc}, ({I}){K});",
                      f"  __shared__ __align__(16) unsigned char sf_cl[{16 * len(red_nodes)}];  // the block's partials, for the cluster"]
        for nd in red_nodes:
            lines.append(f"  {ct.value(self.types[nd.outputs[0]].dtype)} {regs[nd.outputs[0]]} = 0;")
        for x in (*cache, *weights):
            lines.append(f"  {ct.storage(self.types[x].dtype)} {arrs[x]}[{N * V}];")
        lines.append(lam)
        late = self.options.row_weights_after_row and few_one_row  # (a block's one row first, few rows)
        for x in () if late else weights:
            lines.append(self._register_load(x, arrs[x], "", K, N, lanes, V, "  ", split))
        # (row_one_barrier: by default one barrier while the rows, a block each, do not fill the SMs)
        chosen = self.options.row_one_barrier
        one_barrier = lanes > 32 and (chosen if chosen is not None else S == 1 and R <= self.sm)
        if one_barrier:
            lines.append("  int sf_par = 0;  // sf_block_reduce1's buffer, alternating per row")
        if split:
            lines.append(f"  for ({I} row = ({I})(blockIdx.x / {S}); row < ({I}){R}; row += ({I})(gridDim.x / {S})) {{")
        else:
            lines.append(f"  for ({I} row = ({I})blockIdx.x * {slots} + slot; row < ({I}){R}; "
                         f"row += ({I})gridDim.x * {slots}) {{")
        lines.append(f"    {delinearize('row', region.kept, I, 'r')}")
        for x in cache:
            lines.append(self._register_load(x, arrs[x], "row * ", K, N, lanes, V, "    ", split))
        for x in weights if late else ():
            lines.append(self._register_load(x, arrs[x], "", K, N, lanes, V, "    ", split))
        for i, nd in enumerate(red_nodes):
            lines.append(self._row_reduce(nd, names, rowc, regs[nd.outputs[0]], lanes, loop=lambda body: each("k", body),
                                          parity="sf_par" if one_barrier else None,
                                          cluster=(S, f"sf_cl + {16 * i}") if split else None))
        lines.append(self._row_stores_registers(region, names, rowc, sc, K, N, V, lanes, each, split))
        if one_barrier:
            lines.append("    sf_par ^= 1;")
        if split:  # (no block leaves, or writes its partials again, while another reads them)
            lines.append("    sf_cluster_sync();")
        lines.append("  }")
        return "\n".join(lines)

    def _register_load(self, x, arr, row_off, K, N, lanes, V, pad, split=False) -> str:
        """A thread's elements of input x into `arr`, in vectors of V (1: element by element): of
        row `row` (`row_off` "row * "), or of its only row ("": a weight); of the block's part
        [sf_c0, sf_c1) of it when `split`."""
        I = self.I
        src, st = self.loc[x].ref, ct.storage(self.types[x].dtype)
        head = f"{pad}#pragma unroll\n{pad}for (int sf_i = 0; sf_i < {N}; ++sf_i) {{ const {I} q = lane + ({I})sf_i * {lanes}; "
        if V > 1:
            v = f"sf_v{V}<{st}>"
            q = f"sf_c0 / {V} + q" if split else "q"
            at = f"{row_off}{K // V} + {q}" if row_off else q
            n = f"(sf_c1 - sf_c0) / {V}" if split else f"({I}){K // V}"
            load = "sf_vload_last" if self.options.row_load_hints else "sf_vload"
            return head + (f"if (q < {n}) {{ const {v} w = {load}((const {v}*){src} + {at}); "
                           f"for (int sf_e = 0; sf_e < {V}; ++sf_e) {arr}[sf_i * {V} + sf_e] = w.v[sf_e]; }} }}")
        q = "sf_c0 + q" if split else "q"
        at = f"{row_off}{K} + {q}" if row_off else q
        n = "sf_c1 - sf_c0" if split else f"({I}){K}"
        return head + f"if (q < {n}) {arr}[sf_i] = {src}[{at}]; }}"

    def _row_stores_registers(self, region, names, rowc, sc, K, N, V, lanes, each, split=False) -> str:
        I = self.I
        out = []
        q0, n4 = (f"sf_c0 / {V} + q", f"(sf_c1 - sf_c0) / {V}") if split else ("q", f"({I}){K // V}")
        if region.full_outputs and V > 1:  # one vector store per output and V elements
            vals = {o: f"w{i}" for i, o in enumerate(region.full_outputs)}
            decl = " ".join(f"sf_v{V}<{ct.storage(self.types[o].dtype)}> {w};" for o, w in vals.items())
            fill = " ".join(f"{w}.v[sf_e] = {ct.cvt(f'{names[o]}({chr(44).join(rowc + sc)})', ct.storage(self.types[o].dtype))};"
                            for o, w in vals.items())
            put = " ".join(f"sf_vstore((sf_v{V}<{ct.storage(self.types[o].dtype)}>*){self.loc[o].ref} + row * {K // V} + {q0}, {w});"
                           for o, w in vals.items())
            out.append(f"    #pragma unroll\n    for (int sf_i = 0; sf_i < {N}; ++sf_i) {{ const {I} q = lane + ({I})sf_i * {lanes};\n"
                       f"      if (q < {n4}) {{ {decl}\n        #pragma unroll\n"
                       f"        for (int sf_e = 0; sf_e < {V}; ++sf_e) {{ const {I} j = {'sf_c0 + ' if split else ''}q * {V} + sf_e; sf_t = sf_i * {V} + sf_e; "
                       f"{delinearize('j', region.row, I, 's')} {fill} }}\n        {put} }} }}")
        elif region.full_outputs:
            out.append(each("j", self._element_stores(region, names, rowc, sc, K)))
        out.extend(self._per_row_stores(region, names, rowc, split))
        return "\n".join(out)

    def _element_stores(self, region, names, rowc, sc, K) -> str:
        """Element j of every row-shaped output of the row, element by element."""
        return " ".join(f"{self.loc[o].ref}[row * {K} + j] = "
                        f"{ct.cvt(f'{names[o]}({chr(44).join(rowc + sc)})', ct.storage(self.types[o].dtype))};"
                        for o in region.full_outputs)

    def _per_row_stores(self, region, names, rowc, split=False) -> list:
        """The per-row outputs, stored once by lane 0 (of the cluster's first block when `split`)."""
        per = []
        for o in region.row_outputs:
            t = self.types[o]
            cs = rowc + ["0"] * (t.rank - len(rowc))
            per.append(f"{self.loc[o].ref}[row] = {ct.cvt(f'{names[o]}({chr(44).join(cs)})', ct.storage(t.dtype))};")
        who = "lane == 0 && sf_rank == 0" if split else "lane == 0"
        return [f"    if ({who}) {{ " + " ".join(per) + " }"] if per else []

    def _row_load(self, x, ch, K, lanes, vector) -> str:
        I = self.I
        src = self.loc[x].ref
        if vector:
            v = f"sf_v4<{ct.storage(self.types[x].dtype)}>"
            return (f"    for ({I} q = lane; q < ({I}){K // 4}; q += {lanes}) (({v}*){ch})[q] = "
                    f"sf_vload((const {v}*){src} + row * {K // 4} + q);")
        return f"    for ({I} j = lane; j < ({I}){K}; j += {lanes}) {ch}[j] = {src}[row * {K} + j];"

    def _row_reduce(self, nd, names, rowc, reg, lanes, loop=None, parity=None, cluster=None) -> str:
        """One reduction over the row, then the block (warp) reduction. `loop(body)`: the loop
        over the thread's elements (default: strided over the row, for rows not in registers);
        `parity`: the variable naming sf_block_reduce1's buffer (one barrier instead of three);
        `cluster`: (S, the block's shared slot) of a row split over S blocks, whose partials are then
        combined across the cluster."""
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
        if lanes <= 32:
            red = "sf_shfl(sf_warp_reduce(acc, comb), 0)"
        else:
            nw = lanes // 32  # (the block is the row's: one barrier needs all of its threads)
            if parity and self.options.row_reduce_butterfly and lanes % 32 == 0 and nw & (nw - 1) == 0 and nw <= 32:
                red = f"sf_block_reduce1w<{nw}>(acc, comb, {parity})"
            else:
                red = f"sf_block_reduce1(acc, comb, {parity})" if parity else "sf_block_reduce(acc, comb)"
        if cluster is not None:
            red = f"sf_cluster_reduce({red}, comb, ({W}*)({cluster[1]}), {cluster[0]}u)"
        rounded = ct.cvt(ct.cvt(post, ct.storage(ot.dtype)), ct.value(ot.dtype))
        if loop is None:
            def loop(body):
                return (f"      #pragma unroll 8\n"
                        f"      for ({I} k = lane; k < ({I}){Ki}; k += {lanes}) {{ {delinearize('k', red_shape, I, 's')} {body} }}")
        return (f"    {{ auto comb = [&]({W} a, {W} b) -> {W} {{ return {fn}::f<{W}>(a, b); }};\n"
                f"      {W} acc = {fn}::id<{W}>();\n{loop(f'acc = comb(acc, {load});')}\n"
                f"      acc = {red};\n      {reg} = {rounded}; }}")

    def _row_stores(self, region, names, rowc, K, lanes) -> str:
        I = self.I
        k = len(region.dims)
        out = []
        if region.full_outputs:
            stores = self._element_stores(region, names, rowc, [f"s{i}" for i in range(k)], K)
            out.append(f"    for ({I} j = lane; j < ({I}){K}; j += {lanes}) {{ "
                       f"{delinearize('j', region.row, I, 's')} {stores} }}")
        out.extend(self._per_row_stores(region, names, rowc))
        return "\n".join(out)
