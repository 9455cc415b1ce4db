"""Lower one plan segment to one CUDA module.

A segment's nodes split into lazy ops (rendered as lambdas, see `lazy.py`) and anchors
(reduction, scan, sort, scatter) that must materialize their results. The segment becomes a list
of phases: one per anchor, plus one that writes the segment's lazily computed outputs. In grid
mode every phase is its own `__global__` function (launched in order from one module; almost
always just one). In single-block mode (segment kind `single_block`) all phases live in one
kernel of one thread block, separated by `__syncthreads()`, with intermediates in shared memory.

Sizes and strides are baked into the source (one kernel per shape class, like nvFuser's static
concretization): constant divisors become multiplications, and the index width is chosen per
shape (32-bit when every offset fits, 64-bit otherwise), which makes the two widths separate
cached variants. Identifiers are counters (t0, v3, sf_k_<hash>_1); user tensor names never
appear in the source.

This module is the driver (placement, phases, the grid and single-block dispatch, the module
text). Each kernel family is a renderer in its own module that reads a narrow `KernelInput`
(kernel_input.py: the placed tensors, the index type, the SM count, the `CodegenOptions`) and
returns its kernels: pointwise.py (lambdas, materialize), reduction.py (reductions, scans),
row_reduction.py (row-persistent reductions, from the plan's `RowKernel`), sorting.py,
scatter_kernels.py (scatter family, grid mode) and scatter_block.py (scatters in one block). The
tunables the benchmark sets (VEC_BLOCKS_PER_SM, RADIX_MIN) stay here, where the dispatch reads them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass

from ..limits import NOMINAL_SM_COUNT, SMEM_PER_BLOCK, index_bits
from ..ops.registry import LAZY_KINDS, OpKind
from ..plan import AliasMode, SegmentKind
from . import ctypes_ as ct
from . import radix
from .geometry import THREADS, align
from .kernel_input import KernelInput
from .layout import contiguous_strides, numel
from .lazy import Unsupported
from .options import DEFAULT_OPTIONS, CodegenOptions
from .pointwise import PointwiseRenderer
from .prelude import OPTIONAL_PARTS, PRELUDE
from .reduction import ReductionRenderer
from .row_reduction import RowKernelRenderer
from .scatter_block import BlockScatterRenderer
from .scatter_kernels import ScatterRenderer
from .sorting import SortRenderer

# Streaming kernels: enough blocks that each thread handles a few vectors (more bytes in flight
# than a grid of 8 blocks per SM looping hundreds of times); tunable from the benchmark.
# H200, 2^28-element chain, kernel only: 64 blocks/SM 1072-1076 us, 256: 1057-1061, 1024: 1037, no cap
# (one 16-byte vector per thread): 1029 us, as fast as the device-to-device copy ceiling allows.
VEC_BLOCKS_PER_SM = 1 << 20
# Single-block sorts of rank-1 integer rows longer than this use the block radix sort (radix.py);
# shorter ones the shared-memory bitonic sort. H200, MoE argsort fusion, kernel only: 8 keys
# bitonic 4.1 us / radix 5.5 us; 128 keys 10.1 / 5.5; 1024 keys 26.9 / 5.9.
RADIX_MIN = 64


@dataclass
class Launch:
    kernel: str
    grid: int
    block: int
    smem: int = 0
    vector_of: str | None = None  # this is the float4-style variant of that kernel (needs alignment)


@dataclass
class Module:
    source: str
    params: list[str]  # tensor names, in kernel parameter order (then scratch, err, ctr)
    launches: list[Launch]
    scratch_bytes: int = 0
    index_bits: int = 32
    key: str = ""
    # whether a kernel may write the error word (a bounds or division check): runs of modules that
    # cannot fail need no synchronization to learn their outcome
    may_fail: bool = True
    options: CodegenOptions = DEFAULT_OPTIONS  # what generated it (the kernel cache keys by them too)


@dataclass
class Loc:
    kind: str  # param | smem | scratch
    ref: str  # C pointer expression
    strides: tuple


# The kernel families: each renders its ops from a `KernelInput` and lists the lowerings it renders.
FAMILIES = (PointwiseRenderer, ReductionRenderer, SortRenderer, ScatterRenderer, RowKernelRenderer)


class SegmentCodegen:
    """One segment's module: places its tensors, then `build()` renders every phase with its
    family's renderer."""

    @classmethod
    def lowerings(cls) -> frozenset:
        """Every registry `Lowering` some kernel family renders (each family lists its own)."""
        return frozenset().union(*(getattr(k, "LOWERINGS", ()) for k in FAMILIES))

    def __init__(self, fusion, seg, types: dict, strides: dict | None = None, *, single_block: bool | None = None,
                 aliased: set | None = None, sm_count: int = NOMINAL_SM_COUNT,
                 options: CodegenOptions = DEFAULT_OPTIONS):
        self.fusion, self.seg, self.types, self.options = fusion, seg, types, options
        self.nodes = [fusion.nodes[p] for p in seg.nodes]
        types = dict(types)
        # Private copies of a scatter's self (rule 1): the copy is an identity of its source, made
        # here when this segment lists it; a scatter whose alias names a copy reads self from it.
        self.copies = {c.dst: c.src for c in seg.copies}
        for dst, src in self.copies.items():
            types.setdefault(dst, types[src])
        for a in seg.aliases:
            if a.mode is AliasMode.copy and a.buffer in types:
                self.nodes = [dataclasses.replace(nd, inputs=(a.buffer,) + tuple(nd.inputs[1:]))
                              if a.tensor in nd.outputs and nd.op.kind is OpKind.scatter else nd for nd in self.nodes]
        self.types = types
        self.sm = sm_count
        self.block_mode = (seg.kind == SegmentKind.single_block) if single_block is None else single_block
        self.aliased = set(aliased or ())  # scatter outputs whose param already holds self's data
        self.strides = {n: tuple(strides[n]) if strides and n in strides else contiguous_strides(types[n].shape)
                        for n in seg.inputs}
        self.params = list(seg.inputs) + [o for o in seg.outputs if o not in seg.inputs]
        self.producer = {o: nd for nd in self.nodes for o in nd.outputs}
        self.anchors = [nd for nd in self.nodes if nd.op.kind not in LAZY_KINDS]
        self._choose_index_type()
        self._place()
        self.pointwise = PointwiseRenderer(seg, self.nodes, self.types, self.strides, self.loc, self.stage, self.copies,
                                           self.producer, self.params, self.I)

    # ---- layout ------------------------------------------------------------------------
    def _choose_index_type(self):
        biggest = 0
        for n in list(self.seg.inputs):
            t = self.types[n]
            biggest = max(biggest, numel(t.shape), sum((d - 1) * abs(s) for d, s in zip(t.shape, self.strides[n])) + 1)
        for nd in self.nodes:
            for o in nd.outputs:
                biggest = max(biggest, numel(self.types[o].shape))
            for x in nd.inputs:
                if isinstance(x, str):
                    biggest = max(biggest, numel(self.types[x].shape))
        self.index_bits = index_bits(biggest)  # (the planner's hint uses the same limit)
        self.I = "int" if self.index_bits == 32 else "long long"

    def _place(self):
        self.loc: dict[str, Loc] = {}
        for k, n in enumerate(self.params):
            st = self.strides.get(n) or contiguous_strides(self.types[n].shape)
            self.loc[n] = Loc("param", f"t{k}", st)
        self.smem_used = 0
        self.scratch_used = 0
        self.min_blocks = 0  # __launch_bounds__'s minimum of resident blocks an SM (0: none)
        self.cluster = 1  # blocks of a thread-block cluster (__cluster_dims__; 1: none)
        for nd in self.anchors:
            for o in nd.outputs:
                if o in self.loc:
                    continue
                t = self.types[o]
                nbytes = numel(t.shape) * t.dtype.itemsize
                if self.block_mode and self.smem_used + nbytes <= SMEM_PER_BLOCK // 2:
                    self.loc[o] = Loc("smem", f"((({ct.storage(t.dtype)}*)(sf_smem + {self.smem_used})))",
                                      contiguous_strides(t.shape))
                    self.smem_used = align(self.smem_used + nbytes)
                else:
                    self.loc[o] = Loc("scratch", f"((({ct.storage(t.dtype)}*)(sf_scratch + {self.scratch_used})))",
                                      contiguous_strides(t.shape))
                    self.scratch_used = align(self.scratch_used + nbytes)
        # Block mode stages scatter targets that are segment outputs in shared memory too.
        self.stage: dict[str, Loc] = {}
        if self.block_mode:
            for nd in self.anchors:
                if nd.op.kind is OpKind.scatter:
                    o = nd.outputs[0]
                    t = self.types[o]
                    nbytes = numel(t.shape) * t.dtype.itemsize
                    if self.loc[o].kind == "param" and self.smem_used + nbytes <= SMEM_PER_BLOCK // 2:
                        self.stage[o] = Loc("smem", f"((({ct.storage(t.dtype)}*)(sf_smem + {self.smem_used})))",
                                            contiguous_strides(t.shape))
                        self.smem_used = align(self.smem_used + nbytes)
        # A scatter finds self's data already in place only where it writes its self's buffer, a
        # parameter; an intermediate placed in shared memory or scratch starts from a copy of self.
        self.aliased = {o for o in self.aliased if self.loc[o].kind == "param"}

    def kernel_input(self) -> KernelInput:
        """What a family renderer reads of this segment, once its tensors are placed."""
        return KernelInput(self.fusion, self.seg, tuple(self.nodes), self.types, self.strides, self.loc, self.stage,
                           self.copies, self.producer, frozenset(self.aliased), self.I, self.sm, self.options,
                           self.pointwise.lambdas)

    # ---- phases ------------------------------------------------------------------------
    def phases(self) -> list:
        out = []
        for nd in self.anchors:
            out.append(("anchor", nd))
        lazy_outs = [o for o in self.seg.outputs if (o in self.producer and self.producer[o].op.kind in LAZY_KINDS)
                     or o in self.copies]
        groups: dict[tuple, list] = {}
        for o in lazy_outs:
            groups.setdefault(tuple(self.types[o].shape), []).append(o)
        for g in groups.values():
            out.append(("materialize", g))
        # Inputs that are also outputs (identity outputs): copy.
        for o in self.seg.outputs:
            if o in self.seg.inputs:
                raise Unsupported("segment output that is also its input")
        return out

    def build(self) -> Module:
        body_fns = []  # (name_suffix, body, grid, block, smem, vector_of)
        phases = self.phases()
        if self.seg.kind == SegmentKind.row_reduction:
            rendered = RowKernelRenderer(self.kernel_input()).render()  # one kernel (and its vector variant)
            body_fns.extend(rendered.kernels)
            self.scratch_used, self.min_blocks, self.cluster = rendered.scratch_bytes, rendered.min_blocks, rendered.cluster
        elif self.block_mode:
            body_fns.append(self._block_kernel(phases))
        else:
            groups = [what for kind, what in phases if kind == "materialize"]
            for ph in phases:
                if ph[0] != "materialize" or len(groups) == 1:
                    body_fns.extend(self._grid_kernels(ph))
            if len(groups) > 1:
                body_fns.append(self._materialize_together(groups))
        params = []
        for k, n in enumerate(self.params):
            t = self.types[n]
            params.append(f"{ct.storage(t.dtype)}* t{k}")
        params += ["unsigned char* sf_scratch", "long long* sf_err", "unsigned int* sf_ctr"]
        plist = ", ".join(params)
        text = []
        for i, (body, _grid, block, _smem, _vec) in enumerate(body_fns):
            bounds = f"{block}, {self.min_blocks}" if self.min_blocks > 1 else f"{block}"
            dims = f"__cluster_dims__({self.cluster}, 1, 1) " if self.cluster > 1 else ""
            text.append(f"extern \"C\" __global__ void {dims}__launch_bounds__({bounds}) SFNAME_{i}({plist}) {{\n"
                        f"  extern __shared__ __align__(16) unsigned char sf_smem[];\n{body}\n}}\n")
        src_body = "\n".join(text)
        for marker, part in reversed(OPTIONAL_PARTS):  # only the parts its kernels use
            if marker in src_body:
                src_body = part + "\n" + src_body
        h = hashlib.sha256((PRELUDE + src_body).encode()).hexdigest()[:16]
        kname = f"sf_k_{h}"
        source = PRELUDE + "\n" + src_body.replace("SFNAME_", f"{kname}_")
        launches = []
        for i, (_body, grid, block, smem, vec) in enumerate(body_fns):
            launches.append(Launch(f"{kname}_{i}", grid, block, smem,
                                   vector_of=f"{kname}_{i + 1}" if vec else None))
        return Module(source=source, params=list(self.params), launches=launches,
                      scratch_bytes=self.scratch_used,
                      index_bits=self.index_bits, key=h,
                      may_fail=any("sf_err" in b[0] for b in body_fns), options=self.options)

    # ---- grid mode ---------------------------------------------------------------------
    def _grid(self, work: int, threads: int = THREADS, per_sm: int = 8) -> int:
        return max(1, min(-(-work // threads), self.sm * per_sm))

    def _grid_kernels(self, ph):
        kind, what = ph
        I = self.I
        gstart = f"(({I})blockIdx.x * blockDim.x + threadIdx.x)"
        gstep = f"(({I})gridDim.x * blockDim.x)"
        if kind == "materialize":
            lam, _ = self.pointwise.lambdas()
            n = numel(self.types[what[0]].shape)
            res = [(lam + "\n" + self.pointwise.materialize(what, gstart, gstep), self._grid(n), THREADS, 0, None)]
            vec = self.pointwise.vector_materialize(what)
            if vec is not None:
                # the vector variant is listed first; the runtime picks it when pointers are aligned
                # listed first: the runtime launches it instead of the next (scalar) kernel when
                # every pointer is aligned to a vector
                res.insert(0, (vec, self._grid(max(1, n // 4), per_sm=VEC_BLOCKS_PER_SM), THREADS, 0, True))
            return res
        nd = what
        kindname = nd.op.kind
        if kindname is OpKind.reduction:
            return [ReductionRenderer(self.kernel_input()).grid_kernel(nd)]
        if kindname is OpKind.scan:
            return [ReductionRenderer(self.kernel_input()).scan_kernel(nd)]
        if kindname is OpKind.sort:
            return [SortRenderer(self.kernel_input()).grid_kernel(nd)]
        if kindname is OpKind.scatter:
            scatters = ScatterRenderer(self.kernel_input(), self.scratch_used)
            kernels = scatters.grid_kernels(nd)
            self.scratch_used = scatters.scratch_used
            return kernels
        raise Unsupported(f"anchor kind {kindname}")

    def _materialize_together(self, groups):
        """Outputs of several shapes in one launch (one kernel per segment): each shape group owns
        a range of the grid's blocks and strides over its elements within them. The groups are
        independent: each recomputes its values from the segment's inputs and anchor results."""
        I = self.I
        lam, _ = self.pointwise.lambdas()
        parts, first = [], 0
        for what in groups:
            blocks = self._grid(numel(self.types[what[0]].shape))
            start = f"(({I})(blockIdx.x - {first}u) * blockDim.x + threadIdx.x)"
            parts.append(f"  if (blockIdx.x >= {first}u && blockIdx.x < {first + blocks}u) {{\n"
                         + self.pointwise.materialize(what, start, f"(({I}){blocks} * blockDim.x)") + "\n  }")
            first += blocks
        return (lam + "\n" + "\n".join(parts), first, THREADS, 0, None)

    def _dst(self, o):
        return (self.stage.get(o) or self.loc[o]).ref

    # ---- single-block mode -------------------------------------------------------------
    def _block_kernel(self, phases):
        blocks = BlockScatterRenderer(self.kernel_input(), self.scratch_used).histogram_blocks(phases)
        lam, names = self.pointwise.lambdas()
        parts = [lam]
        sort_off = self.smem_used
        smem = self.smem_used
        work = 32
        for kind, what in phases:
            if kind == "materialize":
                parts.append(self.pointwise.materialize(what, "threadIdx.x", "blockDim.x", names))
                work = max(work, numel(self.types[what[0]].shape))
            else:
                nd = what
                k = nd.op.kind
                if k is OpKind.reduction:
                    reductions = ReductionRenderer(self.kernel_input())
                    x, xt, ot, name, rd, kd, R, K = reductions.parts(nd)
                    parts.append(reductions.body(nd, "0", "1", "threadIdx.x", "blockDim.x",
                                                 "sf_block_reduce(acc, comb)", self._dst(nd.outputs[0])))
                    work = max(work, K)
                elif k is OpKind.scan:
                    parts.append(ReductionRenderer(self.kernel_input()).scan_body(nd, "0", "1", self._dst(nd.outputs[0])))
                    xt = self.types[nd.inputs[0]]
                    work = max(work, xt.shape[nd.attrs.dim % xt.rank] if xt.rank else 1)
                elif k is OpKind.sort:
                    sorts = SortRenderer(self.kernel_input())
                    x, xt, d, L, P, V, nbytes = sorts.parts(nd)
                    if L > RADIX_MIN and xt.rank == 1 and not xt.dtype.is_float:
                        body, self.scratch_used = sorts.radix_body(nd, sort_off, self.scratch_used)
                        parts.append(body)
                        smem = max(smem, sort_off + radix.SMEM_BYTES)
                        work = radix.THREADS  # the radix sort needs exactly 1024 threads
                    else:
                        smem = max(smem, sort_off + nbytes)
                        parts.append(sorts.body(nd, "0", "1", sort_off))
                        work = max(work, P // 2)
                elif k is OpKind.scatter:
                    scatters = BlockScatterRenderer(self.kernel_input(), self.scratch_used)
                    body, extra = scatters.block_body(nd, sort_off, blocks if nd is phases[0][1] else 1)
                    self.scratch_used = scatters.scratch_used
                    parts.append(body)
                    smem = max(smem, sort_off + extra)
                    dom = scatters.parts(nd)[0]
                    work = max(work, numel(dom))
                else:
                    raise Unsupported(f"anchor kind {k}")
            parts.append("  __syncthreads();")
        if smem > SMEM_PER_BLOCK:
            raise Unsupported("single-block segment needs too much shared memory")
        threads = min(1024, max(32, -(-work // 32) * 32))
        return (_unroll_block_loops("\n".join(parts), threads), blocks, threads, align(smem), None)


_BLOCK_LOOP = re.compile(r"^(\s*)(for \((?:int|long long) [a-z]\w* = threadIdx\.x; )", re.M)


def _unroll_block_loops(body: str, threads: int) -> str:
    """A single-block kernel always runs with `threads` threads: with that constant as the stride,
    loop trip counts are known and `#pragma unroll` lets the compiler issue several iterations'
    global loads before their uses. One SM runs the whole segment, so its loops are bound by
    memory latency, not bandwidth (MoE histogram of 32768 ids: 32 dependent load-atomic rounds)."""
    body = body.replace("blockDim.x", str(threads))
    return _BLOCK_LOOP.sub(lambda m: f"{m.group(1)}#pragma unroll 4\n{m.group(1)}{m.group(2)}", body)


def generate(fusion, seg, types, strides=None, **kw) -> Module:
    return SegmentCodegen(fusion, seg, types, strides, **kw).build()
