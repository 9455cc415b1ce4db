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

This module is the driver: it places the segment's tensors (parameters, shared memory, scratch),
splits it into phases, hands a narrow `KernelInput` (kernel_input.py: the placed tensors, the
index type, the SM count, the `CodegenOptions`) to the renderer its kind names (`RENDERERS`), and
assembles the module text from the kernels the renderer returns (`Rendered`). The segment
renderers: grid.py (grid mode: each anchor's family by its op kind), single_block.py (the
phases in one block) and row_reduction.py (row-persistent reductions, from the plan's
`RowKernel`). The kernel families they use, each in its own module: pointwise.py (lambdas,
materialize), reduction.py (reductions, scans), sorting.py, scatter_kernels.py (scatter family,
grid mode) and scatter_block.py (scatters in one block). The tunables the benchmark sets
(VEC_BLOCKS_PER_SM, RADIX_MIN) stay here: the driver hands them to the renderers.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass

from ..limits import NOMINAL_SM_COUNT, SMEM_PER_BLOCK, index_bits
from ..ops.registry import LAZY_KINDS, OpKind
from ..plan import AliasMode, SegmentKind
from . import ctypes_ as ct
from .geometry import align
from .grid import GridRenderer
from .kernel_input import KernelInput, Loc, Rendered
from .layout import contiguous_strides, numel
from .lazy import Unsupported
from .options import DEFAULT_OPTIONS, CodegenOptions
from .pointwise import PointwiseRenderer
from .prelude import OPTIONAL_PARTS, PRELUDE
from .reduction import ReductionRenderer
from .row_reduction import RowKernelRenderer
from .scatter_kernels import ScatterRenderer
from .single_block import SingleBlockRenderer
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


# The kernel families: each renders its ops from a `KernelInput` and lists the lowerings it renders
# (the segment renderers below combine them).
FAMILIES = (PointwiseRenderer, ReductionRenderer, SortRenderer, ScatterRenderer, RowKernelRenderer)


def _render_row_kernel(inp: KernelInput, phases) -> Rendered:
    return RowKernelRenderer(inp).render()  # (one kernel, and its vector variant: no phases)


def _render_single_block(inp: KernelInput, phases) -> Rendered:
    return SingleBlockRenderer(inp, RADIX_MIN).render(phases)


def _render_grid(inp: KernelInput, phases) -> Rendered:
    return GridRenderer(inp, VEC_BLOCKS_PER_SM).render(phases)


# A segment's renderer by its kind; every other kind renders in grid mode. (Module functions, so
# that they read the tunables above when called.)
RENDERERS = {SegmentKind.row_reduction: _render_row_kernel, SegmentKind.single_block: _render_single_block}


class SegmentCodegen:
    """One segment's module: places its tensors, then `build()` hands them to the renderer of the
    segment's kind and assembles the module from the kernels it returns."""

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
        """What a renderer reads of this segment, once its tensors are placed: the pointwise
        family reads it without `lambdas`, and gives every other renderer its `lambdas`."""
        placed = KernelInput(self.fusion, self.seg, tuple(self.nodes), self.types, self.strides, self.loc, self.stage,
                             self.copies, self.producer, frozenset(self.aliased), tuple(self.params), self.I, self.sm,
                             self.options, self.scratch_used, self.smem_used)
        return dataclasses.replace(placed, lambdas=PointwiseRenderer(placed).lambdas)

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
        kind = self.seg.kind
        if kind != SegmentKind.row_reduction:  # (a row kernel whatever the mode)
            kind = SegmentKind.single_block if self.block_mode else None
        rendered = RENDERERS.get(kind, _render_grid)(self.kernel_input(), self.phases())
        body_fns = rendered.kernels  # (body, grid, block, smem, vector flag) each
        params = []
        for k, n in enumerate(self.params):
            t = self.types[n]
            params.append(f"{ct.storage(t.dtype)}* t{k}")
        params += ["unsigned char* sf_scratch", "long long* sf_err", "unsigned int* sf_ctr"]
        plist = ", ".join(params)
        text = []
        for i, (body, _grid, block, _smem, _vec) in enumerate(body_fns):
            bounds = f"{block}, {rendered.min_blocks}" if rendered.min_blocks > 1 else f"{block}"
            dims = f"__cluster_dims__({rendered.cluster}, 1, 1) " if rendered.cluster > 1 else ""
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
                      scratch_bytes=rendered.scratch_bytes,
                      index_bits=self.index_bits, key=h,
                      may_fail=any("sf_err" in b[0] for b in body_fns), options=self.options)


def generate(fusion, seg, types, strides=None, **kw) -> Module:
    return SegmentCodegen(fusion, seg, types, strides, **kw).build()
