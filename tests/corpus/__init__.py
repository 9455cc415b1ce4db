"""A corpus of fusion graphs that exercises every op, dtype and segment kind of the codegen.

Used by the offline compile test (tests/test_codegen_compile.py), the GPU tests and the
benchmarks. Each case is (name, graph dict, input maker); graphs that an op's dtype rules reject
are skipped when the corpus is built.
"""

from __future__ import annotations

import numpy as np
from segfuse.compiler.dtypes import DType
from segfuse.compiler.errors import GraphError
from segfuse.compiler.ir import Fusion
from segfuse.compiler.ops.registry import REGISTRY, OpKind
from workloads import moe_graphs  # noqa: F401  (shared with the benchmarks)

from .ops import all_op_cases
from .util import _graph, rand  # noqa: F401  (also imported from here)

ALL_DTYPES = list(DType)
_UNARY = [n for n, o in REGISTRY.items() if o.kind is OpKind.pointwise and len(o.operands) == 1 and n != "cast"]
_BINARY = [n for n, o in REGISTRY.items() if o.kind is OpKind.pointwise and len(o.operands) == 2]


def _valid_ops(inputs, candidates):
    """Keep the ops that validate alone (dtype rules differ per op)."""
    keep = []
    for op in candidates:
        try:
            Fusion.from_json(_graph("probe", inputs, [op], [op["out"]]))
            keep.append(op)
        except GraphError:
            pass
    return keep


def pointwise_cases(shape=(6, 37)):
    out = []
    for dt in ALL_DTYPES:
        ins = [{"name": "x", "dtype": dt.value, "shape": list(shape)},
               {"name": "y", "dtype": dt.value, "shape": list(shape)},
               {"name": "z", "dtype": dt.value, "shape": [shape[-1]]}]
        un = _valid_ops(ins, [{"op": n, "out": f"u_{n}", "inputs": ["x"]} for n in _UNARY])
        bi = _valid_ops(ins, [{"op": n, "out": f"b_{n}", "inputs": ["x", "y"]} for n in _BINARY])
        bz = _valid_ops(ins, [{"op": n, "out": f"z_{n}", "inputs": ["x", "z"]} for n in ("add", "mul", "maximum", "lt")])
        lit = _valid_ops(ins, [{"op": "add", "out": "l_add", "inputs": ["x", 2]},
                               {"op": "mul", "out": "l_mulf", "inputs": ["x", 0.5]},
                               {"op": "where", "out": "l_where", "inputs": ["c", "x", 1]}] if False else
                         [{"op": "add", "out": "l_add", "inputs": ["x", 2]},
                          {"op": "mul", "out": "l_mulf", "inputs": ["x", 0.5]}])
        casts = [{"op": "cast", "out": f"c_{d.value}", "inputs": ["x"], "dtype": d.value} for d in ALL_DTYPES]
        ops = un + bi + bz + lit + casts
        ops.append({"op": "ne", "out": "cond", "inputs": ["x", "y"]})
        ops.append({"op": "where", "out": "w", "inputs": ["cond", "x", "y"]})
        outs = [o["out"] for o in ops]
        g = _graph(f"pw_{dt.value}", ins, ops, outs)

        def make(rng, dt=dt):
            pos = {"pow", "left_shift", "right_shift"}
            return {"x": rand(rng, shape, dt), "y": rand(rng, shape, dt, lo=0 if pos else -4, nonzero=True),
                    "z": rand(rng, (shape[-1],), dt, nonzero=True)}

        out.append((g["name"], g, make))
    return out


