"""Creation, shape, reduction, scan, sorting and indexing ops against PyTorch on the CPU.

Segfuse's documented differences: index tensors may be any integer dtype (the oracle gets
them as int64), sorting is always stable (the oracle uses stable=True).
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import torch_oracle
from helpers.graphs import one_op
from helpers.torch_oracle import to_numpy, to_torch
from segfuse.compiler import BindError, Fusion, GraphError, RunError, run_graph

DTYPES = ["bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"]
FLOATS = ["float16", "bfloat16", "float32", "float64"]
INTS = ["uint8", "int8", "int16", "int32", "int64"]
INDEX_DTYPES = ["int64", "int32", "int16", "uint8"]
TORCH = {d: getattr(torch, d) for d in DTYPES}
FROM_TORCH = {v: k for k, v in TORCH.items()}


# ---- helpers ------------------------------------------------------------------------------
def gen_for(*parts) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(repr(parts).encode()))


def rand(dtype: str, shape, gen: torch.Generator, lo: int = -9, hi: int = 9) -> torch.Tensor:
    shape = tuple(shape)
    if dtype == "bool":
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype in INTS:
        return torch.randint(max(lo, 0) if dtype == "uint8" else lo, hi + 1, shape, generator=gen).to(TORCH[dtype])
    return (torch.randn(shape, generator=gen, dtype=torch.float64) * 3).to(TORCH[dtype])


def tol(dtype: torch.dtype) -> dict:
    return {torch.float16: dict(rtol=2e-3, atol=2e-3), torch.bfloat16: dict(rtol=1.6e-2, atol=1e-2),
            torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=1e-10, atol=1e-10)}.get(
        dtype, dict(rtol=0, atol=0))


def check_same(actual: np.ndarray, expected: torch.Tensor, what: str = "") -> None:
    torch_oracle.check_same(actual, expected, what, tol(expected.dtype))


def run_op(op, operands, n_out=1, shapes=None, **attrs):
    """Run a one-op graph over torch tensors / literals; `shapes` overrides declared shapes
    (symbolic sizes). Returns the list of outputs as numpy arrays."""
    inputs, names, arrays = [], [], {}
    for k, x in enumerate(operands):
        if isinstance(x, torch.Tensor):
            name = f"x{k}"
            shape = shapes[k] if shapes and shapes.get(k) is not None else list(x.shape)
            inputs.append((name, FROM_TORCH[x.dtype], shape))
            arrays[name] = to_numpy(x)
            names.append(name)
        else:
            names.append(x)
    g = one_op(op, inputs, names, n_out=n_out, **attrs)
    before = {k: v.copy() for k, v in arrays.items()}
    res = run_graph(Fusion.from_json(g), arrays)
    for k, v in arrays.items():  # inputs are never written (no output is declared alias_of)
        assert v.tobytes() == before[k].tobytes(), f"{op} changed its input {k}"
    return [res[o] for o in g["outputs"]]


def outcome(fn):
    try:
        return fn(), None
    except (RuntimeError, TypeError, ValueError, IndexError) as e:
        return None, e


def compare(op, operands, oracle, what="", n_out=1, shapes=None, **attrs):
    """GraphError iff torch raises; else every result equals torch's (dtype, shape, values)."""
    expected, err = outcome(oracle)
    if err is not None:
        with pytest.raises(GraphError):
            run_op(op, operands, n_out, shapes, **attrs)
        return None
    outs = run_op(op, operands, n_out, shapes, **attrs)
    exp = expected if isinstance(expected, (tuple, list)) else [expected]
    for k, (a, e) in enumerate(zip(outs, exp)):
        check_same(a, e, f"{what or op} result {k}")
    return outs


def as_index(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.int64)


# ---- creation -----------------------------------------------------------------------------
FULL_VALUES = [0, 1, -1, 7, 2.5, -2.7, True, False, 300, -129, -255, -256, 70000, 1e6, 1e39,
               float("inf"), float("-inf"), float("nan"), 65504.0, 2**40]


@pytest.mark.parametrize("value", FULL_VALUES, ids=repr)
@pytest.mark.parametrize("dtype", [None] + DTYPES)
def test_full(dtype, value):
    kw = {} if dtype is None else {"dtype": dtype}
    compare("full", [], lambda: torch.full((2, 3), value, **({} if dtype is None else {"dtype": TORCH[dtype]})),
            f"full({value!r}, {dtype})", shape=[2, 3], value=value, **kw)


@pytest.mark.parametrize("shape", [[], [0], [3, 0, 2], [1, 1, 1]], ids=str)
def test_full_shapes(shape):
    compare("full", [], lambda: torch.full(shape, 1.5), shape=shape, value=1.5)


def test_full_symbolic_shape():
    x = torch.zeros(4, 2)
    g = one_op("full", [("x", "float32", ["T", "K"])], [], shape=["T", "K*2", "T+1", 3], value=3, dtype="int16")
    g["outputs"] = ["out"]
    out = run_graph(Fusion.from_json(g), {"x": x.numpy()})["out"]
    check_same(out, torch.full((4, 4, 5, 3), 3, dtype=torch.int16))


@pytest.mark.parametrize("value", [0, 3, -2.5, True, 300, float("nan")], ids=repr)
@pytest.mark.parametrize("dtype", [None, "int8", "float16", "bool"])
@pytest.mark.parametrize("src", ["int32", "bfloat16", "bool", "uint8"])
def test_full_like(src, dtype, value):
    x = rand(src, (2, 0, 3) if src == "bool" else (3, 2), gen_for(src))
    kw = {} if dtype is None else {"dtype": dtype}
    compare("full_like", [x], lambda: torch.full_like(x, value, **({} if dtype is None else {"dtype": TORCH[dtype]})),
            f"full_like({src}, {value!r}, {dtype})", value=value, **kw)


@pytest.mark.parametrize("dtype", ["int64", "int32", "int8", "uint8", "float32", "float64", "float16", "bfloat16"])
@pytest.mark.parametrize("start,step,n", [(0, 1, 5), (3, 2, 4), (10, -3, 4), (0, 1, 0), (-5, 1, 11), (250, 1, 3)], ids=str)
def test_iota(dtype, start, step, n):
    expected = torch.arange(start, start + step * n, step, dtype=torch.int64)[:n].to(TORCH[dtype])
    (out,) = run_op("iota", [], length=n, start=start, step=step, dtype=dtype)
    check_same(out, expected, "iota")


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_iota_float_steps(dtype):
    expected = torch.arange(0.5, 0.5 + 0.25 * 7, 0.25, dtype=torch.float64)[:7].to(TORCH[dtype])
    (out,) = run_op("iota", [], length=7, start=0.5, step=0.25, dtype=dtype)
    check_same(out, expected, "iota float")


