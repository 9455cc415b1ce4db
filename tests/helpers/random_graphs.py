"""Random valid graphs, grown op by op by a hypothesis-driven generator (`Gen`) and evaluated at
once with the PyTorch translation (helpers/torch_reference.py); `check` runs one through segfuse
and compares. tests/test_property_graphs.py describes what they cover and how floats compare;
the emulator (tests/test_cuda_emulator.py) and the GPU (tests/gpu/test_random_graphs_gpu.py) run
the same configurations (`CONFIGS`)."""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, note
from hypothesis import strategies as st
from segfuse.compiler import Engine, Fusion, GraphError, RunError, run_graph

from helpers.torch_oracle import to_torch
from helpers.torch_reference import (
    BINARY,
    DELIBERATE,
    DTYPE_NAME,
    FLOATS,
    INEXACT,
    INPUT_DTYPES,
    INTS,
    LITERALS,
    NEEDS_EXACT,
    TORCH,
    TORCH_DTYPE,
    UNARY,
    T,
    is_float,
    symbolic_broadcast,
)

# ---- the generator --------------------------------------------------------------------------
# Sizes of the base shape: small ones (every graph fits one thread block), and the large ones
# (`Gen(big=True)`) that make grid-mode plans of several segments, where a scatter's self gets a
# private copy made by another segment (the topk -> scatter kernel of issue 15 did not compile).
SMALL_DIMS = [1, 2, 3, 4, 5]
BIG_SHAPES = [[128, 1024], [1024, 128], [131072], [2, 128, 1024], [40000, 3], [3, 40000], [1024, 1, 64], [33, 4099]]


