"""The pointwise family: one C++ lambda per tensor of a segment, and the kernels that materialize
lazily computed outputs (a grid-stride loop, plus a 16-byte-vector variant when every tensor of
the outputs' cone is flat and contiguous).

`PointwiseRenderer` reads a `KernelInput` (kernel_input.py) without its `lambdas`: its own
`lambdas` are every family's way to read a tensor (`KernelInput.lambdas`).
"""

from __future__ import annotations

from ..ops.registry import LAZY_KINDS, Lowering, OpKind, Scalar, TensorType
from . import ctypes_ as ct
from .kernel_input import KernelInput
from .layout import contiguous_strides, numel
from .lazy import RENDERERS, coords, delinearize, render_lazy


class LambdaCtx:
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


class PointwiseRenderer:
    LOWERINGS = frozenset(RENDERERS)  # the lazy ops, rendered as lambdas (lazy.py)

    def __init__(self, inp: KernelInput):
        self.seg, self.nodes, self.types, self.strides = inp.seg, inp.nodes, inp.types, inp.strides
        self.loc, self.stage, self.copies, self.producer = inp.loc, inp.stage, inp.copies, inp.producer
        self.params, self.I = inp.params, inp.I

    # ---- lambdas -----------------------------------------------------------------------
    def lambdas(self, flat_leaf=None, only=None, leaf=None) -> tuple[str, dict]:
        """Definitions of one lambda per tensor. flat_leaf(name) gives leaf bodies in flat mode;
        `only` restricts the definitions to those tensors (flat mode defines just the outputs' cone);
        leaf(name) may give a materialized tensor's body in coordinate mode (None: read its location)."""
        names, lines = {}, []
        ctx = LambdaCtx(self.types, self.I, names, flat=flat_leaf is not None)
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
            elif leaf is not None and leaf(n) is not None:
                body = leaf(n)
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
            elif r and n in self.copies:  # a private copy reads its source: that is in the cone
                r = ok(self.copies[n])
            elif r and n in self.producer:
                nd = self.producer[n]
                if nd.op.kind is OpKind.pointwise:
                    r = all(isinstance(x, Scalar) or ok(x) for x in nd.inputs)
                elif nd.op.lowering is Lowering.fill:  # (an iota depends on its position)
                    r = True
                else:
                    r = False
            seen[n] = r
            return r

        return all(ok(o) for o in outs), set(seen)

    def materialize(self, outs, start, step, lam_names=None) -> str:
        """A grid-stride loop (from `start` by `step`) storing outputs `outs` of one shape."""
        I = self.I
        t = self.types[outs[0]]
        n = numel(t.shape)
        _, names = self.lambdas() if lam_names is None else (None, lam_names)
        cs = coords(t.rank)
        stores = []
        for o in outs:
            loc = self.loc[o]
            st = ct.storage(self.types[o].dtype)
            stores.append(f"{loc.ref}[l] = {ct.cvt(f'{names[o]}({chr(44).join(cs)})', st)};")
        return (f"  for ({I} l = {start}; l < ({I}){n}; l += {step}) {{\n"
                f"    {delinearize('l', t.shape, I)}\n    " + "\n    ".join(stores) + "\n  }")

    def vector_materialize(self, outs):
        """`materialize`'s 16-byte-vector variant, or None where the outputs' cone is not flat and
        contiguous."""
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

        lam_flat, names = self.lambdas(flat_leaf=lambda x: (
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
        lam_tail, tnames = self.lambdas(flat_leaf=lambda x: f"return {ct.cvt(f'{self.loc[x].ref}[l]', ct.value(self.types[x].dtype))};",
                                         only=cone)
        tail_stores = "".join(f"    {self.loc[o].ref}[l] = {ct.cvt(f'{tnames[o]}(l)', ct.storage(self.types[o].dtype))};\n"
                              for o in outs)
        body += (f"  for ({I} l = ({I}){nq * 4} + ({I})blockIdx.x * blockDim.x + threadIdx.x; l < ({I}){n}; "
                 f"l += ({I})gridDim.x * blockDim.x) {{\n{lam_tail}\n{tail_stores}  }}\n")
        return body