def test_iota_symbolic_length():
    g = one_op("iota", [("x", "float32", ["T"])], [], length="T*2", dtype="int32")
    out = run_graph(Fusion.from_json(g), {"x": np.zeros(3, np.float32)})["out"]
    check_same(out, torch.arange(6, dtype=torch.int32))


def test_iota_rejects_bool():
    with pytest.raises(RuntimeError):
        torch.arange(3, dtype=torch.bool)
    with pytest.raises(GraphError) as e:
        Fusion.from_json(one_op("iota", [], [], length=3, dtype="bool"))
    assert e.value.issues[0].loc == ("ops", 0, "dtype")


# ---- reshape and views -----------------------------------------------------------------------
@pytest.mark.parametrize("src,shape", [((2, 3, 4), [6, 4]), ((2, 3, 4), [-1]), ((2, 3, 4), [4, -1]), ((2, 3, 4), [-1, 2, 3]),
                                       ((0, 3), [3, -1]), ((0, 3), [-1, 0]), ((), [1, 1]), ((1,), []), ((6,), [2, -1, 3]),
                                       ((2, 3), [7]), ((2, 3), [-1, -1]), ((2, 3), [4, -1]), ((2, 3), [-2, 3])], ids=str)
def test_reshape(src, shape):
    x = rand("int32", src, gen_for(src))
    compare("reshape", [x], lambda: x.reshape(shape), f"reshape {src} -> {shape}", shape=shape)


@pytest.mark.parametrize("decl,actual,shape,want", [
    (["T", 4], (3, 4), [-1], (12,)),
    (["T", 4], (3, 4), ["T", 2, 2], (3, 2, 2)),
    (["T", 4], (5, 4), [2, -1], (2, 10)),
    (["T", 4], (3, 4), ["T*4"], (12,)),
    (["T", "K"], (3, 5), ["K", "T"], (5, 3)),
    (["T", "K"], (3, 5), [-1, "K"], (3, 5)),
    (["T", "K"], (3, 5), ["T*K", 1], (15, 1)),
], ids=str)
def test_reshape_symbolic(decl, actual, shape, want):
    x = rand("float32", actual, gen_for(decl, actual))
    (out,) = run_op("reshape", [x], shapes={0: decl}, shape=shape)
    check_same(out, x.reshape(want), f"reshape {decl} -> {shape}")


@pytest.mark.parametrize("src,shape,dims", [((3,), (2, 3), [1]), ((3, 1), (3, 4), [0, 1]), ((), (2, 2), []),
                                            ((1, 4), (2, 3, 4), [1, 2]), ((2,), (2, 5), [0]), ((0,), (3, 0), [1])],
                         ids=str)
def test_broadcast_in_dim(src, shape, dims):
    x = rand("bfloat16", src, gen_for(src))
    view = [1] * len(shape)
    for i, d in enumerate(dims):
        view[d] = src[i]
    (out,) = run_op("broadcast_in_dim", [x], shape=list(shape), broadcast_dims=dims)
    check_same(out, x.reshape(view).expand(shape), "broadcast_in_dim")


@pytest.mark.parametrize("src,shape", [((3, 1), [3, 4]), ((3, 1), [-1, 4]), ((3, 1), [2, 3, 5]), ((), [2, 2]),
                                       ((1,), [0]), ((2,), [-1, 2]), ((3, 1), [3, 4, 1]), ((2, 3), [2, 4])], ids=str)
def test_expand(src, shape):
    x = rand("int8", src, gen_for(src))
    compare("expand", [x], lambda: x.expand(*shape), f"expand {src} -> {shape}", shape=shape)


@pytest.mark.parametrize("src,dims", [((1, 3, 1), None), ((1, 3, 1), 0), ((1, 3, 1), -1), ((1, 3, 1), 1),
                                      ((1, 3, 1), [0, 2]), ((1, 3, 1), [-3, 1]), ((), None), ((), 0), ((), [-1]),
                                      ((2, 3), [0, 1]), ((1, 1), []), ((1, 2), 2), ((1, 2), [0, 0])], ids=str)
def test_squeeze(src, dims):
    x = rand("float16", src, gen_for(src))
    oracle = (lambda: x.squeeze()) if dims is None else (lambda: x.squeeze(tuple(dims) if isinstance(dims, list) else dims))
    kw = {} if dims is None else {"dims": dims}
    compare("squeeze", [x], oracle, f"squeeze {src} {dims}", **kw)


@pytest.mark.parametrize("src,dim", [((2, 3), 0), ((2, 3), 2), ((2, 3), -1), ((2, 3), -3), ((), 0), ((), -1),
                                     ((2, 3), 3), ((2, 3), -4), ((), 1)], ids=str)
def test_unsqueeze(src, dim):
    x = rand("int64", src, gen_for(src))
    compare("unsqueeze", [x], lambda: x.unsqueeze(dim), f"unsqueeze {src} {dim}", dim=dim)


@pytest.mark.parametrize("src,dims", [((2, 3, 4), [2, 0, 1]), ((2, 3, 4), [-1, -3, 1]), ((), []), ((5,), [0]),
                                      ((2, 0, 3), [1, 2, 0]), ((2, 3), [0, 0]), ((2, 3), [0]), ((2, 3), [0, 2])],
                         ids=str)
def test_permute(src, dims):
    x = rand("float32", src, gen_for(src))
    compare("permute", [x], lambda: x.permute(dims), f"permute {src} {dims}", dims=dims)


SLICES = [(0, None, None, 1), (0, 1, None, 1), (0, -3, None, 1), (0, None, -2, 1), (0, -4, -1, 2), (1, 1, 5, 2),
          (1, -100, 100, 3), (1, 4, 2, 1), (-1, -2, None, 1), (-2, 2, 3, 1), (0, 5, 9, 1), (1, 0, 0, 1),
          (0, None, None, -1), (0, None, None, 0), (2, 0, 1, 1)]


@pytest.mark.parametrize("dim,start,end,step", SLICES, ids=str)
def test_slice(dim, start, end, step):
    x = rand("int16", (5, 6), gen_for(dim, start, end, step))

    def oracle():
        idx = [slice(None)] * x.ndim
        idx[dim] = slice(start, end, step)
        return x[tuple(idx)]

    kw = {k: v for k, v in dict(start=start, end=end).items() if v is not None}
    compare("slice", [x], oracle, f"slice dim={dim} [{start}:{end}:{step}]", dim=dim, step=step, **kw)