def ternary_cases(shape=(6, 37)):
    """clamp and lerp (with where, the pointwise ops of three operands), over tensors, a broadcast
    row and literals; dtypes an op's rules reject are left out."""
    out = []
    for dt in ALL_DTYPES:
        ins = [{"name": "x", "dtype": dt.value, "shape": list(shape)},
               {"name": "lo", "dtype": dt.value, "shape": list(shape)},
               {"name": "w", "dtype": dt.value, "shape": [shape[-1]]}]
        ops = _valid_ops(ins, [{"op": "clamp", "out": "c", "inputs": ["x", "lo", "w"]},
                               {"op": "clamp", "out": "cl", "inputs": ["x", -1, 2]},
                               {"op": "lerp", "out": "l", "inputs": ["x", "lo", "w"]},
                               {"op": "lerp", "out": "ls", "inputs": ["x", "lo", 0.25]}])
        if not ops:
            continue
        g = _graph(f"pw_ternary_{dt.value}", ins, ops, [o["out"] for o in ops])
        out.append((g["name"], g, lambda rng, dt=dt: {"x": rand(rng, shape, dt), "lo": rand(rng, shape, dt),
                                                      "w": rand(rng, (shape[-1],), dt)}))
    return out


def movement_cases():
    out = []
    for dt in (DType.float32, DType.int64, DType.float16, DType.bool, DType.bfloat16, DType.int8):
        ins = [{"name": "x", "dtype": dt.value, "shape": [4, 6, 5]},
               {"name": "v", "dtype": dt.value, "shape": [5]}]
        ops = [
            {"op": "reshape", "out": "r", "inputs": ["x"], "shape": [24, 5]},
            {"op": "permute", "out": "p", "inputs": ["x"], "dims": [2, 0, 1]},
            {"op": "slice", "out": "s", "inputs": ["x"], "dim": 1, "start": 1, "end": 6, "step": 2},
            {"op": "pad", "out": "pd", "inputs": ["x"], "pad": [1, 2, 0, 1], "value": 1},
            {"op": "cat", "out": "ct", "inputs": ["x", "x"], "dim": 1},
            {"op": "expand", "out": "e", "inputs": ["v"], "shape": [3, 5]},
            {"op": "broadcast_in_dim", "out": "bd", "inputs": ["v"], "shape": [2, 5, 3], "broadcast_dims": [1]},
            {"op": "unsqueeze", "out": "us", "inputs": ["v"], "dim": 0},
            {"op": "squeeze", "out": "sq", "inputs": ["us"], "dims": 0},
            {"op": "full", "out": "f", "inputs": [], "shape": [3, 2], "value": 1, "dtype": dt.value},
            {"op": "full_like", "out": "fl", "inputs": ["x"], "value": 0},
            {"op": "iota", "out": "io", "inputs": [], "length": 7, "start": 2, "step": 3},
            {"op": "iota", "out": "iof", "inputs": [], "length": 7, "start": 0.5, "step": 0.25, "dtype": "float32"},
            {"op": "permute", "out": "pp", "inputs": ["p"], "dims": [1, 2, 0]},
            {"op": "reshape", "out": "rp", "inputs": ["p"], "shape": [-1]},
        ]
        g = _graph(f"mv_{dt.value}", ins, ops, [o["out"] for o in ops])
        out.append((g["name"], g, lambda rng, dt=dt: {"x": rand(rng, (4, 6, 5), dt), "v": rand(rng, (5,), dt)}))
    return out


def reduction_cases():
    out = []
    for dt in ALL_DTYPES:
        ins = [{"name": "x", "dtype": dt.value, "shape": [5, 300]}, {"name": "w", "dtype": dt.value, "shape": [3, 7, 9]}]
        cands = []
        for n in ("sum", "prod", "amax", "amin", "mean"):
            cands += [{"op": n, "out": f"{n}_r", "inputs": ["x"], "dims": 1},
                      {"op": n, "out": f"{n}_c", "inputs": ["x"], "dims": 0},
                      {"op": n, "out": f"{n}_all", "inputs": ["x"]},
                      {"op": n, "out": f"{n}_w", "inputs": ["w"], "dims": [0, 2], "keepdim": True}]
        for n in ("argmax", "argmin"):
            cands += [{"op": n, "out": f"{n}_r", "inputs": ["x"], "dim": 1},
                      {"op": n, "out": f"{n}_all", "inputs": ["x"]}]
        ops = _valid_ops(ins, cands)
        g = _graph(f"red_{dt.value}", ins, ops, [o["out"] for o in ops])
        out.append((g["name"], g, lambda rng, dt=dt: {"x": rand(rng, (5, 300), dt, -2, 3),
                                                     "w": rand(rng, (3, 7, 9), dt, -2, 3)}))
    return out