class Gen:
    def __init__(self, data, max_ops: int, kinds: tuple, big: bool = False):
        self.draw = data.draw
        self.rng = np.random.default_rng(self.draw(st.integers(0, 2**32 - 1), label="seed"))
        self.max_ops, self.kinds, self.big = max_ops, kinds, big
        self.inputs: list[dict] = []
        self.ops: list[dict] = []
        self.arrays: dict[str, np.ndarray] = {}  # input data
        self.t: dict[str, T] = {}
        self.expect_error: str | None = None  # a run-time error PyTorch raised for the last op
        self.n = 0
        # a base shape: inputs take suffixes of it, some dims set to 1 (broadcasting)
        if big:
            self.base = list(self.draw(st.sampled_from(BIG_SHAPES), label="big_shape"))
        else:
            self.base = [self.draw(st.sampled_from(SMALL_DIMS)) for _ in range(self.draw(st.integers(0, 3), label="rank"))]
        self.symbolic = [self.draw(st.booleans()) and d > 1 for d in self.base]

    def fresh(self, prefix="t") -> str:
        self.n += 1
        return f"{prefix}{self.n}"

    # -- data -------------------------------------------------------------------------------
    def random_array(self, dtype: str, shape) -> np.ndarray:
        r = self.rng
        shape = tuple(shape)
        if dtype == "bool":
            return np.asarray(r.random(shape) < 0.5)
        if dtype == "uint8":
            return r.integers(0, 9, shape).astype(np.uint8)
        if dtype in INTS:
            return r.integers(-6, 7, shape).astype(dtype)
        a = (r.standard_normal(shape) * 3).astype(np.float64)
        if r.random() < 0.3:  # some exact small integers and halves: ties, exact sums
            a = np.round(a * 2) / 2
        if dtype == "bfloat16":
            return a.astype(ml_dtypes.bfloat16)
        return a.astype(dtype)

    def add_input(self, dtype: str, shape, array=None, symbolic_from_base: bool = False, prefix="x") -> str:
        name = self.fresh(prefix)
        decl = list(shape)
        if symbolic_from_base:
            off = len(self.base) - len(shape)
            decl = [f"D{off + k}" if d != 1 and self.symbolic[off + k] else d for k, d in enumerate(shape)]
        self.inputs.append({"name": name, "dtype": dtype, "shape": decl})
        a = self.random_array(dtype, shape) if array is None else array
        self.arrays[name] = a
        self.t[name] = T(to_torch(a))
        return name

    def new_base_input(self) -> str:
        dtype = self.draw(st.sampled_from(INPUT_DTYPES), label="dtype")
        k = self.draw(st.integers(0, len(self.base)), label="suffix")
        if self.big and self.draw(st.integers(0, 3)):
            k = len(self.base)  # mostly large inputs: the whole base shape
        shape = [1 if self.draw(st.integers(0, 4)) == 0 else d for d in self.base[len(self.base) - k:]]
        return self.add_input(dtype, shape, symbolic_from_base=True)

    # -- checking one op against both sides ------------------------------------------------------
    def graph(self, outputs) -> dict:
        return {"format": "segfuse.fusion/1", "name": "random", "inputs": self.inputs, "ops": self.ops,
                "outputs": outputs}

    def try_op(self, op: str, inputs: list, attrs: dict, n_out: int = 1, exact_out=None) -> list[str] | None:
        """Add the op if segfuse accepts it; PyTorch must agree on whether it is valid."""
        outs = [self.fresh() for _ in range(n_out)]
        entry = {"op": op, "out": outs[0] if n_out == 1 else outs, "inputs": inputs, **attrs}
        args = [self.t[x].value if isinstance(x, str) else x for x in inputs]
        torch_err = None
        try:
            with np.errstate(all="ignore"):
                res = TORCH[op](args, attrs)
        except (RuntimeError, TypeError, ValueError, IndexError) as e:
            torch_err = e
        self.ops.append(entry)
        try:
            Fusion.from_json(self.graph(outs))
            seg_err = None
        except GraphError as e:
            seg_err = e
        if seg_err is not None:
            self.ops.pop()
            if any(op == o and w in str(seg_err) for o, w in DELIBERATE) or symbolic_broadcast(str(seg_err)):
                return None
            assert torch_err is not None, (
                f"segfuse rejects {json.dumps(entry)} on {self.types(inputs)} but PyTorch computes it: {seg_err}")
            return None
        if torch_err is not None:
            # valid types, but PyTorch failed on the data (integer division by zero, ...)
            msg = str(torch_err)
            assert any(w in msg for w in ("ZeroDivision", "negative integer powers", "division by zero")), (
                f"segfuse accepts {json.dumps(entry)} on {self.types(inputs)} but PyTorch rejects it: {msg}")
            self.expect_error = msg
            return outs
        res = list(res) if isinstance(res, tuple) else [res]
        if op == "pow" and not is_float(res[0]) and res[0].dtype != torch.bool and isinstance(args[1], torch.Tensor) \
                and bool((args[1].to(res[0].dtype) < 0).any()):
            # documented difference: PyTorch's CPU kernel computes integer a ** -n (0, or +-1 for
            # a = +-1); segfuse raises, as PyTorch does for a negative number exponent. (The exponent
            # as the result's dtype: a signed 0-dim exponent of an unsigned result wraps, in both.)
            self.expect_error = "integers to negative integer powers"
            return outs
        exact_in = all(self.t[x].exact for x in inputs if isinstance(x, str))
        loose = [self.t[x].loose for x in inputs if isinstance(x, str)]
        for name, v in zip(outs, res):
            ex = exact_in and op not in INEXACT if exact_out is None else exact_out
            mine = DTYPE_NAME[v.dtype] if is_float(v) and not ex else None
            self.t[name] = T(v, ex or not is_float(v), coarsest(loose + [mine]))
        return outs

    def types(self, inputs) -> str:
        return ", ".join(f"{DTYPE_NAME[self.t[x].value.dtype]}{list(self.t[x].value.shape)}" if isinstance(x, str)
                         else repr(x) for x in inputs)

    # -- operand choice ---------------------------------------------------------------------------
    def pick(self, pred=lambda n, t: True, label="operand") -> str | None:
        names = [n for n, t in self.t.items() if pred(n, t)]
        if not names:
            return None
        return self.draw(st.sampled_from(names), label=label)

    def usable(self, op):
        """Operands an op may read: inexact floats only where a last-bit difference cannot matter."""
        return lambda n, t: t.exact or not is_float(t.value) or op not in NEEDS_EXACT

    def literal(self):
        return self.draw(st.sampled_from(LITERALS), label="literal")

    # -- op generators ----------------------------------------------------------------------------
    def gen_unary(self):
        op = self.draw(st.sampled_from(UNARY), label="unary")
        x = self.pick(self.usable(op))
        if x is not None:
            self.try_op(op, [x], {})

    def gen_binary(self):
        op = self.draw(st.sampled_from(BINARY), label="binary")
        x = self.pick(self.usable(op))
        if x is None:
            return
        kind = self.draw(st.sampled_from(["tensor", "tensor", "literal_right", "literal_left"]), label="operands")
        if kind == "tensor":
            xs = self.t[x].value.shape
            y = self.pick(lambda n, t: self.usable(op)(n, t) and _broadcasts(xs, t.value.shape))
            if y is None:
                return
            ins = [x, y] if self.draw(st.booleans()) else [y, x]
        elif kind == "literal_right":
            ins = [x, self.literal()]
        else:
            ins = [self.literal(), x]
        self.try_op(op, ins, {})

    def gen_where(self):
        c = self.pick(lambda n, t: t.value.dtype == torch.bool and self.usable("where")(n, t), label="cond")
        if c is None:
            c0 = self.pick(self.usable("gt"))
            if c0 is None:
                return
            r = self.try_op("gt", [c0, 0], {})
            if not r or self.expect_error:
                return
            c = r[0]
        cs = self.t[c].value.shape
        ins = [c]
        for _ in range(2):
            if self.draw(st.integers(0, 3)) == 0:
                ins.append(self.literal())
            else:
                y = self.pick(lambda n, t: _broadcasts(cs, t.value.shape) and _broadcasts(
                    torch.broadcast_shapes(cs, *[self.t[i].value.shape for i in ins[1:] if isinstance(i, str)]),
                    t.value.shape))
                if y is None:
                    return
                ins.append(y)
        self.try_op("where", ins, {})

    def gen_clamp(self):
        x = self.pick()
        if x is None:
            return
        xs = self.t[x].value.shape
        if self.draw(st.booleans()):
            lo, hi = sorted([self.literal(), self.literal()], key=float)
            ins = [x, lo, hi]
        else:
            lo = self.pick(lambda n, t: _broadcasts(xs, t.value.shape))
            hi = self.pick(lambda n, t: _broadcasts(torch.broadcast_shapes(xs, self.t[lo].value.shape),
                                                    t.value.shape))
            if hi is None:
                return
            ins = [x, lo, hi]
        self.try_op("clamp", ins, {})

    def gen_cast(self):
        dtype = self.draw(st.sampled_from(INPUT_DTYPES), label="cast_to")
        x = self.pick(self.usable("cast"))
        if x is None:
            return
        v = self.t[x].value
        if is_float(v) and dtype not in FLOATS and dtype != "bool":
            # float -> integer is undefined out of range and for NaN/inf (C semantics, as in PyTorch)
            info = torch.iinfo(TORCH_DTYPE[dtype])
            if not bool(torch.isfinite(v).all()) or (v.numel() and (
                    float(v.double().min()) <= info.min - 1 or float(v.double().max()) >= info.max + 1)):
                return
        if dtype == "uint8" and not is_float(v) and v.dtype != torch.bool and bool((v < 0).any()):
            pass  # wraps modulo 256 in both
        self.try_op("cast", [x], {"dtype": dtype})

    def gen_reduction(self):
        op = self.draw(st.sampled_from(["sum", "prod", "amax", "amin", "mean", "argmax", "argmin"]), label="reduce")
        x = self.pick(self.usable(op))
        if x is None:
            return
        v = self.t[x].value
        attrs: dict = {}
        if op in ("argmax", "argmin"):
            if v.dim() and self.draw(st.booleans()):
                attrs["dim"] = self.draw(st.integers(-v.dim(), v.dim() - 1))
        else:
            how = self.draw(st.sampled_from(["all", "int", "list"]))
            if how == "int" and v.dim():
                attrs["dims"] = self.draw(st.integers(-v.dim(), v.dim() - 1))
            elif how == "list" and v.dim():
                ds = self.draw(st.lists(st.integers(0, v.dim() - 1), min_size=1, max_size=v.dim(), unique=True))
                attrs["dims"] = [d - v.dim() if self.draw(st.booleans()) else d for d in ds]
            if op in ("sum", "prod", "mean") and self.draw(st.integers(0, 4)) == 0:
                attrs["dtype"] = self.draw(st.sampled_from(["float32", "float64", "int64"]))
        if self.draw(st.booleans()):
            attrs["keepdim"] = True
        self.try_op(op, [x], attrs)

    def gen_scan(self):
        op = self.draw(st.sampled_from(["cumsum", "cumprod"]))
        x = self.pick()
        if x is None:
            return
        r = max(self.t[x].value.dim(), 1)
        dim = self.draw(st.integers(-r, r - 1))
        if _scan_order_dependent(op, self.t[x].value, dim):
            return
        self.try_op(op, [x], {"dim": dim})

    def gen_sort(self):
        op = self.draw(st.sampled_from(["argsort", "sort", "topk"]))
        x = self.pick(self.usable(op))
        if x is None:
            return
        v = self.t[x].value
        r = max(v.dim(), 1)
        dim = self.draw(st.integers(-r, r - 1))
        if op == "topk":
            size = v.shape[dim] if v.dim() else 1
            attrs = {"k": self.draw(st.integers(0, size)), "dim": dim, "largest": self.draw(st.booleans())}
            self.try_op(op, [x], attrs, n_out=2)
        else:
            attrs = {"dim": dim, "descending": self.draw(st.booleans())}
            if self.draw(st.booleans()):
                attrs["stable"] = True
            self.try_op(op, [x], attrs, n_out=1 if op == "argsort" else 2)

    def index_input(self, shape, high: int, unique_along: int | None = None, low: int = 0) -> str:
        """A new integer input with values in [low, high); with `unique_along`, no value repeats
        along that dim (for scatters without a reduction, whose duplicates PyTorch leaves unspecified)."""
        dtype = self.draw(st.sampled_from(["int64", "int32"]), label="index_dtype")
        shape = tuple(shape)
        if high <= low:  # an empty dim: only an empty index fits
            assert 0 in shape
            a = np.zeros(shape, np.int64)
        elif unique_along is None:
            a = self.rng.integers(low, high, shape)
        else:
            d = unique_along
            full = list(shape)
            full[d] = high
            keys = self.rng.random(full)
            a = np.argsort(keys, axis=d)[tuple(slice(0, s) for s in shape)]
        return self.add_input(dtype, shape, array=np.asarray(a).astype(dtype), prefix="i")

    def gen_gather(self):
        op = self.draw(st.sampled_from(["gather", "take_along_axis", "index_select"]))
        x = self.pick(lambda n, t: t.value.dim() >= 1)
        if x is None:
            return
        v = self.t[x].value
        d = self.draw(st.integers(-v.dim(), v.dim() - 1))
        dn = d % v.dim()
        if v.shape[dn] == 0:
            return
        if op == "index_select":
            shape = [self.draw(st.integers(0, 6))] if self.draw(st.integers(0, 5)) else []
        else:
            shape = [self.draw(st.integers(1, 6)) if k == dn else self.draw(st.integers(1, s)) for k, s in
                     enumerate(v.shape)]
            if op == "take_along_axis":  # broadcasting: other dims of the index may be 1
                shape = [s if k == dn or self.draw(st.booleans()) else 1 for k, s in enumerate(shape)]
                shape = [v.shape[k] if k != dn and s != 1 else s for k, s in enumerate(shape)]
        i = self.index_input(shape, v.shape[dn])
        self.try_op(op, [x, i], {"dim": d})

    def gen_scatter(self):
        x = self.pick(lambda n, t: t.value.dim() >= 1, label="self")
        if x is None:
            return
        v = self.t[x].value
        reduce = self.draw(st.sampled_from(["none", "add", "mul", "amax", "amin"]), label="reduce")
        if reduce == "mul" and v.dtype == torch.bool:
            reduce = "amin"  # segfuse refuses a bool product (PyTorch computes it as logical and)
        r = v.dim()
        d = self.draw(st.integers(-r, r - 1))
        if v.shape[d] == 0:
            return
        dn = d % r
        src_kind = self.draw(st.sampled_from(["new", "existing", "literal"]))
        src = None
        if src_kind == "existing":
            src = self.pick(lambda n, t: t.value.dtype == v.dtype and t.value.dim() == r and n != x)
        if src_kind == "literal":
            src = self.draw(st.sampled_from(
                [True, False] if v.dtype == torch.bool else [-2, 0, 1, 3] if not is_float(v) else [-1.5, 0.5, 2, 0]))
        limit = list(v.shape) if not isinstance(src, str) else [min(a, b) for a, b in zip(v.shape,
                                                                                          self.t[src].value.shape)]
        shape = []
        for k in range(r):
            if k == dn:
                hi = v.shape[k] if reduce == "none" else 8
                if isinstance(src, str):
                    hi = min(hi, self.t[src].value.shape[k])
                shape.append(self.draw(st.integers(0 if hi == 0 else 1, hi)))
            else:
                shape.append(self.draw(st.integers(1, max(limit[k], 1))) if limit[k] else 0)
        if src is None:  # a new src input, at least as large as the index
            src = self.add_input(DTYPE_NAME[v.dtype], [s + self.draw(st.integers(0, 1)) for s in shape])
        i = self.index_input(shape, v.shape[dn], unique_along=dn if reduce == "none" else None)
        attrs: dict = {"dim": d}
        if reduce != "none":
            attrs["reduce"] = reduce
            if self.draw(st.booleans()):
                attrs["include_self"] = False
        # float add/mul with duplicates accumulate in an unspecified order
        exact = None if reduce in ("none", "amax", "amin") else not is_float(v)
        self.try_op("scatter", [x, i, src], attrs, exact_out=exact)

    def gen_index_add(self):
        x = self.pick(lambda n, t: t.value.dim() >= 1 and t.value.dtype != torch.bool, label="self")
        if x is None:
            return
        v = self.t[x].value
        d = self.draw(st.integers(-v.dim(), v.dim() - 1))
        if v.shape[d] == 0:
            return
        n = self.draw(st.integers(0, 7))
        i = self.index_input([n], v.shape[d])
        shape = list(v.shape)
        shape[d] = n
        src = self.add_input(DTYPE_NAME[v.dtype], shape)
        attrs: dict = {"dim": d}
        if self.draw(st.booleans()):
            attrs["alpha"] = self.draw(st.sampled_from([2, -1, 0.5] if is_float(v) else [2, -1]))
        self.try_op("index_add", [x, i, src], attrs, exact_out=None if not is_float(v) else False)

    def gen_index_put(self):
        x = self.pick(lambda n, t: t.value.dim() >= 1, label="self")
        if x is None:
            return
        v = self.t[x].value
        acc = self.draw(st.booleans())
        size = v.shape[0]
        if size == 0:
            return
        if acc:
            ishape = [self.draw(st.integers(0, 6)) for _ in range(self.draw(st.integers(1, 2)))]
            i = self.index_input(ishape, size, low=-size)
        else:
            n = self.draw(st.integers(0, size))
            perm = self.rng.permutation(size)[:n]
            perm = np.where(self.rng.random(n) < 0.3, perm - size, perm)  # negative indices wrap
            dtype = self.draw(st.sampled_from(["int64", "int32"]))
            i = self.add_input(dtype, [n], array=perm.astype(dtype), prefix="i")
        region = list(self.t[i].value.shape) + list(v.shape[1:])
        if self.draw(st.integers(0, 3)) == 0:
            vals = self.draw(st.sampled_from([True] if v.dtype == torch.bool else [2, -1] if not is_float(v)
                                             else [0.5, -2]))
        else:
            k = self.draw(st.integers(0, len(region)))
            vshape = [1 if self.draw(st.integers(0, 3)) == 0 else s for s in region[len(region) - k:]]
            vals = self.add_input(DTYPE_NAME[v.dtype], vshape)
        self.try_op("index_put", [x, i, vals], {"accumulate": acc},
                    exact_out=None if not (acc and is_float(v)) else False)

    # -- indices made by the graph itself (the patterns of issue 15) --------------------------------
    def gen_sort_index(self):
        """sort/argsort/topk along any dim, in the middle of the graph, its indices (and values)
        feeding a gather, take_along_axis, index_select, scatter or index_put."""
        op = self.draw(st.sampled_from(["topk", "sort", "argsort"]), label="index_sort")
        picked = self.pick_along(op)
        if picked is None:
            return
        x, r, d, size = picked
        if op == "topk":
            attrs = {"k": self.draw(st.integers(min(size, 1), size)), "dim": d, "largest": self.draw(st.booleans())}
        else:
            attrs = {"dim": d, "descending": self.draw(st.booleans())}
        outs = self.try_op(op, [x], attrs, n_out=1 if op == "argsort" else 2)
        if outs and not self.expect_error:
            self.use_indices(outs[-1], d % r, size, x, outs[0] if len(outs) == 2 else None)

    def gen_reduce_index(self):
        """Indices from a reduction: argmax/argmin, or an integer sum modulo the dim's size, along
        one dim (kept), feeding the same consumers."""
        op = self.draw(st.sampled_from(["argmax", "argmin", "sum"]), label="index_reduce")
        picked = self.pick_along(op, lambda t: 0 not in t.value.shape and (op != "sum" or not is_float(t.value)))
        if picked is None:
            return
        x, r, d, size = picked
        keep = op == "sum" or self.draw(st.booleans())
        outs = self.try_op(op, [x], {"dim" if op != "sum" else "dims": d, "keepdim": keep})
        if outs and not keep:
            outs = self.try_op("unsqueeze", outs, {"dim": d})
        if outs and op == "sum":
            outs = self.try_op("remainder", [outs[0], size], {})
        if outs and not self.expect_error:
            self.use_indices(outs[0], d % r, size, x, None)

    def pick_along(self, op: str, pred=lambda t: True):
        """(x, rank, dim, size along dim): an operand of rank >= 1 that `op` may read, and a dim."""
        x = self.pick(lambda n, t: t.value.dim() >= 1 and self.usable(op)(n, t) and pred(t), label=op)
        if x is None:
            return None
        r = self.t[x].value.dim()
        d = self.draw(st.integers(-r, r - 1))
        return x, r, d, self.t[x].value.shape[d]

    def use_indices(self, idx: str, dn: int, size: int, x: str, vals: str | None):
        """A consumer of `idx`: values in [0, size), no value repeated along dim dn, the shape of
        `x` but (maybe) along dn; `vals` (when a sort made it) has idx's shape and x's dtype."""
        i = self.t[idx].value
        r = i.dim()
        ishape = tuple(i.shape)
        kind = self.draw(st.sampled_from(["gather", "take_along_axis", "scatter", "scatter", "index_put"]
                                         + (["index_select"] if r == 1 else [])), label="index_use")
        d = dn - r if self.draw(st.booleans()) else dn

        def covers(t, bcast=False):  # a tensor that idx may index along dn (gather, scatter; or broadcast)
            s = t.value.shape
            return t.value.dim() == r and s[dn] >= size and size > 0 and all(
                (s[k] == ishape[k] or 1 in (s[k], ishape[k])) if bcast else s[k] >= ishape[k]
                for k in range(r) if k != dn)

        if kind in ("gather", "take_along_axis"):
            y = self.pick(lambda n, t: covers(t, kind == "take_along_axis"), label="gathered")
            if y is not None:
                self.try_op(kind, [y, idx], {"dim": d})
        elif kind == "index_select":
            y = self.pick(lambda n, t: t.value.dim() >= 1 and size in t.value.shape, label="selected")
            if y is not None:
                dims = [k for k, s in enumerate(self.t[y].value.shape) if s == size]
                self.try_op("index_select", [y, idx], {"dim": self.draw(st.sampled_from(dims))})
        elif kind == "scatter":
            if size == 0:
                return
            src = vals if vals is not None and self.draw(st.booleans()) else None
            how = self.draw(st.sampled_from(["input", "input", "existing"]), label="scatter_self")
            dtype = self.t[src].value.dtype if src is not None else None
            target = None
            if how == "existing":
                target = self.pick(lambda n, t: covers(t) and (dtype is None or t.value.dtype == dtype), label="self")
            if target is None:  # a graph input: its scatter needs a private copy (no alias_of)
                shape = list(self.t[x].value.shape)
                target = self.add_input(DTYPE_NAME[dtype] if dtype is not None else
                                        self.draw(st.sampled_from(INPUT_DTYPES)), shape)
            tv = self.t[target].value
            if src is None:
                src = self.draw(st.sampled_from([True] if tv.dtype == torch.bool else [2, -1] if not is_float(tv)
                                                else [0.5, -2.0])) if self.draw(st.integers(0, 2)) == 0 else \
                    self.add_input(DTYPE_NAME[tv.dtype], list(ishape))
            reduce = self.draw(st.sampled_from(["none", "add", "amax", "amin"]), label="reduce")
            if reduce == "add" and tv.dtype == torch.bool:
                reduce = "amax"
            attrs = {"dim": d} if reduce == "none" else {"dim": d, "reduce": reduce}
            # no destination repeats (idx is unique along dn): every reduce is one exact operation
            self.try_op("scatter", [target, idx, src], attrs)
        else:  # index_put along dim 0: idx's rows repeat values unless it is 1-D
            if size == 0:
                return
            tail = [self.draw(st.sampled_from([1, 2, 3])) for _ in range(self.draw(st.integers(0, 1)))]
            target = self.add_input(self.draw(st.sampled_from(INPUT_DTYPES)), [size] + tail)
            tv = self.t[target].value
            acc = r > 1 or self.draw(st.booleans())
            if acc and tv.dtype == torch.bool:
                acc = False if r == 1 else None
            if acc is None:
                return
            region = list(ishape) + tail
            if vals is not None and not tail and self.t[vals].value.dtype == tv.dtype and self.draw(st.booleans()):
                put = vals
            elif self.draw(st.integers(0, 2)) == 0:
                put = self.draw(st.sampled_from([2, -1] if not is_float(tv) else [0.5, -2.0]))
            else:
                put = self.add_input(DTYPE_NAME[tv.dtype], region[len(region) - self.draw(st.integers(0, len(region))):])
            self.try_op("index_put", [target, idx, put], {"accumulate": acc},
                        exact_out=None if not (acc and is_float(tv)) else False)

    def gen_shape(self):
        op = self.draw(st.sampled_from(["reshape", "permute", "unsqueeze", "squeeze", "expand", "slice", "pad",
                                        "cat", "full_like", "iota"]), label="shape_op")
        if op == "iota":
            n = self.draw(st.integers(0, 6))
            attrs = {"length": n}
            if self.draw(st.booleans()):
                attrs.update(start=self.draw(st.sampled_from([0, 2, -3])), step=self.draw(st.sampled_from([1, 3, -1])))
            if self.draw(st.booleans()):
                attrs["dtype"] = self.draw(st.sampled_from(["int32", "int64", "float32"]))
            self.try_op("iota", [], attrs)
            return
        x = self.pick(label="x")
        if x is None:
            return
        v = self.t[x].value
        r = v.dim()
        attrs: dict = {}
        ins = [x]
        if op == "reshape":
            n = v.numel()
            if self.draw(st.booleans()):
                attrs["shape"] = [-1]
            else:
                f = [k for k in range(1, n + 1) if n % k == 0] or [1]
                a = self.draw(st.sampled_from(f))
                attrs["shape"] = [a, -1] if self.draw(st.booleans()) else [a, n // a] if n else [0, a]
        elif op == "permute":
            attrs["dims"] = list(self.draw(st.permutations(range(r))))
        elif op == "unsqueeze":
            attrs["dim"] = self.draw(st.integers(-r - 1, r))
        elif op == "squeeze":
            if r and self.draw(st.booleans()):
                attrs["dims"] = self.draw(st.lists(st.integers(-r, r - 1), min_size=1, max_size=r, unique_by=lambda d: d % r))
        elif op == "expand":
            attrs["shape"] = [self.draw(st.sampled_from([1, 2, 3])) for _ in range(self.draw(st.integers(0, 1)))] + [
                self.draw(st.sampled_from([2, 3])) if s == 1 else -1 if self.draw(st.booleans()) else s for s in v.shape]
        elif op == "slice":
            if not r:
                return
            attrs = {"dim": self.draw(st.integers(-r, r - 1)), "start": self.draw(st.sampled_from([None, 0, 1, -2])),
                     "end": self.draw(st.sampled_from([None, 2, -1, 10])), "step": self.draw(st.sampled_from([1, 2]))}
            attrs = {k: w for k, w in attrs.items() if w is not None}
        elif op == "pad":
            k = self.draw(st.integers(0, r))
            attrs["pad"] = [self.draw(st.integers(-1, 2)) for _ in range(2 * k)]
            if self.draw(st.booleans()):
                attrs["value"] = self.literal()
        elif op == "cat":
            if not r:
                return
            d = self.draw(st.integers(-r, r - 1))
            others = [n for n, t in self.t.items() if t.value.dim() == r and all(
                a == b for k, (a, b) in enumerate(zip(t.value.shape, v.shape)) if k != d % r)]
            ins = [x] + self.draw(st.lists(st.sampled_from(others), max_size=2))
            attrs["dim"] = d
        elif op == "full_like":
            attrs["value"] = self.literal()
            if self.draw(st.booleans()):
                attrs["dtype"] = self.draw(st.sampled_from(INPUT_DTYPES))
        self.try_op(op, ins, attrs, exact_out=(None if op != "full_like" else True))

    GENS = {
        "pointwise": ("gen_unary", "gen_binary", "gen_binary", "gen_where", "gen_clamp", "gen_cast"),
        "reduction": ("gen_reduction", "gen_scan", "gen_sort"),
        "gather": ("gen_gather",),
        "shape": ("gen_shape", "gen_shape"),
        "scatter": ("gen_scatter", "gen_scatter", "gen_index_add", "gen_index_put"),
        "indices": ("gen_sort_index", "gen_sort_index", "gen_reduce_index"),
    }

    def build(self) -> dict:
        for _ in range(self.draw(st.integers(1, 3), label="n_inputs")):
            self.new_base_input()
        gens = [g for k in self.kinds for g in self.GENS[k]]
        steps = self.draw(st.integers(1, self.max_ops), label="n_ops")
        for _ in range(steps):
            if self.draw(st.integers(0, 5)) == 0:
                self.new_base_input()
            getattr(self, self.draw(st.sampled_from(gens), label="gen"))()
            if self.expect_error:
                break
        if not self.ops:
            x = self.pick()
            self.try_op("neg" if self.t[x].value.dtype != torch.bool else "logical_not", [x], {})
        made = [n for o in self.ops for n in ([o["out"]] if isinstance(o["out"], str) else o["out"])]
        outputs: list = [made[-1]]
        for n in made[:-1]:
            if self.draw(st.integers(0, 3)) == 0:
                outputs.append(n)
        # a scatter into a graph input may update that input in place (alias_of)
        input_names = {i["name"] for i in self.inputs}
        aliased = set()
        for k, n in enumerate(outputs):
            o = next(o for o in self.ops if o["out"] == n or n in o["out"])
            self_ = o["inputs"][0] if o["inputs"] else None
            if (o["op"] in ("scatter", "index_add", "index_put") and self_ in input_names and self_ not in aliased
                    and self_ not in outputs and self.draw(st.booleans(), label="alias")):
                outputs[k] = {"name": n, "alias_of": self_}
                aliased.add(self_)
        return self.graph(outputs)


def _scan_order_dependent(op: str, v: torch.Tensor, dim: int) -> bool:
    """A float scan some partial result of which may overflow its accumulator (float32, float64 for
    float64), or for cumprod underflow it: from there on the result depends on the order in which
    ranges are combined (the GPU's block scan against torch's sequential loop; both right by IEEE
    rules), and the difference is no last-bit one (inf against a finite number: issue 15's bfloat16
    cumprod of 1024-element rows). Such scans are not drawn; tests/test_reduced_precision.py covers
    scans near overflow with data whose result is the same in every order."""
    if not v.dtype.is_floating_point or v.dim() == 0 or v.numel() == 0:
        return False
    bits = 1000 if v.dtype == torch.float64 else 120  # log2 of the accumulator's range, less a margin
    x = v.double()
    x = torch.where(torch.isfinite(x), x, torch.zeros_like(x))  # inf and NaN propagate in any order
    if op == "cumsum":  # every partial sum is at most the row's sum of magnitudes
        return bool((x.abs().sum(dim) >= 2.0 ** bits).any())
    # every partial product is a range of the row: 2 ** (L[j] - L[m]) for the prefix sums L of log2|x|
    lg = torch.where(x != 0, x.abs().log2(), torch.zeros_like(x)).cumsum(dim)
    span = torch.maximum(lg.amax(dim), torch.zeros(())) - torch.minimum(lg.amin(dim), torch.zeros(()))
    return bool((span >= bits).any())


def _broadcasts(a, b) -> bool:
    try:
        torch.broadcast_shapes(tuple(a), tuple(b))
        return True
    except RuntimeError:
        return False


# ---- comparing --------------------------------------------------------------------------------
TOL = {"float16": (2e-3, 1e-3), "bfloat16": (1.6e-2, 1e-2), "float32": (2e-5, 1e-5), "float64": (1e-9, 1e-10)}


def coarsest(dtypes) -> str | None:
    """The float dtype with the loosest tolerance (an error made in float32 stays float32-sized
    when the value is later widened to float64)."""
    ds = [d for d in dtypes if d]
    return max(ds, key=lambda d: TOL[d][0]) if ds else None


def assert_agrees(name: str, got, ref: T):
    got = np.asarray(got)
    want = ref.value
    assert DTYPE_NAME.get(want.dtype) == str(got.dtype), f"{name}: dtype {got.dtype}, PyTorch {want.dtype}"
    assert tuple(got.shape) == tuple(want.shape), f"{name}: shape {got.shape}, PyTorch {tuple(want.shape)}"
    g = to_torch(got)
    if not is_float(want) or ref.exact:
        same = torch.equal(g, want) or (is_float(want) and bool(
            ((g == want) | (torch.isnan(g) & torch.isnan(want))).all()))
        assert same, f"{name}: differs from PyTorch (exact)\n segfuse {g}\n torch   {want}"
    else:
        rtol, atol = TOL[coarsest([DTYPE_NAME[want.dtype], ref.loose])]
        scale = float(want.double().abs().nan_to_num(posinf=0, neginf=0).max()) if want.numel() else 0.0
        torch.testing.assert_close(g, want, rtol=rtol, atol=atol * max(1.0, scale), equal_nan=True, msg=lambda m:
                                   f"{name}: {m}\n segfuse {g}\n torch   {want}")


def check(gen: Gen, graph: dict):
    note(json.dumps(graph))
    fusion = Fusion.from_json(graph)
    outs = [o if isinstance(o, str) else o["name"] for o in graph["outputs"]]

    def fresh_inputs():
        return {k: v.copy() for k, v in gen.arrays.items()}

    if gen.expect_error:
        with pytest.raises(RunError):
            run_graph(fusion, fresh_inputs())
        with pytest.raises(RunError):
            Engine().run(Fusion.from_json(graph), fresh_inputs())
        return
    alias = {o["alias_of"]: o["name"] for o in graph["outputs"] if isinstance(o, dict)}

    def check_run(run):
        inputs = fresh_inputs()
        res = run(inputs)
        assert list(res) == outs
        for k in outs:
            assert_agrees(k, res[k], gen.t[k])
        for k, v in inputs.items():
            if k in alias:  # updated in place with the output's value
                assert_agrees(f"{k} (updated in place by {alias[k]})", v, gen.t[alias[k]])
            else:  # never written
                np.testing.assert_array_equal(v, gen.arrays[k])

    check_run(lambda inputs: run_graph(fusion, inputs))
    check_run(lambda inputs: Engine().run(Fusion.from_json(graph), inputs).outputs)


def _seed_given() -> bool:
    """`--hypothesis-seed=N` given: the tests draw from that seed (fresh graphs) instead of their
    fixed derandomized one (a derandomized test ignores the option, Hypothesis's rule)."""
    from hypothesis import core

    return getattr(core, "global_force_seed", None) is not None


# The CI tests' configurations, which the GPU and emulator runs repeat: name -> (max ops, kinds, large sizes)
CONFIGS = {
    "pointwise": (8, ("pointwise",), False),
    "reduction": (6, ("pointwise", "reduction"), False),
    "scatter_gather": (6, ("pointwise", "gather", "scatter"), False),
    "shape": (8, ("pointwise", "shape"), False),
    "graph_made_indices": (6, ("pointwise", "indices", "indices", "gather", "scatter"), False),
    "large": (5, ("pointwise", "reduction", "indices", "indices", "gather", "scatter"), True),
    "mixed": (10, ("pointwise", "reduction", "shape", "gather", "scatter", "indices"), False),
}

COMMON = dict(deadline=None, derandomize=not _seed_given(), database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much])
