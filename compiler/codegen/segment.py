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
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass, field

from ..dtypes import DType
from ..ops.pointwise import opmath
from ..ops.registry import OpKind, Scalar, TensorType
from . import ctypes_ as ct
from . import radix
from . import scatter as _sc
from .layout import contiguous_strides, numel
from .lazy import LAZY_KINDS, Unsupported, coords, delinearize, linearize, render_lazy
from .prelude import PRELUDE

INT32_LIMIT = 2**31 - 2**25  # leaves room for grid-stride overshoot
SMEM_BUDGET = 200 * 1024  # dynamic shared memory we allow ourselves per block (H200: 227 KiB)
PRIV_SMEM = 48 * 1024  # privatized scatter histogram limit
# Streaming kernels: enough blocks that each thread handles a few vectors (more bytes in flight
# than a grid of 8 blocks per SM looping hundreds of times); tunable from the benchmark.
# H200, 2^28-element chain, kernel only: 64 blocks/SM 1072-1076 us, 256: 1057-1061, 1024: 1037, no cap
# (one 16-byte vector per thread): 1029 us, as fast as the device-to-device copy ceiling allows.
VEC_BLOCKS_PER_SM = 1 << 20
ATOMIC_BLOCKS_PER_SM = 1 << 20  # global-atomic scatters: one thread per source (latency-bound)
THREADS = 256
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
    vector_params: list[int] = field(default_factory=list)  # params that need 16-byte alignment
    vector_align: int = 16
    index_bits: int = 32
    key: str = ""
    # whether a kernel may write the error word (a bounds or division check): runs of modules that
    # cannot fail need no synchronization to learn their outcome
    may_fail: bool = True

    @property
    def name_hash(self) -> str:
        return self.key


@dataclass
class Loc:
    kind: str  # param | smem | scratch
    ref: str  # C pointer expression
    strides: tuple
    offset: int = 0


class _Ctx:
    """What lazy renderers see: types, the index type, and how to call another tensor's lambda."""

    def __init__(self, types, I, lam_names, flat: bool = False):
        self.types, self.I, self._lam, self.flat = types, I, lam_names, flat

    def operand_type(self, x):
        return x if isinstance(x, Scalar) else self.types[x]

    def call(self, x, cs) -> str:
        if isinstance(x, Scalar):
            return ct.literal(x.value)
        if self.flat:
            return f"{self._lam[x]}(l)"
        return f"{self._lam[x]}({', '.join(cs)})"