def scan_sort_cases():
    out = []
    for dt in ALL_DTYPES:
        ins = [{"name": "x", "dtype": dt.value, "shape": [3, 200]}]
        cands = [{"op": "cumsum", "out": "cs", "inputs": ["x"], "dim": 1},
                 {"op": "cumsum", "out": "cs0", "inputs": ["x"], "dim": 0},
                 {"op": "cumprod", "out": "cp", "inputs": ["x"], "dim": 1},
                 {"op": "argsort", "out": "as", "inputs": ["x"], "dim": 1, "stable": True},
                 {"op": "argsort", "out": "asd", "inputs": ["x"], "dim": 1, "descending": True, "stable": True},
                 {"op": "sort", "out": ["sv", "si"], "inputs": ["x"], "dim": 0},
                 {"op": "topk", "out": ["tv", "ti"], "inputs": ["x"], "k": 5, "dim": 1},
                 {"op": "topk", "out": ["bv", "bi"], "inputs": ["x"], "k": 3, "dim": 1, "largest": False}]
        ops = _valid_ops(ins, cands)
        outs = [n for o in ops for n in ([o["out"]] if isinstance(o["out"], str) else o["out"])]
        g = _graph(f"scan_sort_{dt.value}", ins, ops, outs)
        out.append((g["name"], g, lambda rng, dt=dt: {"x": rand(rng, (3, 200), dt, -3, 4)}))
    return out


def radix_cases():
    """Rank-1 integer rows too long for the shared-memory bitonic sort: in one block they take the
    block radix sort (codegen/radix.py). Full-range keys (negative, both extremes) with duplicates."""
    out = []
    for dt, n in ((DType.int8, 20000), (DType.uint8, 24577), (DType.int16, 30000), (DType.int32, 32768),
                  (DType.int64, 40000), (DType.bool, 21000)):
        ins = [{"name": "x", "dtype": dt.value, "shape": [n]}]
        cands = [{"op": "argsort", "out": "as", "inputs": ["x"], "dim": 0, "stable": True},
                 {"op": "argsort", "out": "asd", "inputs": ["x"], "dim": 0, "descending": True, "stable": True},
                 {"op": "sort", "out": ["sv", "si"], "inputs": ["x"], "dim": 0, "stable": True},
                 {"op": "sort", "out": ["dv", "di"], "inputs": ["x"], "dim": 0, "descending": True, "stable": True},
                 {"op": "topk", "out": ["tv", "ti"], "inputs": ["x"], "k": 100, "dim": 0},
                 {"op": "topk", "out": ["bv", "bi"], "inputs": ["x"], "k": 37, "dim": 0, "largest": False}]
        outs = [o for op in cands for o in ([op["out"]] if isinstance(op["out"], str) else op["out"])]
        g = _graph(f"radix_{dt.value}", ins, cands, outs)
        try:  # (not _valid_ops: its probe names a multi-output op's outputs as one list)
            Fusion.from_json(g)
        except GraphError:
            continue

        def make(rng, dt=dt, n=n):
            if dt is DType.bool:
                return {"x": rng.random(n) < 0.5}
            info = np.iinfo(dt.np)
            a = rng.integers(info.min, info.max, size=n, dtype=dt.np, endpoint=True)
            a[rng.random(n) < 0.3] = a[1]  # many duplicates
            a[:40], a[40:80] = info.min, info.max
            return {"x": a}

        out.append((g["name"], g, make))
    return out