@pytest.mark.parametrize("step", [1, 2, 3])
@pytest.mark.parametrize("start,end", [(1, None), (-2, None), (0, -1), ("none", 2), (3, 5), (-5, -1), (4, 2)], ids=str)
def test_slice_symbolic(start, end, step):
    """One graph over a symbolic size, bound to sizes below, inside and above the slice bounds."""
    kw = {k: v for k, v in dict(start=start, end=end).items() if v not in (None, "none")}
    g = one_op("slice", [("x", "float32", ["T", 2])], ["x"], dim=0, step=step, **kw)
    fusion = Fusion.from_json(g)
    s = None if start == "none" else start
    for t in (0, 1, 3, 7):
        x = rand("float32", (t, 2), gen_for(start, end, t))
        out = run_graph(fusion, {"x": x.numpy()})["out"]
        check_same(out, x[s:end:step], f"slice [{s}:{end}:{step}] of size {t}")


PADS = [[1, 2], [0, 0, 1, 1], [-1, 2], [2, -3, 1, 0], [-1, -1, -1, -1], [0, 0, 0, 0, 0, 0], [3], [1, 1, 1, 1, 1, 1, 1, 1],
        [-4, 0], [-3, -3]]


@pytest.mark.parametrize("pad", PADS, ids=str)
@pytest.mark.parametrize("dtype,value", [("float32", 0), ("float32", -1.5), ("int8", 7), ("bool", True),
                                         ("bfloat16", 2.5), ("uint8", -1), ("int8", -1.7), ("uint8", 300),
                                         ("float16", float("inf"))], ids=str)
def test_pad(pad, dtype, value):
    x = rand(dtype, (2, 3, 4), gen_for(str(pad), dtype))
    compare("pad", [x], lambda: F.pad(x, pad, value=value), f"pad {pad} {dtype} {value!r}", pad=pad, value=value)


@pytest.mark.parametrize("dts", [["float32", "float16"], ["int8", "uint8"], ["bool", "int32"], ["bfloat16", "float16"],
                                 ["int64", "bfloat16"], ["bool", "bool"], ["int16", "int64", "float64"]], ids=str)
@pytest.mark.parametrize("dim", [0, 1, -1, -2])
def test_cat(dts, dim):
    gen = gen_for(str(dts), dim)
    ts = []
    for k, dt in enumerate(dts):
        shape = [2, 3]
        shape[dim % 2] = k + 1
        ts.append(rand(dt, shape, gen))
    compare("cat", ts, lambda: torch.cat(ts, dim=dim), f"cat {dts} dim={dim}", dim=dim)


@pytest.mark.parametrize("shapes,dim", [([(2, 3), (2, 4)], 0), ([(2, 3), (2,)], 0), ([(), ()], 0), ([(2, 3)], 2),
                                        ([(2, 0), (2, 3)], 1), ([(0, 3), (2, 3)], 0), ([(2, 3)], -1)], ids=str)
def test_cat_shapes(shapes, dim):
    ts = [rand("float32", s, gen_for(s)) for s in shapes]
    compare("cat", ts, lambda: torch.cat(ts, dim=dim), f"cat {shapes} dim={dim}", dim=dim)


def test_cat_symbolic():
    a, b = rand("float32", (3, 2), gen_for(1)), rand("float32", (4, 2), gen_for(2))
    (out,) = run_op("cat", [a, b], shapes={0: ["T", 2], 1: ["S", 2]}, dim=0)
    check_same(out, torch.cat([a, b]), "cat symbolic")


# ---- reductions ------------------------------------------------------------------------------
REDUCE_DIMS = [None, 0, -1, [0, 2], [-1, 0], [1], [], [0, 1, 2], [0, 0], 3]


def torch_reduce(op, x, dims, keepdim, dtype=None):
    kw = {} if dtype is None else {"dtype": TORCH[dtype]}
    if op == "prod":  # torch.prod takes one dim: reduce the listed dims one at a time (highest first)
        if dims is None or dims == []:
            r = torch.prod(x, **kw)
            return r.reshape([1] * x.ndim) if keepdim else r
        lst = [dims] if isinstance(dims, int) else dims
        if len({d % max(x.ndim, 1) for d in lst}) != len(lst) or any(not -x.ndim <= d < max(x.ndim, 1) for d in lst):
            raise RuntimeError("bad dims")
        r = x
        for d in sorted((d % max(x.ndim, 1) for d in lst), reverse=True):
            r = torch.prod(r, dim=d, keepdim=keepdim, **kw)
        return r
    fn = getattr(torch, op)
    if dims is None:
        if op in ("amax", "amin"):
            return fn(x, dim=list(range(x.ndim)) if keepdim else (), keepdim=keepdim)
        r = fn(x, **kw)
        return r.reshape([1] * x.ndim) if keepdim else r
    return fn(x, dim=dims, keepdim=keepdim, **kw)


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dims", REDUCE_DIMS, ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["sum", "prod", "amax", "amin", "mean"])
def test_reduce(op, dtype, dims, keepdim):
    x = rand(dtype, (3, 4, 5), gen_for(op, dtype, str(dims)), lo=-3, hi=3)
    kw = {} if dims is None else {"dims": dims}
    compare(op, [x], lambda: torch_reduce(op, x, dims, keepdim), f"{op}({dtype}, {dims}, keepdim={keepdim})",
            keepdim=keepdim, **kw)


@pytest.mark.parametrize("out_dtype", ["float64", "int64", "float32", "int32", "bfloat16"])
@pytest.mark.parametrize("dtype", ["int8", "bool", "float16", "float32"])
@pytest.mark.parametrize("op", ["sum", "prod", "mean"])
def test_reduce_dtype_arg(op, dtype, out_dtype):
    x = rand(dtype, (4, 3), gen_for(op, dtype, out_dtype), lo=-3, hi=3)
    if dtype == "float32":
        x = x * 1000 + 1 / 3  # not representable in the narrower dtypes: converted before reducing
    compare(op, [x], lambda: torch_reduce(op, x, 1, False, out_dtype), f"{op}({dtype}, dtype={out_dtype})",
            dims=1, dtype=out_dtype)