class SegmentCodegen:
    def __init__(self, fusion, seg, types: dict, strides: dict | None = None, *, single_block: bool | None = None,
                 aliased: set | None = None, sm_count: int = 132):
        self.fusion, self.seg, self.types = fusion, seg, types
        self.nodes = [fusion.nodes[p] for p in seg.nodes]
        types = dict(types)
        # Private copies of a scatter's self (rule 1): the copy is an identity of its source, made
        # here when this segment lists it; a scatter whose alias names a copy reads self from it.
        self.copies = {c.dst: c.src for c in getattr(seg, "copies", []) or []}
        for dst, src in self.copies.items():
            types.setdefault(dst, types[src])
        for a in getattr(seg, "aliases", []) or []:
            if getattr(a, "mode", "") == "copy" and a.buffer in types:
                self.nodes = [dataclasses.replace(nd, inputs=(a.buffer,) + tuple(nd.inputs[1:]))
                              if a.tensor in nd.outputs and nd.op.kind is OpKind.scatter else nd for nd in self.nodes]
        self.types = types
        self.sm = sm_count
        kind = getattr(seg.kind, "value", seg.kind)
        self.block_mode = (kind == "single_block") if single_block is None else single_block
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
        self.I = "int" if biggest < INT32_LIMIT else "long long"
        self.index_bits = 32 if self.I == "int" else 64

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
                if self.block_mode and self.smem_used + nbytes <= SMEM_BUDGET // 2:
                    self.loc[o] = Loc("smem", f"((({ct.storage(t.dtype)}*)(sf_smem + {self.smem_used})))",
                                      contiguous_strides(t.shape), self.smem_used)
                    self.smem_used = _align(self.smem_used + nbytes)
                else:
                    self.loc[o] = Loc("scratch", f"((({ct.storage(t.dtype)}*)(sf_scratch + {self.scratch_used})))",
                                      contiguous_strides(t.shape), self.scratch_used)
                    self.scratch_used = _align(self.scratch_used + nbytes)
        # Block mode stages scatter targets that are segment outputs in shared memory too.
        self.stage: dict[str, Loc] = {}
        if self.block_mode:
            for nd in self.anchors:
                if nd.op.kind is OpKind.scatter:
                    o = nd.outputs[0]
                    t = self.types[o]
                    nbytes = numel(t.shape) * t.dtype.itemsize
                    if self.loc[o].kind == "param" and self.smem_used + nbytes <= SMEM_BUDGET // 2:
                        self.stage[o] = Loc("smem", f"((({ct.storage(t.dtype)}*)(sf_smem + {self.smem_used})))",
                                            contiguous_strides(t.shape), self.smem_used)
                        self.smem_used = _align(self.smem_used + nbytes)

    # ---- lambdas -----------------------------------------------------------------------
    def _lambdas(self, flat_leaf=None, only=None) -> tuple[str, dict]:
        """Definitions of one lambda per tensor. flat_leaf(name) gives leaf bodies in flat mode;
        `only` restricts the definitions to those tensors (flat mode defines just the outputs' cone)."""
        names, lines = {}, []
        ctx = _Ctx(self.types, self.I, names, flat=flat_leaf is not None)
        counter = 0

        def sig(t: TensorType):
            if flat_leaf is not None:
                return f"({self.I} l)"
            return "(" + ", ".join(f"{self.I} c{k}" for k in range(t.rank)) + ")"

        def materialized(n):
            nonlocal counter
            t = self.types[n]
            loc = self.stage.get(n) or self.loc[n]
            name = f"v{counter}"
            counter += 1
            names[n] = name
            if only is not None and n not in only:
                return
            if flat_leaf is not None:
                body = flat_leaf(n)
            else:
                off = " + ".join(f"({self.I})c{k} * {s}" for k, s in enumerate(loc.strides) if s != 0 and t.shape[k] != 1) or "0"
                body = f"return {ct.cvt(f'{loc.ref}[{off}]', ct.value(t.dtype))};"
            lines.append(f"  auto {name} = [&]{sig(t)} -> {ct.value(t.dtype)} {{ {body} }};")

        for n in self.seg.inputs:
            materialized(n)
        copies_left = dict(self.copies)

        def define_copies():
            for dst, src in list(copies_left.items()):
                if src in names:
                    del copies_left[dst]
                    t = self.types[dst]
                    name = f"v{counter_next()}"
                    names[dst] = name
                    if only is None or dst in only:
                        args = "l" if flat_leaf is not None else ", ".join(f"c{k}" for k in range(t.rank))
                        lines.append(f"  auto {name} = [&]{sig(t)} -> {ct.value(t.dtype)} {{ return {names[src]}({args}); }};")

        def counter_next():
            nonlocal counter
            counter += 1
            return counter - 1

        define_copies()
        for nd in self.nodes:
            define_copies()
            if nd.op.kind in LAZY_KINDS:
                o = nd.outputs[0]
                t = self.types[o]
                name = f"v{counter}"
                counter += 1
                names[o] = name
                if only is not None and o not in only:
                    continue
                body = render_lazy(ctx, nd, t)
                lines.append(f"  auto {name} = [&]{sig(t)} -> {ct.value(t.dtype)} {{ {body} }};")
            else:
                for o in nd.outputs:
                    if o not in names:
                        materialized(o)
        define_copies()
        return "\n".join(lines), names

    # ---- flatness (for vectorized pointwise) ---------------------------------------------
    def _flat_ok(self, outs: list[str]) -> bool:
        shape = self.types[outs[0]].shape
        seen = {}

        def ok(n) -> bool:
            if n in seen:
                return seen[n]
            t = self.types[n]
            r = tuple(t.shape) == tuple(shape)
            if r and n in self.seg.inputs:
                r = self.strides[n] == contiguous_strides(shape)
            elif r and n in self.producer:
                nd = self.producer[n]
                if nd.op.kind is OpKind.pointwise:
                    r = all(isinstance(x, Scalar) or ok(x) for x in nd.inputs)
                elif nd.op.name in ("full", "full_like"):
                    r = True
                else:
                    r = False
            seen[n] = r
            return r

        return all(ok(o) for o in outs), set(seen)

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
        if self.block_mode:
            body_fns.append(self._block_kernel(phases))
        else:
            for ph in phases:
                body_fns.extend(self._grid_kernels(ph))
        params = []
        for k, n in enumerate(self.params):
            t = self.types[n]
            params.append(f"{ct.storage(t.dtype)}* t{k}")
        params += ["unsigned char* sf_scratch", "long long* sf_err", "unsigned int* sf_ctr"]
        plist = ", ".join(params)
        text = []
        for i, (body, _grid, block, _smem, _vec) in enumerate(body_fns):
            text.append(f"extern \"C\" __global__ void __launch_bounds__({block}) SFNAME_{i}({plist}) {{\n"
                        f"  extern __shared__ __align__(16) unsigned char sf_smem[];\n{body}\n}}\n")
        src_body = "\n".join(text)
        h = hashlib.sha256((PRELUDE + src_body).encode()).hexdigest()[:16]
        kname = f"sf_k_{h}"
        source = PRELUDE + "\n" + src_body.replace("SFNAME_", f"{kname}_")
        launches = []
        for i, (_body, grid, block, smem, vec) in enumerate(body_fns):
            launches.append(Launch(f"{kname}_{i}", grid, block, smem,
                                   vector_of=f"{kname}_{i + 1}" if vec else None))
        vec_params = [k for k, n in enumerate(self.params)] if any(b[4] is not None for b in body_fns) else []
        return Module(source=source, params=list(self.params), launches=launches,
                      scratch_bytes=self.scratch_used, vector_params=vec_params,
                      index_bits=self.index_bits, key=h,
                      may_fail=any("sf_err" in b[0] for b in body_fns))

    # ---- grid mode ---------------------------------------------------------------------
    def _grid(self, work: int, threads: int = THREADS, per_sm: int = 8) -> int:
        return max(1, min(-(-work // threads), self.sm * per_sm))

    def _grid_kernels(self, ph):
        kind, what = ph
        I = self.I
        gstart = f"(({I})blockIdx.x * blockDim.x + threadIdx.x)"
        gstep = f"(({I})gridDim.x * blockDim.x)"
        if kind == "materialize":
            lam, _ = self._lambdas()
            n = numel(self.types[what[0]].shape)
            res = [(lam + "\n" + self._materialize(what, gstart, gstep), self._grid(n), THREADS, 0, None)]
            vec = self._vector_materialize(what)
            if vec is not None:
                # the vector variant is listed first; the runtime picks it when pointers are aligned
                # listed first: the runtime launches it instead of the next (scalar) kernel when
                # every pointer is aligned to a vector
                res.insert(0, (vec, self._grid(max(1, n // 4), per_sm=VEC_BLOCKS_PER_SM), THREADS, 0, True))
            return res
        nd = what
        kindname = nd.op.kind
        if kindname is OpKind.reduction:
            return [self._reduce_grid(nd)]
        if kindname is OpKind.scan:
            return [self._scan(nd, grid=True)]
        if kindname is OpKind.sort:
            return [self._sort(nd, grid=True)]
        if kindname is OpKind.scatter:
            return self._scatter_grid(nd)
        raise Unsupported(f"anchor kind {kindname}")

    def _materialize(self, outs, start, step, lam_names=None) -> str:
        I = self.I
        t = self.types[outs[0]]
        n = numel(t.shape)
        _, names = self._lambdas() if lam_names is None else (None, lam_names)
        cs = coords(t.rank)
        stores = []
        for o in outs:
            loc = self.loc[o]
            st = ct.storage(self.types[o].dtype)
            stores.append(f"{loc.ref}[l] = {ct.cvt(f'{names[o]}({chr(44).join(cs)})', st)};")
        return (f"  for ({I} l = {start}; l < ({I}){n}; l += {step}) {{\n"
                f"    {delinearize('l', t.shape, I)}\n    " + "\n    ".join(stores) + "\n  }")

    def _vector_materialize(self, outs):
        t = self.types[outs[0]]
        n = numel(t.shape)
        if n < 4:
            return None
        flat, cone = self._flat_ok(outs)
        if not flat:
            return None
        leaves = [x for x in self.seg.inputs if x in cone]
        sizes = {self.types[x].dtype.itemsize for x in leaves} | {self.types[o].dtype.itemsize for o in outs}
        if max(sizes) > 8:
            return None
        I = self.I
        ids = {x: k for k, x in enumerate(self.params)}

        def x_id(x):
            return ids[x]

        lam_flat, names = self._lambdas(flat_leaf=lambda x: (
            f"return {ct.cvt(f'ld_{x_id(x)}.v[j]', ct.value(self.types[x].dtype))};" if x in leaves else
            f"return {ct.cvt(f'{self.loc[x].ref}[l]', ct.value(self.types[x].dtype))};"), only=cone)
        loads = "".join(f"    sf_v4<{ct.storage(self.types[x].dtype)}> ld_{x_id(x)} = "
                        f"sf_vload((const sf_v4<{ct.storage(self.types[x].dtype)}>*){self.loc[x].ref} + q);\n" for x in leaves)
        outs_decl = "".join(f"    sf_v4<{ct.storage(self.types[o].dtype)}> st_{x_id(o)};\n" for o in outs)
        outs_set = "".join(f"      st_{x_id(o)}.v[j] = {ct.cvt(f'{names[o]}(l)', ct.storage(self.types[o].dtype))};\n"
                           for o in outs)
        outs_st = "".join(f"    sf_vstore((sf_v4<{ct.storage(self.types[o].dtype)}>*){self.loc[o].ref} + q, st_{x_id(o)});\n"
                          for o in outs)
        nq = n // 4
        # lambdas are defined inside the lane loop so they see the loaded vectors and lane j
        body = (f"  for ({I} q = ({I})blockIdx.x * blockDim.x + threadIdx.x; q < ({I}){nq}; q += ({I})gridDim.x * blockDim.x) {{\n"
                f"{loads}{outs_decl}"
                f"    #pragma unroll\n    for (int j = 0; j < 4; ++j) {{\n      {I} l = q * 4 + j;\n"
                + "\n".join("    " + ln for ln in lam_flat.split("\n")) + "\n"
                + outs_set + "    }\n" + outs_st + "  }\n")
        # tail (n % 4 elements) in scalar flat mode
        lam_tail, tnames = self._lambdas(flat_leaf=lambda x: f"return {ct.cvt(f'{self.loc[x].ref}[l]', ct.value(self.types[x].dtype))};",
                                         only=cone)
        tail_stores = "".join(f"    {self.loc[o].ref}[l] = {ct.cvt(f'{tnames[o]}(l)', ct.storage(self.types[o].dtype))};\n"
                              for o in outs)
        body += (f"  for ({I} l = ({I}){nq * 4} + ({I})blockIdx.x * blockDim.x + threadIdx.x; l < ({I}){n}; "
                 f"l += ({I})gridDim.x * blockDim.x) {{\n{lam_tail}\n{tail_stores}  }}\n")
        return body

    # ---- reductions --------------------------------------------------------------------
    def _reduce_parts(self, nd):
        from ..ops.reductions import reduced_dims

        x = nd.inputs[0]
        xt = self.types[x]
        ot = self.types[nd.outputs[0]]
        name = nd.op.name
        if name in ("argmax", "argmin"):
            rd = tuple(range(xt.rank)) if nd.attrs.dim is None else ((nd.attrs.dim % xt.rank,) if xt.rank else ())
        else:
            rd = reduced_dims(xt, nd.attrs.dims)
        kd = [k for k in range(xt.rank) if k not in rd]
        R = numel([xt.shape[k] for k in kd])
        K = numel([xt.shape[k] for k in rd])
        return x, xt, ot, name, rd, kd, R, K

    def _reduce_body(self, nd, row0, rowstep, lane, lanes, reducer, dst_ref) -> str:
        x, xt, ot, name, rd, kd, R, K = self._reduce_parts(nd)
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
        if name in ("argmax", "argmin"):
            v = ct.value(opmath(xt.dtype))
            W = f"sf_argpair<{v}>"
            cmp = ">" if name == "argmax" else "<"
            comb = (f"[&]({W} a, {W} b) -> {W} {{ if (a.i < 0) return b; if (b.i < 0) return a; "
                    f"bool an = a.v != a.v, bn = b.v != b.v; if (an || bn) {{ if (an && bn) return a.i < b.i ? a : b; return an ? a : b; }} "
                    f"if (a.v {cmp} b.v) return a; if (b.v {cmp} a.v) return b; return a.i < b.i ? a : b; }}")
            ident = f"{W}{{({v})0, -1LL}}"
            elem = f"{W}{{{ct.cvt(load, v)}, (long long)k}}"
            post = "acc.i"
        else:
            wdt = opmath(ot.dtype)
            W = ct.value(wdt)
            op = {"sum": "sf_op_add", "mean": "sf_op_add", "prod": "sf_op_mul", "amax": "sf_op_amax",
                  "amin": "sf_op_amin"}[name]
            comb = f"[&]({W} a, {W} b) -> {W} {{ return {op}::f<{W}>(a, b); }}"
            ident = f"{op}::id<{W}>()"
            elem = ct.cvt(load, W)
            post = f"(acc / ({W}){K})" if name == "mean" else "acc"
        red = reducer.format(W=W)
        return (f"  {{ auto comb = {comb};\n"
                f"  for ({I} row = {row0}; row < ({I}){R}; row += {rowstep}) {{\n"
                f"    {row_decl}\n    {W} acc = {ident};\n"
                f"    for ({I} k = {lane}; k < ({I}){K}; k += {lanes}) {{ {k_decl} acc = comb(acc, {elem}); }}\n"
                f"    acc = {red};\n"
                f"    if ({lane} == 0) {dst_ref}[row] = {ct.cvt(post, ct.storage(ot.dtype))};\n  }} }}")

    def _reduce_grid(self, nd):
        x, xt, ot, name, rd, kd, R, K = self._reduce_parts(nd)
        lam, _ = self._lambdas()
        dst = self.loc[nd.outputs[0]].ref
        if K <= 256 and R >= 64:
            body = self._reduce_body(nd, f"((({self.I})blockIdx.x * blockDim.x + threadIdx.x) >> 5)",
                                     f"((({self.I})gridDim.x * blockDim.x) >> 5)", "(threadIdx.x & 31)", "32",
                                     "sf_warp_reduce(acc, comb)", dst)
            return (lam + "\n" + body, self._grid(R * 32), THREADS, 0, None)
        threads = 1024 if K >= 4096 else max(32, min(1024, 1 << max(5, (K - 1).bit_length())))
        body = self._reduce_body(nd, "blockIdx.x", "gridDim.x", "threadIdx.x", "blockDim.x",
                                 "sf_block_reduce(acc, comb)", dst)
        return (lam + "\n" + body, max(1, min(R, self.sm * 16)), threads, 0, None)

    # ---- scans -------------------------------------------------------------------------
    def _scan_body(self, nd, row0, rowstep, dst_ref) -> str:
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
        op = {"cumsum": "sf_op_add", "cumprod": "sf_op_mul"}[nd.op.name]
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

    def _scan(self, nd, grid: bool):
        xt = self.types[nd.inputs[0]]
        L = xt.shape[nd.attrs.dim % xt.rank] if xt.rank else 1
        R = numel(xt.shape) // max(L, 1) if L else 0
        dst = self.loc[nd.outputs[0]].ref
        body = self._scan_body(nd, "blockIdx.x", "gridDim.x", dst)
        lam, _ = self._lambdas()
        threads = max(32, min(1024, 1 << max(5, (max(L, 1) - 1).bit_length())))
        return (lam + "\n" + body, max(1, min(R, self.sm * 16)), threads, 0, None)

    # ---- sorts (bitonic on (key, index) pairs: stable because ties break by index) -------
    def _sort_parts(self, nd):
        x = nd.inputs[0]
        xt = self.types[x]
        if xt.rank == 0:
            raise Unsupported("sort of a 0-d tensor")
        d = nd.attrs.dim % xt.rank
        L = xt.shape[d]
        P = 1 << max(0, (max(L, 1) - 1).bit_length())
        V = ct.value(xt.dtype)
        nbytes = _align(P * (8 if V in ("double", "long long") else 4)) + P * 4
        return x, xt, d, L, P, V, nbytes

    def _sort_body(self, nd, row0, rowstep, smem_off) -> str:
        x, xt, d, L, P, V, nbytes = self._sort_parts(nd)
        I = self.I
        name = nd.op.name
        if name == "topk":
            desc, k = nd.attrs.largest, self.types[nd.outputs[0]].shape[d]
        else:
            desc, k = nd.attrs.descending, L
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
        return (f"  {{ {V}* sk = ({V}*)(sf_smem + {smem_off}); int* si = (int*)(sf_smem + {smem_off + _align(P * (8 if V in ('double', 'long long') else 4))});\n"
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

    def _radix_body(self, nd, smem_off) -> str:
        """Stable LSD radix sort of one rank-1 integer row in one block of 1024 threads (see
        radix.py): 8-bit digits over only the bits of the keys' range, warp-level ranking."""
        x, xt, d, L, P, V, nbytes = self._sort_parts(nd)
        if xt.rank != 1:
            raise Unsupported("radix sort of a multi-row tensor in one block")
        name = nd.op.name
        desc = nd.attrs.largest if name == "topk" else nd.attrs.descending
        k = self.types[nd.outputs[0]].shape[0] if name == "topk" else L
        _, names = self._lambdas()
        base = self.scratch_used
        self.scratch_used = _align(base + radix.scratch_bytes(L))
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
            store_val=(lambda pos, u: f"{val_ref}[{pos}] = {value(u)};") if val_ref is not None else None)

    def _dst(self, o):
        return (self.stage.get(o) or self.loc[o]).ref

    def _sort(self, nd, grid: bool):
        x, xt, d, L, P, V, nbytes = self._sort_parts(nd)
        if nbytes > SMEM_BUDGET:
            raise Unsupported(f"sort of {L} elements does not fit in shared memory")
        R = numel(xt.shape) // max(L, 1) if L else 0
        lam, _ = self._lambdas()
        body = self._sort_body(nd, "blockIdx.x", "gridDim.x", 0)
        threads = max(32, min(1024, P // 2))
        return (lam + "\n" + body, max(1, min(R, self.sm * 16)), threads, nbytes, None)

    # ---- scatter -----------------------------------------------------------------------
    def _scatter_parts(self, nd):
        """(domain shape, statements computing `lin` (target offset) + `val`, reduce, value type)."""
        name = nd.op.name
        selft = self.types[nd.inputs[0]]
        if selft.rank == 0:
            raise Unsupported("scatter into a 0-d tensor")
        _, names = self._lambdas()
        I = self.I
        vt = ct.value(selft.dtype)
        ctx = _Ctx(self.types, I, names)

        def chk(var, size, dim, neg=False, index=None):
            if index is not None and self._index_within(index, size):
                return ""  # provably in range: no check, so the kernel cannot fail on it
            lo = f"-{size}" if neg else "0"
            wrap = f" if ({var} < 0) {var} += {size};" if neg else ""
            return (f"if ({var} < {lo} || {var} >= {size}) {{ sf_fail(sf_err, 1, {nd.index}, {var}, {dim}, {size}); "
                    f"continue; }}{wrap}")

        if name == "scatter":
            d = nd.attrs.dim % selft.rank
            idx, src = nd.inputs[1], nd.inputs[2]
            dom = self.types[idx].shape
            cs = coords(len(dom))
            pre = f"long long ix = (long long)({ctx.call(idx, cs)}); {chk('ix', selft.shape[d], d, index=idx)}"
            tc = list(cs)
            tc[d] = f"({I})ix"
            val = ct.cvt(ctx.call(src, cs), vt)
            reduce = nd.attrs.reduce
            include_self = nd.attrs.include_self
        elif name == "index_add":
            d = nd.attrs.dim % selft.rank
            idx, src = nd.inputs[1], nd.inputs[2]
            dom = self.types[src].shape
            cs = coords(len(dom))
            it = self.types[idx]
            pre = f"long long ix = (long long)({ctx.call(idx, [cs[d]] if it.rank else [])}); {chk('ix', selft.shape[d], d)}"
            tc = list(cs)
            tc[d] = f"({I})ix"
            alpha = nd.attrs.alpha
            val = ct.cvt(ctx.call(src, cs), vt)
            if alpha != 1:
                val = f"sf_mul({val}, {ct.literal(alpha, vt)})"
            reduce, include_self = "add", True
        elif name == "index_put":
            idx, vals = nd.inputs[1], nd.inputs[2]
            it = self.types[idx]
            dom = tuple(it.shape) + tuple(selft.shape[1:])
            cs = coords(len(dom))
            pre = f"long long ix = (long long)({ctx.call(idx, cs[:it.rank])}); {chk('ix', selft.shape[0], 0, neg=True)}"
            tc = [f"({I})ix"] + cs[it.rank:]
            if isinstance(vals, Scalar):
                val = ct.literal(vals.value, vt)
            else:
                vtt = self.types[vals]
                off = len(dom) - vtt.rank
                vcs = ["0" if vtt.shape[j] == 1 else cs[j + off] for j in range(vtt.rank)]
                val = ct.cvt(ctx.call(vals, vcs), vt)
            reduce, include_self = ("add" if nd.attrs.accumulate else "none"), True
        else:
            raise Unsupported(f"scatter op {name}")
        lin = linearize(tc, selft.shape, I)
        return dom, pre, lin, val, reduce, include_self, selft, cs

    def _small_int_counts(self, nd, n_dom: int) -> bool:
        """True for a `scatter` add into an integer target of a constant integer c (a histogram:
        `full_like(ids, 1)`) with n_dom * |c| < 2^31, so per-block partial sums fit 32 bits."""
        if nd.op.name != "scatter" or not self.types[nd.outputs[0]].dtype.is_int:
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
        dom, pre, lin, val, reduce, include_self, selft, cs = self._scatter_parts(nd)
        I = self.I
        act = _sc.act(self, selft, reduce, lin, val, target_ref, mode, W, window)
        n = numel(dom)
        return (f"  for ({I} l = {start}; l < ({I}){n}; l += {step}) {{\n"
                f"    {delinearize('l', dom, I)}\n    {pre}\n    {act}\n  }}")

    def _block_scatter_loop(self, nd, target_ref, mode, W=None, blocks: int = 1) -> str:
        """The single-block scatter loop, batched: each thread first loads the indices of its next
        BLOCK_BATCH sources, then applies them. One SM walks the whole domain, so without batching
        every iteration waits one global-load latency (the compiler does not move loads above the
        previous iteration's atomic). Bad indices are reported after the loop. With `blocks` > 1
        the blocks of the grid share the domain (the first phase of a multi-block histogram)."""
        dom, pre, lin, val, reduce, include_self, selft, cs = self._scatter_parts(nd)
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

    def _init_target(self, nd, target_ref, start, step, window=None) -> str:
        selfn = nd.inputs[0]
        t = self.types[nd.outputs[0]]
        _, names = self._lambdas()
        I = self.I
        lo, hi = window or (0, numel(t.shape))
        return (f"  for ({I} l = ({I}){lo} + {start}; l < ({I}){hi}; l += {step}) {{\n"
                f"    {delinearize('l', t.shape, I)}\n"
                f"    {target_ref}[l] = {ct.cvt(f'{names[selfn]}({chr(44).join(coords(t.rank))})', ct.storage(t.dtype))};\n  }}")

    def _scatter_grid(self, nd):
        dom, pre, lin, val, reduce, include_self, selft, cs = self._scatter_parts(nd)
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
            return res
        vec = _sc.vector_plan(self, nd)  # (leaves, V): a 16-byte-load variant goes before each scalar kernel
        Wd = ct.WIDE[selft.dtype]
        wsize = 8 if Wd in ("long long", "double") else 4
        if n_out * wsize <= PRIV_SMEM and n_dom >= 8 * n_out and n_dom >= 4096:
            if o not in self.aliased:
                res.append((lam + "\n" + self._init_target(nd, dst, gstart, gstep), self._grid(n_out), THREADS, 0, None))
            if not include_self:
                res.append((lam + "\n" + self._scatter_loop(nd, gstart, gstep, dst, "identity"), self._grid(n_dom), THREADS, 0, None))
            # Privatize: per-block histograms in shared memory (one replica per group of warps, so
            # warps rarely contend for a bin), one global atomic per bin per block.
            op = ct.COMBINE[reduce]
            threads = _sc.HIST_THREADS
            reps = 1
            while reps < min(32, threads // 32) and n_out * wsize * reps * 2 <= PRIV_SMEM:
                reps *= 2
            head = (lam + "\n"
                    f"  {Wd}* h = ({Wd}*)sf_smem + (threadIdx.x >> 5) % {reps} * {n_out};\n"
                    f"  for (int j = threadIdx.x; j < {n_out * reps}; j += blockDim.x) (({Wd}*)sf_smem)[j] = {op}::id<{Wd}>();\n"
                    f"  __syncthreads();\n")
            tail = ("\n  __syncthreads();\n"
                    f"  for (int j = threadIdx.x; j < {n_out}; j += blockDim.x) {{ {Wd} hv = (({Wd}*)sf_smem)[j];\n"
                    f"    for (int r = 1; r < {reps}; ++r) hv = {op}::f<{Wd}>(hv, (({Wd}*)sf_smem)[r * {n_out} + j]);\n"
                    f"    if (hv != {op}::id<{Wd}>()) sf_atomic<{op}, {ct.storage(selft.dtype)}, {Wd}>(&{dst}[j], hv); }}")
            smem = _align(n_out * wsize * reps)
            if vec is not None:
                leaves, V = vec
                loop = _sc.vector_loop(
                    self, nd, leaves, V, threads, pre + "\n" + _sc.act(self, selft, reduce, lin, val, "h", "atomic", Wd),
                    self._scatter_loop(nd, f"sf_l0 + {gstart}", gstep, "h", "atomic", W=Wd))
                res.append((head + loop + tail, _sc.vector_blocks(self, n_dom, V, threads, _sc.HIST_BLOCKS_PER_SM, 16),
                            threads, smem, True))
            blocks = max(1, min(-(-n_dom // (threads * 16)), self.sm * _sc.HIST_BLOCKS_PER_SM))
            res.append((head + self._scatter_loop(nd, gstart, gstep, "h", "atomic", W=Wd) + tail, blocks, threads, smem, None))
            return res
        # Global atomics. A target larger than L2 is split into windows, one pass over the sources
        # each, so the random atomics of a pass hit L2 (see scatter.py).
        wins = _sc.window_bounds(n_out, _sc.windows(n_out * selft.dtype.itemsize, n_dom))
        # initializing each window right before its pass also leaves it hot in L2 (stream order
        # makes the copy complete before the pass starts)
        init_each = o not in self.aliased and include_self and wins[0] is not None
        if o not in self.aliased and not init_each:
            res.append((lam + "\n" + self._init_target(nd, dst, gstart, gstep), self._grid(n_out), THREADS, 0, None))
        if not include_self:
            res.append((lam + "\n" + self._scatter_loop(nd, gstart, gstep, dst, "identity"), self._grid(n_dom), THREADS, 0, None))
        for win in wins:
            if init_each:
                res.append((lam + "\n" + self._init_target(nd, dst, gstart, gstep, win), self._grid(win[1] - win[0]),
                            THREADS, 0, None))
            if vec is not None:
                leaves, V = vec
                threads = _sc.ATOMIC_THREADS
                loop = _sc.vector_loop(
                    self, nd, leaves, V, threads, pre + "\n" + _sc.act(self, selft, reduce, lin, val, dst, "atomic", window=win),
                    self._scatter_loop(nd, f"sf_l0 + {gstart}", gstep, dst, "atomic", window=win))
                res.append((lam + "\n" + loop, _sc.vector_blocks(self, n_dom, V, threads, _sc.ATOMIC_VEC_BLOCKS_PER_SM),
                            threads, 0, True))
            res.append((lam + "\n" + self._scatter_loop(nd, gstart, gstep, dst, "atomic", window=win),
                        self._grid(n_dom, per_sm=ATOMIC_BLOCKS_PER_SM), THREADS, 0, None))
        return res

    # ---- single-block mode -------------------------------------------------------------
    def _block_kernel(self, phases):
        blocks = self._histogram_blocks(phases)
        lam, names = self._lambdas()
        parts = [lam]
        sort_off = self.smem_used
        smem = self.smem_used
        work = 32
        for kind, what in phases:
            if kind == "materialize":
                parts.append(self._materialize(what, "threadIdx.x", "blockDim.x", names))
                work = max(work, numel(self.types[what[0]].shape))
            else:
                nd = what
                k = nd.op.kind
                if k is OpKind.reduction:
                    x, xt, ot, name, rd, kd, R, K = self._reduce_parts(nd)
                    parts.append(self._reduce_body(nd, "0", "1", "threadIdx.x", "blockDim.x",
                                                   "sf_block_reduce(acc, comb)", self._dst(nd.outputs[0])))
                    work = max(work, K)
                elif k is OpKind.scan:
                    parts.append(self._scan_body(nd, "0", "1", self._dst(nd.outputs[0])))
                    xt = self.types[nd.inputs[0]]
                    work = max(work, xt.shape[nd.attrs.dim % xt.rank] if xt.rank else 1)
                elif k is OpKind.sort:
                    x, xt, d, L, P, V, nbytes = self._sort_parts(nd)
                    if L > RADIX_MIN and xt.rank == 1 and not xt.dtype.is_float:
                        parts.append(self._radix_body(nd, sort_off))
                        smem = max(smem, sort_off + radix.SMEM_BYTES)
                        work = radix.THREADS  # the radix sort needs exactly 1024 threads
                    else:
                        smem = max(smem, sort_off + nbytes)
                        parts.append(self._sort_body(nd, "0", "1", sort_off))
                        work = max(work, P // 2)
                elif k is OpKind.scatter:
                    body, extra = self._scatter_block(nd, sort_off, blocks if nd is phases[0][1] else 1)
                    parts.append(body)
                    smem = max(smem, sort_off + extra)
                    dom = self._scatter_parts(nd)[0]
                    work = max(work, numel(dom))
                else:
                    raise Unsupported(f"anchor kind {k}")
            parts.append("  __syncthreads();")
        if smem > SMEM_BUDGET:
            raise Unsupported("single-block segment needs too much shared memory")
        threads = min(1024, max(32, -(-work // 32) * 32))
        return (_unroll_block_loops("\n".join(parts), threads), blocks, threads, _align(smem), None)

    def _privatized(self, nd):
        """(replica type, target accumulation type, replica bytes, replicas) when a single-block
        scatter accumulates in warp-group replicas of its target in shared memory; else None."""
        dom, pre, lin, val, reduce, include_self, selft, cs = self._scatter_parts(nd)
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
        return None

    def _histogram_blocks(self, phases) -> int:
        """Blocks for a single-block segment that starts with a privatized scatter over many
        sources: that phase is bound by one SM's loads (MoE histogram of 32768 ids: 7 us), so the
        grid's blocks share it, each writing its partial histogram to scratch; the last block to
        finish (a ticket counter) combines them and runs the rest of the segment alone."""
        if not phases or phases[0][0] != "anchor" or phases[0][1].op.kind is not OpKind.scatter:
            return 1
        nd = phases[0][1]
        if self._privatized(nd) is None:
            return 1
        blocks = min(self.sm, -(-numel(self._scatter_parts(nd)[0]) // HIST_BLOCK_SOURCES))
        return blocks if blocks >= 4 else 1

    def _scatter_block(self, nd, free_off: int, blocks: int = 1) -> tuple[str, int]:
        """(code, extra shared memory at free_off). Many sources per target: warp-group replicas
        of the target in shared memory take the atomics (little contention), then one thread per
        element combines them into the target. With `blocks` > 1, see `_histogram_blocks`."""
        dom, pre, lin, val, reduce, include_self, selft, cs = self._scatter_parts(nd)
        o = nd.outputs[0]
        staged = o in self.stage
        tgt = self._dst(o)
        out = []
        n_out = numel(selft.shape)
        priv = self._privatized(nd)
        if priv is not None:
            Wd, Wt, wsz, reps = priv
            op = ct.COMBINE[reduce]
            S = ct.storage(selft.dtype)
            rep = f"(({Wd}*)(sf_smem + {free_off}))"
            if blocks == 1:
                out.append(self._init_target(nd, tgt, "threadIdx.x", "blockDim.x"))
            out.append(f"  for (int j = threadIdx.x; j < {n_out * reps}; j += blockDim.x) {rep}[j] = {op}::id<{Wd}>();")
            out.append("  __syncthreads();")
            out.append(f"  {{ {Wd}* sf_rep = {rep} + ((threadIdx.x >> 5) % {reps}) * {n_out};")
            out.append(self._block_scatter_loop(nd, "sf_rep", "atomic", W=Wd, blocks=blocks) + " }")
            out.append("  __syncthreads();")
            fold = (f"{Wd} hv = {rep}[j];\n"
                    f"    for (int r = 1; r < {reps}; ++r) hv = {op}::f<{Wd}>(hv, {rep}[r * {n_out} + j]);")
            if blocks > 1:
                part = self.scratch_used
                self.scratch_used = _align(part + blocks * n_out * wsz)
                P = f"(({Wd}*)(sf_scratch + {part}))"
                out.append(f"  for (int j = threadIdx.x; j < {n_out}; j += blockDim.x) {{ {fold}\n"
                           f"    {P}[blockIdx.x * {n_out} + j] = hv; }}")
                out.append(_LAST_BLOCK)
                out.append(self._init_target(nd, tgt, "threadIdx.x", "blockDim.x"))
                out.append("  __syncthreads();")
                fold = (f"{Wd} hv = {op}::id<{Wd}>();\n"
                        f"    for (int b = 0; b < {blocks}; ++b) hv = {op}::f<{Wd}>(hv, __ldcg(&{P}[b * {n_out} + j]));")
            out.append(f"  for (int j = threadIdx.x; j < {n_out}; j += blockDim.x) {{ {fold}\n"
                       f"    if (hv != {op}::id<{Wd}>()) {tgt}[j] = sf_cvt<{S}>({op}::f<{Wt}>(sf_cvt<{Wt}>({tgt}[j]), ({Wt})hv)); }}")
            t = self.types[o]
            out.append("  __syncthreads();")
            out.append(f"  for (int j = threadIdx.x; j < {numel(t.shape)}; j += blockDim.x) {self.loc[o].ref}[j] = {tgt}[j];")
            return "\n".join(out), n_out * wsz * reps
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
        return "\n".join(out), 0


# Single-block scatter loops load this many indices per thread before applying them.
BLOCK_BATCH = 8
# Sources per block of a multi-block histogram (`_histogram_blocks`): one batch of its 1024
# threads; at least 4 blocks.
HIST_BLOCK_SOURCES = BLOCK_BATCH * 1024
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


_BLOCK_LOOP = re.compile(r"^(\s*)(for \((?:int|long long) [a-z]\w* = threadIdx\.x; )", re.M)


def _unroll_block_loops(body: str, threads: int) -> str:
    """A single-block kernel always runs with `threads` threads: with that constant as the stride,
    loop trip counts are known and `#pragma unroll` lets the compiler issue several iterations'
    global loads before their uses. One SM runs the whole segment, so its loops are bound by
    memory latency, not bandwidth (MoE histogram of 32768 ids: 32 dependent load-atomic rounds)."""
    body = body.replace("blockDim.x", str(threads))
    return _BLOCK_LOOP.sub(lambda m: f"{m.group(1)}#pragma unroll 4\n{m.group(1)}{m.group(2)}", body)


def _align(n: int, a: int = 16) -> int:
    return (n + a - 1) // a * a


def generate(fusion, seg, types, strides=None, **kw) -> Module:
    return SegmentCodegen(fusion, seg, types, strides, **kw).build()


_ = DType