def gather_cases():
    out = []
    for it in (DType.int64, DType.int32):
        ins = [{"name": "x", "dtype": "float32", "shape": [6, 8]},
               {"name": "i", "dtype": it.value, "shape": [6, 3]},
               {"name": "j", "dtype": it.value, "shape": [4]}]
        ops = [{"op": "gather", "out": "g", "inputs": ["x", "i"], "dim": 1},
               {"op": "take_along_axis", "out": "ta", "inputs": ["x", "i"], "dim": 1},
               {"op": "index_select", "out": "isel", "inputs": ["x", "j"], "dim": 0},
               {"op": "mul", "out": "gm", "inputs": ["g", 2.0]}]
        g = _graph(f"gather_{it.value}", ins, ops, [o["out"] for o in ops])
        out.append((g["name"], g, lambda rng, it=it: {
            "x": rand(rng, (6, 8), DType.float32), "i": rng.integers(0, 8, (6, 3)).astype(it.np),
            "j": rng.integers(0, 6, (4,)).astype(it.np)}))
    return out


def scatter_cases(n_src=64, m=10):
    out = []
    for dt in ALL_DTYPES:
        for reduce in ("none", "add", "mul", "amax", "amin"):
            for include_self in (True, False):
                if reduce == "none" and not include_self:
                    continue
                ins = [{"name": "s", "dtype": dt.value, "shape": [m]},
                       {"name": "i", "dtype": "int64", "shape": [n_src]},
                       {"name": "v", "dtype": dt.value, "shape": [n_src]}]
                ops = [{"op": "scatter", "out": "o", "inputs": ["s", "i", "v"], "dim": 0, "reduce": reduce,
                        "include_self": include_self}]
                try:
                    Fusion.from_json(_graph("p", ins, ops, ["o"]))
                except GraphError:
                    continue
                src = "v"
                if reduce == "none":  # duplicates make plain stores nondeterministic: use a permutation
                    ins[1]["shape"] = [m]
                    ins[2]["shape"] = [m]

                def make(rng, dt=dt, reduce=reduce):
                    k = m if reduce == "none" else n_src
                    idx = rng.permutation(m) if reduce == "none" else rng.integers(0, m, k)
                    vv = rand(rng, (k,), dt, -2, 3)
                    if reduce == "mul" and dt.is_float:
                        vv = (np.sign(vv.astype(np.float64)) * 1.0 + 0.0).astype(dt.np)
                    return {"s": rand(rng, (m,), dt, -2, 3), "i": idx.astype(np.int64), "v": vv}

                g = _graph(f"sc_{dt.value}_{reduce}_{int(include_self)}", ins, ops, ["o"])
                _ = src
                out.append((g["name"], g, make))
    # 2-D scatter along dim 1 with a scalar src; index_add; index_put
    for dt in (DType.float32, DType.int64, DType.float16, DType.int32):
        ins = [{"name": "s", "dtype": dt.value, "shape": [4, 9]},
               {"name": "i", "dtype": "int32", "shape": [4, 5]},
               {"name": "r", "dtype": "int64", "shape": [6]},
               {"name": "rn", "dtype": "int64", "shape": [6]},
               {"name": "v", "dtype": dt.value, "shape": [6, 9]}]
        ops = [{"op": "scatter", "out": "o2", "inputs": ["s", "i", 1], "dim": 1, "reduce": "add"},
               {"op": "index_add", "out": "ia", "inputs": ["s", "r", "v"], "dim": 0, "alpha": 2},
               {"op": "index_put", "out": "ip", "inputs": ["s", "rn", "v"], "accumulate": True},
               {"op": "index_put", "out": "ip0", "inputs": ["s", "rn", 3], "accumulate": True}]
        g = _graph(f"sc2_{dt.value}", ins, ops, ["o2", "ia", "ip", "ip0"])
        out.append((g["name"], g, lambda rng, dt=dt: {
            "s": rand(rng, (4, 9), dt), "i": rng.integers(0, 9, (4, 5)).astype(np.int32),
            "r": rng.integers(0, 4, (6,)).astype(np.int64), "rn": rng.integers(-4, 4, (6,)).astype(np.int64),
            "v": rand(rng, (6, 9), dt)}))
    return out