@pytest.mark.parametrize("dims", [None, 0, []], ids=str)
@pytest.mark.parametrize("op", ["sum", "prod", "amax", "amin", "mean"])
def test_reduce_0d(op, dims):
    x = torch.tensor(2.5)
    kw = {} if dims is None else {"dims": dims}
    compare(op, [x], lambda: torch_reduce(op, x, dims, False), f"{op} 0-d {dims}", **kw)


@pytest.mark.parametrize("shape,dims", [((0, 3), 0), ((0, 3), 1), ((0, 3), None), ((2, 0), [0, 1])], ids=str)
@pytest.mark.parametrize("op", ["sum", "prod", "amax", "amin", "mean"])
def test_reduce_empty(op, shape, dims):
    x = torch.zeros(shape)
    kw = {} if dims is None else {"dims": dims}
    compare(op, [x], lambda: torch_reduce(op, x, dims, False), f"{op} empty {shape} {dims}", **kw)


@pytest.mark.parametrize("op", ["sum", "prod", "amax", "amin", "mean"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_reduce_nan_inf(op, dtype):
    x = torch.tensor([[1.0, float("nan"), 2.0], [float("inf"), 1.0, -1.0], [float("-inf"), float("inf"), 0.0],
                      [-0.0, 0.0, 3.0]], dtype=torch.float64).to(TORCH[dtype])
    for dims in (0, 1, None):
        kw = {} if dims is None else {"dims": dims}
        compare(op, [x], lambda: torch_reduce(op, x, dims, False), f"{op}({dtype} NaN, {dims})", **kw)  # noqa: B023 (called at once)


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dim", [None, 0, 1, -1, 2])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_argreduce(op, dtype, dim, keepdim):
    # small integers: many ties, and the first extreme must win
    x = rand(dtype, (4, 6), gen_for(op, dtype, dim), lo=-2, hi=2)
    kw = {} if dim is None else {"dim": dim}
    compare(op, [x], lambda: getattr(torch, op)(x, dim=dim, keepdim=keepdim), f"{op}({dtype}, {dim}, {keepdim})",
            keepdim=keepdim, **kw)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_argreduce_nan(op, dtype):
    x = torch.tensor([[1.0, float("nan"), 5.0, float("nan")], [float("inf"), 2.0, float("inf"), -1.0],
                      [float("-inf"), 0.0, -0.0, float("-inf")]], dtype=torch.float64).to(TORCH[dtype])
    for dim in (None, 0, 1):
        compare(op, [x], lambda: getattr(torch, op)(x, dim=dim), f"{op}({dtype} NaN, {dim})",  # noqa: B023 (called at once)
                **({} if dim is None else {"dim": dim}))


@pytest.mark.parametrize("shape,dim", [((), None), ((), 0), ((0, 3), 1), ((0, 3), 0), ((0, 3), None)], ids=str)
@pytest.mark.parametrize("op", ["argmax", "argmin"])
def test_argreduce_edge_shapes(op, shape, dim):
    x = torch.ones(shape)
    compare(op, [x], lambda: getattr(torch, op)(x, dim=dim), f"{op} {shape} {dim}",
            **({} if dim is None else {"dim": dim}))


# ---- scans ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("dim", [0, 1, -1, -2, 2])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", ["cumsum", "cumprod"])
def test_scan(op, dtype, dim):
    x = rand(dtype, (4, 5), gen_for(op, dtype, dim), lo=-2, hi=2)
    compare(op, [x], lambda: getattr(torch, op)(x, dim=dim), f"{op}({dtype}, {dim})", dim=dim)


@pytest.mark.parametrize("out_dtype", ["float64", "int32", "float16", "int8"])
@pytest.mark.parametrize("op", ["cumsum", "cumprod"])
def test_scan_dtype_arg(op, out_dtype):
    x = rand("int16", (3, 4), gen_for(op, out_dtype), lo=-2, hi=2)
    if op == "cumsum":
        x = x * 1001 + 2049  # not exact in float16: converted before accumulating
    compare(op, [x], lambda: getattr(torch, op)(x, dim=1, dtype=TORCH[out_dtype]), f"{op} dtype={out_dtype}",
            dim=1, dtype=out_dtype)


@pytest.mark.parametrize("shape", [(), (0,), (3, 0)], ids=str)
@pytest.mark.parametrize("op", ["cumsum", "cumprod"])
def test_scan_edge_shapes(op, shape):
    x = torch.full(shape, 1.5)
    compare(op, [x], lambda: getattr(torch, op)(x, dim=0), f"{op} {shape}", dim=0)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", ["cumsum", "cumprod"])
def test_scan_long_rows(op, dtype):
    """Long rows: the accumulation precision shows (torch's CPU accumulates float32 in float64)."""
    gen = gen_for(op, dtype, "long")
    x = torch.randn(4, 3000, generator=gen, dtype=torch.float64) * 3
    if op == "cumprod":
        x = 1 + x / 3000  # stays finite
    x = x.to(TORCH[dtype])
    compare(op, [x], lambda: getattr(torch, op)(x, dim=1), f"{op}({dtype}) long rows", dim=1)


@pytest.mark.parametrize("op", ["cumsum", "cumprod"])
def test_scan_nan(op):
    x = torch.tensor([1.0, 2.0, float("nan"), 3.0, float("inf"), 0.0])
    compare(op, [x], lambda: getattr(torch, op)(x, dim=0), dim=0)


# ---- sorting ------------------------------------------------------------------------------------
def sort_input(dtype, shape, gen):
    x = rand(dtype, shape, gen, lo=-2, hi=2)  # many ties
    if dtype in FLOATS:
        x = torch.round(x)  # ties in floats too
        flat = x.reshape(-1)
        if flat.numel() >= 8:
            flat[0], flat[3], flat[5], flat[7] = float("nan"), float("inf"), float("-inf"), -0.0
    return x


@pytest.mark.parametrize("descending", [False, True])
@pytest.mark.parametrize("dim", [-1, 0, 1])
@pytest.mark.parametrize("dtype", DTYPES)
def test_sort_and_argsort(dtype, dim, descending):
    x = sort_input(dtype, (5, 7), gen_for(dtype, dim, descending))
    for stable in (False, True):  # segfuse always sorts stably
        compare("sort", [x], lambda: tuple(torch.sort(x, dim=dim, descending=descending, stable=True)),
                f"sort({dtype}, {dim}, desc={descending})", n_out=2, dim=dim, descending=descending, stable=stable)
        compare("argsort", [x], lambda: torch.argsort(x, dim=dim, descending=descending, stable=True),
                f"argsort({dtype}, {dim}, desc={descending})", dim=dim, descending=descending, stable=stable)


@pytest.mark.parametrize("shape,dim", [((), 0), ((), -1), ((0,), 0), ((3, 0), 1), ((3, 0), 0), ((4,), 1)], ids=str)
def test_sort_edge_shapes(shape, dim):
    x = torch.arange(float(np.prod(shape))).reshape(shape)
    compare("sort", [x], lambda: tuple(torch.sort(x, dim=dim, stable=True)), n_out=2, dim=dim)
    compare("argsort", [x], lambda: torch.argsort(x, dim=dim, stable=True), dim=dim)


@pytest.mark.parametrize("largest", [True, False])
@pytest.mark.parametrize("k,dim", [(1, -1), (3, 1), (7, 1), (0, 1), (2, 0), (5, 0)], ids=str)
@pytest.mark.parametrize("dtype", DTYPES)
def test_topk(dtype, k, dim, largest):
    x = sort_input(dtype, (5, 7), gen_for(dtype, k, dim, largest))
    expected, err = outcome(lambda: torch.topk(x, k, dim=dim, largest=largest))
    if dtype == "bool" and err is not None:
        # torch has no CPU topk kernel for bool; segfuse's topk works on bool like sort does
        expected, err = torch.topk(x.to(torch.uint8), k, dim=dim, largest=largest), None
        expected = (expected.values.bool(), expected.indices)
    if err is not None:
        with pytest.raises(GraphError):
            run_op("topk", [x], 2, k=k, dim=dim, largest=largest)
        return
    values, indices = run_op("topk", [x], 2, k=k, dim=dim, largest=largest)
    check_same(values, expected[0], f"topk values ({dtype})")
    idx = to_torch(indices)
    assert idx.dtype == torch.int64
    check_same(to_numpy(torch.gather(x, dim, idx)), expected[0], "values at the returned indices")
    for row in idx.movedim(dim, -1).reshape(-1, k) if k else ():
        assert len(set(row.tolist())) == k, "indices repeat"
    # segfuse: ties keep input order, exactly what a stable sort gives
    ref = torch.sort(x, dim=dim, descending=largest, stable=True).indices.narrow(dim, 0, k)
    assert torch.equal(idx, ref)


@pytest.mark.parametrize("k", [4, -1])
def test_topk_k_out_of_range(k):
    x = torch.zeros(2, 3)
    with pytest.raises(RuntimeError):
        torch.topk(x, k)
    with pytest.raises(GraphError) as e:
        run_op("topk", [x], 2, k=k)
    assert e.value.issues[0].loc == ("ops", 0, "k")


def test_topk_symbolic_k():
    x = rand("float32", (3, 8), gen_for("topk-sym"))
    g = one_op("topk", [("x", "float32", ["T", 8])], ["x"], n_out=2, k="T")
    res = run_graph(Fusion.from_json(g), {"x": x.numpy()})
    check_same(res["out0"], torch.topk(x, 3).values)


# ---- gather family -----------------------------------------------------------------------------
@pytest.mark.parametrize("idt", INDEX_DTYPES)
@pytest.mark.parametrize("dim", [0, 1, -1, -2])
@pytest.mark.parametrize("dtype", ["float32", "bool", "bfloat16", "int8"])
@pytest.mark.parametrize("ishape", [(4, 3), (2, 3), (2, 1), (6, 2), (0, 2)], ids=str)
def test_gather(ishape, dtype, dim, idt):
    gen = gen_for(ishape, dtype, dim, idt)
    x = rand(dtype, (4, 3), gen)
    size = x.shape[dim]
    index = torch.randint(0, size, ishape, generator=gen).to(TORCH[idt])
    compare("gather", [x, index], lambda: torch.gather(x, dim, as_index(index)), f"gather {ishape} dim={dim}", dim=dim)


@pytest.mark.parametrize("xshape,ishape,dim", [((4, 3), (2, 3), 0), ((4, 3), (4, 1), 1), ((4, 1), (4, 5), 1),
                                               ((4, 3), (1, 2), 0), ((1, 3), (5, 3), 0), ((2, 3, 4), (2, 1, 4), -2),
                                               ((4, 3), (3,), 0), ((4, 3), (2, 2), 1)], ids=str)
@pytest.mark.parametrize("idt", ["int64", "int32"])
def test_take_along_axis(xshape, ishape, dim, idt):
    gen = gen_for(xshape, ishape, dim)
    x = rand("float32", xshape, gen)
    index = torch.randint(0, xshape[dim], ishape, generator=gen).to(TORCH[idt])
    compare("take_along_axis", [x, index], lambda: torch.take_along_dim(x, as_index(index), dim=dim),
            f"take_along_axis {xshape} {ishape} {dim}", dim=dim)


@pytest.mark.parametrize("idt", INDEX_DTYPES)
@pytest.mark.parametrize("xshape,dim,n", [((4, 3), 0, 6), ((4, 3), 1, 2), ((4, 3), -1, 0), ((5,), 0, 3), ((), 0, 1),
                                          ((2, 3, 4), -2, 5)], ids=str)
def test_index_select(xshape, dim, n, idt):
    gen = gen_for(xshape, dim, n, idt)
    x = rand("int32", xshape, gen)
    size = x.shape[dim] if x.ndim else 1
    index = torch.randint(0, size, (n,) if xshape else (), generator=gen).to(TORCH[idt])
    compare("index_select", [x, index], lambda: torch.index_select(x, dim, as_index(index)),
            f"index_select {xshape} {dim}", dim=dim)


# ---- scatter family -------------------------------------------------------------------------------
REDUCES = {"add": "sum", "mul": "prod", "amax": "amax", "amin": "amin"}


@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", sorted(REDUCES))
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_scatter_reduce_duplicates(dim, dtype, reduce, include_self):
    gen = gen_for(dim, dtype, reduce, include_self)
    x = rand(dtype, (4, 5), gen, lo=-3, hi=3)
    # index smaller than self in the non-scatter dim; few targets, so many duplicates
    ishape = [3, 3]
    ishape[dim % 2] = 6
    index = torch.randint(0, 2, tuple(ishape), generator=gen) * (x.shape[dim] - 1)
    src = rand(dtype, (6, 6), gen, lo=-3, hi=3)
    compare("scatter", [x, index, src],
            lambda: torch.scatter_reduce(x, dim, index, src, REDUCES[reduce], include_self=include_self),
            f"scatter reduce={reduce} include_self={include_self} {dtype}", dim=dim, reduce=reduce,
            include_self=include_self)


@pytest.mark.parametrize("idt", INDEX_DTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("dim", [0, 1, -2])
def test_scatter_unique(dim, dtype, idt):
    """reduce='none' (torch.scatter): unique targets, so the result is defined."""
    gen = gen_for(dim, dtype, idt)
    x = rand(dtype, (4, 5), gen)
    n = x.shape[dim]
    other = 3
    perm = torch.stack([torch.randperm(n, generator=gen)[:3] for _ in range(other)], dim=1)  # [3, other]
    index = perm if dim % 2 == 0 else perm.T
    index = index.contiguous().to(TORCH[idt])
    src = rand(dtype, (5, 5), gen)
    compare("scatter", [x, index, src], lambda: torch.scatter(x, dim, as_index(index), src), f"scatter {dtype}",
            dim=dim)


@pytest.mark.parametrize("value", [2, -1.5, True, 0], ids=repr)
@pytest.mark.parametrize("reduce", ["none", "add", "mul", "amax"])
@pytest.mark.parametrize("dtype", ["float32", "int32", "bfloat16", "bool"])
def test_scatter_scalar_src(dtype, reduce, value):
    gen = gen_for(dtype, reduce, repr(value))
    x = rand(dtype, (3, 4), gen)
    index = torch.tensor([[0, 2, 1, 0], [2, 2, 0, 1]]) if reduce != "none" else torch.tensor([[0, 2, 1, 0]])

    def oracle():
        if reduce == "none":
            return torch.scatter(x, 0, index, value)
        src = torch.full(index.shape, value).to(x.dtype) if not isinstance(value, float) or x.dtype.is_floating_point \
            else torch.full(index.shape, value, dtype=x.dtype)
        return torch.scatter_reduce(x, 0, index, src, REDUCES[reduce])

    compare("scatter", [x, index, value], oracle, f"scatter scalar {value!r} {reduce} {dtype}", dim=0, reduce=reduce)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("reduce", ["amax", "amin", "add"])
def test_scatter_reduce_nan(dtype, reduce):
    x = torch.tensor([1.0, float("nan"), 3.0, 0.0], dtype=torch.float64).to(TORCH[dtype])
    index = torch.tensor([0, 0, 2, 3, 3])
    src = torch.tensor([float("nan"), 5.0, 1.0, float("inf"), -1.0], dtype=torch.float64).to(TORCH[dtype])
    for include_self in (True, False):
        compare("scatter", [x, index, src],
                lambda: torch.scatter_reduce(x, 0, index, src, REDUCES[reduce], include_self=include_self),  # noqa: B023 (called at once)
                f"scatter {reduce} NaN include_self={include_self}", dim=0, reduce=reduce, include_self=include_self)


def test_scatter_3d_small_index():
    gen = gen_for("3d")
    x = rand("float32", (4, 5, 6), gen)
    index = torch.randint(0, 5, (2, 3, 4), generator=gen)
    src = rand("float32", (3, 4, 5), gen)
    for reduce in REDUCES:
        compare("scatter", [x, index, src], lambda: torch.scatter_reduce(x, 1, index, src, REDUCES[reduce]),  # noqa: B023 (called at once)
                f"scatter 3d {reduce}", dim=1, reduce=reduce)


@pytest.mark.parametrize("alpha", [1, 2, -0.5, True, 2.5], ids=repr)
@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "int8", "bool", "bfloat16", "float64"])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_index_add(dim, dtype, alpha):
    gen = gen_for(dim, dtype, repr(alpha))
    x = rand(dtype, (4, 5), gen, lo=-3, hi=3)
    index = torch.tensor([0, 3, 0, 1, 3, 3])[: 6 if dim % 2 == 0 else 6]
    index = index.clamp(max=x.shape[dim] - 1)
    sshape = list(x.shape)
    sshape[dim] = len(index)
    src = rand(dtype, sshape, gen, lo=-3, hi=3)
    def oracle(ix):
        if dtype in ("float16", "bfloat16"):
            # torch rounds to the reduced dtype after each duplicate's addition; segfuse (like a
            # float32 accumulator) rounds once: compare with the exact result, rounded once
            return torch.index_add(x.double(), dim, as_index(ix), src.double(), alpha=alpha).to(x.dtype)
        return torch.index_add(x, dim, as_index(ix), src, alpha=alpha)

    for idt in ("int64", "int32"):
        ix = index.to(TORCH[idt])
        compare("index_add", [x, ix, src], lambda: oracle(ix),  # noqa: B023 (called at once)
                f"index_add {dtype} alpha={alpha!r}", dim=dim, alpha=alpha)


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("vshape", [(3, 4), (4,), (1, 4), (), (3, 1)], ids=str)
@pytest.mark.parametrize("dtype", ["float32", "int64", "bool", "float16"])
def test_index_put(dtype, vshape, accumulate):
    gen = gen_for(dtype, vshape, accumulate)
    x = rand(dtype, (5, 4), gen)
    index = torch.tensor([1, -1, 3]) if not accumulate else torch.tensor([1, -4, -1, 4, 0])[:3]
    vals = rand(dtype, vshape, gen)
    for idt in ("int64", "int32", "int8"):
        ix = index.to(TORCH[idt])
        compare("index_put", [x, ix, vals], lambda: torch.index_put(x, (as_index(ix),), vals, accumulate=accumulate),  # noqa: B023 (called at once)
                f"index_put {dtype} values{vshape} accumulate={accumulate}", accumulate=accumulate)


def test_index_put_duplicates_accumulate():
    x = torch.zeros(4, 2)
    index = torch.tensor([1, 1, -3, 3, 1])
    vals = torch.arange(10.0).reshape(5, 2)
    compare("index_put", [x, index, vals], lambda: torch.index_put(x, (index,), vals, accumulate=True), accumulate=True)


@pytest.mark.parametrize("value", [7, 2.5, True], ids=repr)
def test_index_put_scalar(value):
    x = torch.zeros(4, 3)
    index = torch.tensor([2, -1])
    (out,) = run_op("index_put", [x, index, value])
    check_same(out, torch.index_put(x, (index,), torch.tensor(value).to(x.dtype)))


# ---- out-of-range indices: RunError naming the op, nothing written ------------------------
BAD_INDEX_CASES = [
    ("gather", lambda x: [x, torch.tensor([[0, 4, 1]])], dict(dim=0), lambda x, i: torch.gather(x, 0, i)),
    ("gather", lambda x: [x, torch.tensor([[0, -1, 1]])], dict(dim=0), lambda x, i: torch.gather(x, 0, i)),
    # torch.take_along_dim does not check bounds on the CPU (index 3 of 3 reads element 0):
    # gather, which it is built on, does
    ("take_along_axis", lambda x: [x, torch.tensor([[3], [0], [0], [0]])], dict(dim=1),
     lambda x, i: torch.gather(x, 1, i)),
    ("index_select", lambda x: [x, torch.tensor([0, 4])], dict(dim=0), lambda x, i: torch.index_select(x, 0, i)),
    ("index_select", lambda x: [x, torch.tensor([-1])], dict(dim=0), lambda x, i: torch.index_select(x, 0, i)),
    ("scatter", lambda x: [x, torch.tensor([[0, 9, 1]]), torch.ones(1, 3)], dict(dim=0),
     lambda x, i: torch.scatter(x, 0, i, torch.ones(1, 3))),
    ("scatter", lambda x: [x, torch.tensor([[0, 1, -1]]), 1.0], dict(dim=0, reduce="add"),
     lambda x, i: torch.scatter(x, 0, i, 1.0, reduce="add")),
    ("index_add", lambda x: [x, torch.tensor([0, 4]), torch.ones(2, 3)], dict(dim=0),
     lambda x, i: torch.index_add(x, 0, i, torch.ones(2, 3))),
    ("index_put", lambda x: [x, torch.tensor([1, 4]), torch.ones(3)], dict(),
     lambda x, i: torch.index_put(x, (i,), torch.ones(3))),
    ("index_put", lambda x: [x, torch.tensor([1, -5]), torch.ones(3)], dict(accumulate=True),
     lambda x, i: torch.index_put(x, (i,), torch.ones(3), accumulate=True)),
]


@pytest.mark.parametrize("case", range(len(BAD_INDEX_CASES)))
def test_out_of_range_index(case):
    op, make, attrs, oracle = BAD_INDEX_CASES[case]
    x = torch.arange(12.0).reshape(4, 3)
    operands = make(x)
    with pytest.raises((RuntimeError, IndexError)):
        oracle(x, operands[1])
    with pytest.raises(RunError) as e:
        run_op(op, operands, **attrs)
    (issue,) = e.value.issues
    assert issue.loc[:2] == ("ops", 0) and "out of bounds" in issue.msg
    assert str(e.value).startswith("ops[0]")


@pytest.mark.parametrize("op,attrs", [("scatter", dict(dim=0, reduce="add")), ("index_put", dict(accumulate=True)),
                                      ("index_add", dict(dim=0))])
def test_failed_in_place_update_writes_nothing(op, attrs):
    """self is updated in place (alias_of); a bad index fails the run and leaves every input unchanged."""
    self_ = np.arange(12, dtype=np.float32).reshape(4, 3)
    if op == "scatter":
        index, src = np.array([[0, 1, 2], [3, 7, 0]]), np.ones((2, 3), np.float32)
    elif op == "index_put":
        index, src = np.array([0, 2, 9]), np.ones((3, 3), np.float32)
    else:
        index, src = np.array([1, -1]), np.ones((2, 3), np.float32)
    g = one_op(op, [("self", "float32", [4, 3]), ("index", "int64", list(index.shape)), ("src", "float32", list(src.shape))],
              ["self", "index", "src"], **attrs)
    g["outputs"] = [{"name": "out", "alias_of": "self"}]
    fusion = Fusion.from_json(g)
    inputs = {"self": self_.copy(), "index": index.copy(), "src": src.copy()}
    with pytest.raises(RunError) as e:
        run_graph(fusion, inputs)
    assert e.value.issues[0].loc[:2] == ("ops", 0)
    np.testing.assert_array_equal(inputs["self"], self_)
    np.testing.assert_array_equal(inputs["index"], index)
    np.testing.assert_array_equal(inputs["src"], src)
    # and with good indices the input is updated in place, to torch's result
    good = {"scatter": np.array([[0, 1, 2], [3, 3, 0]]), "index_put": np.array([0, 2, -1]),
            "index_add": np.array([1, 1])}[op]
    inputs["index"] = good
    res = run_graph(fusion, inputs)
    ti, ts = torch.from_numpy(good).to(torch.int64), torch.from_numpy(src)
    tx = torch.from_numpy(self_)
    expected = {"scatter": lambda: torch.scatter_reduce(tx, 0, ti, ts, "sum"),
                "index_put": lambda: torch.index_put(tx, (ti,), ts, accumulate=True),
                "index_add": lambda: torch.index_add(tx, 0, ti, ts)}[op]()
    check_same(inputs["self"], expected, f"{op} in place")
    assert res["out"] is inputs["self"]


# ---- index validation ------------------------------------------------------------------------
@pytest.mark.parametrize("op,operands,attrs,loc", [
    ("gather", [("x", "float32", [4, 3]), ("i", "float32", [2, 3])], dict(dim=0), ("ops", 0, "inputs", 1)),
    ("gather", [("x", "float32", [4, 3]), ("i", "int64", [2])], dict(dim=0), ("ops", 0, "inputs", 1)),
    ("gather", [("x", "float32", [4, 3]), ("i", "int64", [2, 4])], dict(dim=0), ("ops", 0, "inputs", 1)),
    ("gather", [("x", "float32", [4, 3]), ("i", "int64", [2, 3])], dict(dim=2), ("ops", 0, "dim")),
    ("scatter", [("x", "float32", [4, 3]), ("i", "int64", [2, 3]), ("s", "float32", [1, 3])], dict(dim=0),
     ("ops", 0, "inputs", 1)),
    ("scatter", [("x", "float32", [4, 3]), ("i", "int64", [2, 3]), ("s", "float64", [2, 3])], dict(dim=0),
     ("ops", 0, "inputs", 2)),
    ("index_select", [("x", "float32", [4, 3]), ("i", "int64", [2, 2])], dict(dim=0), ("ops", 0, "inputs", 1)),
    ("index_add", [("x", "float32", [4, 3]), ("i", "int64", [2]), ("s", "float32", [3, 3])], dict(dim=0),
     ("ops", 0, "inputs", 2)),
    ("index_put", [("x", "float32", [4, 3]), ("i", "int64", [2]), ("v", "float32", [2, 2])], dict(),
     ("ops", 0, "inputs", 2)),
    ("index_put", [("x", "float32", [4, 3]), ("i", "bool", [4]), ("v", "float32", [3])], dict(),
     ("ops", 0, "inputs", 1)),
], ids=lambda v: v if isinstance(v, str) else None)
def test_index_validation(op, operands, attrs, loc):
    with pytest.raises(GraphError) as e:
        Fusion.from_json(one_op(op, operands, [n for n, _, _ in operands], **attrs))
    (issue,) = e.value.issues
    assert issue.loc == loc, issue


def test_index_extent_checked_at_bind_for_symbols():
    g = one_op("gather", [("x", "float32", ["T", 3]), ("i", "int64", [2, "K"])], ["x", "i"], dim=0)
    fusion = Fusion.from_json(g)  # K <= 3 unknown until bound
    ok = run_graph(fusion, {"x": np.ones((4, 3), np.float32), "i": np.zeros((2, 2), np.int64)})
    assert ok["out"].shape == (2, 2)
    with pytest.raises(BindError) as e:
        run_graph(fusion, {"x": np.ones((4, 3), np.float32), "i": np.zeros((2, 5), np.int64)})
    assert e.value.issues[0].loc[:2] == ("ops", 0)


# ---- 0-d operands and multi-dimensional index_put ---------------------------------------------
def test_zero_dim_gather_scatter():
    x = torch.tensor(2.5)
    i = torch.tensor(0)
    compare("gather", [x, i], lambda: torch.gather(x, 0, i), dim=0)
    compare("gather", [x, i], lambda: torch.gather(x, -1, i), dim=-1)
    compare("index_select", [x, i], lambda: torch.index_select(x, 0, i), dim=0)
    for reduce in ("add", "mul", "amax"):
        compare("scatter", [x, i, torch.tensor(4.0)],
                lambda: torch.scatter_reduce(x, 0, i, torch.tensor(4.0), REDUCES[reduce]), dim=0, reduce=reduce)  # noqa: B023 (called at once)
    compare("scatter", [x, i, torch.tensor(4.0)], lambda: torch.scatter(x, 0, i, torch.tensor(4.0)), dim=0)
    compare("index_add", [x, i, torch.tensor(4.0)], lambda: torch.index_add(x, 0, i, torch.tensor(4.0), alpha=2),
            dim=0, alpha=2)
    with pytest.raises(RunError):
        run_op("gather", [x, torch.tensor(1)], dim=0)


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("vshape", [(2, 2, 3), (3,), (2, 1, 1)], ids=str)
def test_index_put_2d_index(vshape, accumulate):
    gen = gen_for("ip2d", vshape, accumulate)
    x = rand("float32", (5, 3), gen)
    index = torch.tensor([[0, -1], [2, 4]]) if not accumulate else torch.tensor([[0, 0], [-5, 4]])
    vals = rand("float32", vshape, gen)
    compare("index_put", [x, index, vals], lambda: torch.index_put(x, (index,), vals, accumulate=accumulate),
            accumulate=accumulate)


@pytest.mark.parametrize("op,attrs,size", [("reshape", dict(shape=[2, -1]), 5), ("pad", dict(pad=[-3, 0]), 2),
                                           ("reshape", dict(shape=[2, "T"]), 3)], ids=str)
def test_symbolic_shape_rules_checked_at_bind(op, attrs, size):
    """Rules that depend on a symbol's value fail at bind time, like torch does at call time."""
    fusion = Fusion.from_json(one_op(op, [("x", "float32", ["T"])], ["x"], **attrs))
    x = torch.arange(float(size))
    with pytest.raises(RuntimeError):
        {"reshape": lambda: x.reshape([2, -1] if attrs["shape"][1] == -1 else [2, size]),
         "pad": lambda: F.pad(x, attrs.get("pad", [0, 0]))}[op]()
    with pytest.raises(BindError) as e:
        run_graph(fusion, {"x": x.numpy()})
    assert e.value.issues[0].loc[:2] == ("ops", 0)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("op", ["scatter_add", "scatter_mul", "index_add", "index_put"])
def test_many_duplicates_accumulate_at_opmath(op, dtype):
    """Hundreds of updates to each target. float16/bfloat16 accumulate in float32 and round once:
    compared with the exact (float64) result rounded once. (torch's CPU index_put(accumulate=True)
    rounds to float16 after every addition and drifts far from it; its scatter_reduce does not.)"""
    gen = gen_for(op, dtype, "dups")
    x = torch.randn(8, 16, generator=gen, dtype=torch.float64)
    n = 2000
    src = torch.randn(n, 16, generator=gen, dtype=torch.float64)
    if op == "scatter_mul":
        src = 1 + src / 100
    index2 = torch.randint(0, 8, (n, 16), generator=gen)
    index1 = torch.randint(0, 8, (n,), generator=gen)

    def torch_op(x, src):
        return {"scatter_add": lambda: torch.scatter_reduce(x, 0, index2, src, "sum"),
                "scatter_mul": lambda: torch.scatter_reduce(x, 0, index2, src, "prod"),
                "index_add": lambda: torch.index_add(x, 0, index1, src),
                "index_put": lambda: torch.index_put(x, (index1,), src, accumulate=True)}[op]()

    xd, sd = x.to(TORCH[dtype]), src.to(TORCH[dtype])
    expected = torch_op(xd.double(), sd.double()).to(xd.dtype)
    if dtype in ("float32", "float64"):
        torch.testing.assert_close(torch_op(xd, sd), expected, **tol(xd.dtype))  # the oracle agrees with torch here
    if op.startswith("scatter"):
        (out,) = run_op("scatter", [xd, index2, sd], dim=0, reduce=op.split("_")[1])
    elif op == "index_add":
        (out,) = run_op("index_add", [xd, index1, sd], dim=0)
    else:
        (out,) = run_op("index_put", [xd, index1, sd], accumulate=True)
    check_same(out, expected, f"{op} {dtype} with many duplicates")


@pytest.mark.parametrize("op,shape_in,attrs", [("expand", (3, 1), dict(shape=[3, 1])), ("expand", (), dict(shape=[])),
                                               ("broadcast_in_dim", (), dict(shape=[], broadcast_dims=[])),
                                               ("expand", (1,), dict(shape=[4])), ("reshape", (2, 2), dict(shape=[4]))],
                         ids=str)
def test_outputs_are_writeable_arrays_of_their_own(op, shape_in, attrs):
    x = torch.ones(shape_in)
    (out,) = run_op(op, [x], **attrs)
    assert out.flags.writeable and out.flags.c_contiguous and out.shape == tuple(attrs["shape"])
    out[...] = 5  # the caller may write into its result