def sort_consumers_graph(idt="int64", K=8) -> dict:
    """An argsort of ids [T, K] with every consumer kind the sort epilogue fuses (compiler/codegen/
    sort_epilogue.py): `order` itself, pointwise position outputs (one narrowing cast), a scatter
    of a pointwise of iota into full_like, and a literal scattered into a longer target (which
    needs the fused kernel's phase-0 init)."""
    return _graph("sort_consumers", [{"name": "ids", "dtype": idt, "shape": ["T", K]}], [
        {"op": "reshape", "out": "flat", "inputs": ["ids"], "shape": [-1]},
        {"op": "argsort", "out": "order", "inputs": ["flat"], "dim": 0, "descending": False, "stable": True},
        {"op": "remainder", "out": "slot", "inputs": ["order", K]},
        {"op": "cast", "out": "tok32", "inputs": ["order"], "dtype": "int32"},
        {"op": "iota", "out": "ar", "inputs": [], "length": f"T*{K}"},
        {"op": "mul", "out": "ar2", "inputs": ["ar", 2]},
        {"op": "add", "out": "ar3", "inputs": ["ar2", 1]},
        {"op": "full_like", "out": "z", "inputs": ["flat"], "value": 0, "dtype": "int64"},
        {"op": "scatter", "out": "inv", "inputs": ["z", "order", "ar3"], "dim": 0},
        {"op": "full", "out": "big", "inputs": [], "shape": [f"T*{K}+5"], "value": -1, "dtype": "int32"},
        {"op": "scatter", "out": "mark", "inputs": ["big", "order", 7], "dim": 0}],
        ["order", "slot", "tok32", "inv", "mark"])


def all_cases():
    cases = pointwise_cases() + ternary_cases() + movement_cases() + reduction_cases() + scan_sort_cases() + radix_cases() + \
        gather_cases() + scatter_cases()
    cases += all_op_cases()  # (the ops of issue 15, last: the keys of the cases above stay)
    for idt in ("int64", "int32"):
        for g, mk in moe_graphs(idt=idt):
            for T in (1, 128):
                cases.append((f"{g['name']}_{idt}_T{T}", g, mk(T)))
    return cases


def case_inputs(case, seed=0):
    name, g, make = case
    return make(np.random.default_rng(seed))


def modules_for(fusion, inputs: dict, mode: str = "auto", sm_count: int = 132):
    """Generated modules (or Unsupported reasons) for a fusion's segments under a planning mode:
    'grid' (one segment per anchor), 'block' (one single-block segment) or 'auto'."""
    from segfuse.compiler.codegen.lazy import Unsupported
    from segfuse.compiler.codegen.segment import generate
    from segfuse.compiler.segmenter.reference import simple_plan

    shapes = {k: np.shape(v) for k, v in inputs.items()}
    types = fusion.bind(shapes).types
    small = {"grid": -1, "block": 1 << 62, "auto": 8192}[mode]
    plan = simple_plan(fusion, types, small=small)
    out = []
    for seg in plan.segments:
        try:
            out.append(generate(fusion, seg, types, sm_count=sm_count))
        except Unsupported as e:
            out.append(e)
    return out


def scatter_graph(dt="float32", idt="int64", reduce="add", include_self=True, alias=False, rank=1) -> dict:
    """o = scatter(dst, i, v) along the last dim (rank 1 or 2), optionally in place (alias_of dst)."""
    shp_t, shp_i = (["M"], ["N"]) if rank == 1 else (["R", "M"], ["R", "N"])
    op = {"op": "scatter", "out": "o", "inputs": ["dst", "i", "v"], "dim": rank - 1, "reduce": reduce}
    if not include_self:
        op["include_self"] = False
    return {"format": "segfuse.fusion/1", "name": "sc",
            "inputs": [{"name": "dst", "dtype": dt, "shape": shp_t}, {"name": "i", "dtype": idt, "shape": shp_i},
                       {"name": "v", "dtype": dt, "shape": shp_i}],
            "ops": [op], "outputs": [{"name": "o", "alias_of": "dst"}] if alias else ["o"]}
