"""Composite, scan and index ops on the GPU against PyTorch on the CPU: select, softmax, log_softmax,
logsumexp, var, std, var_mean, cummax, cummin, scatter reduce "mean", index_reduce, and scatters /
gathers with an empty index of another rank. Each graph runs under the segmenter's plan
(Engine("cupy")) and the forced grid-mode and single-block lowerings, at sizes that take the
multi-block paths (rows longer than a block, many sources per bin, long scans) as well as small
ones; special values (rows of -inf, +inf, NaN), ties, empty dims, bad indices."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import pytest

cp = pytest.importorskip("cupy")
torch = pytest.importorskip("torch")

from helpers.torch_oracle import to_numpy, to_torch  # noqa: E402
from segfuse.compiler.engine import Engine  # noqa: E402
from segfuse.compiler.errors import RunError  # noqa: E402
from segfuse.compiler.ir import Fusion  # noqa: E402

from .planned_runtime import runtime  # noqa: E402

pytestmark = pytest.mark.gpu

TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64,
         "int64": torch.int64, "int32": torch.int32, "int8": torch.int8, "bool": torch.bool}
TOL = {"float32": 2e-5, "float64": 1e-10, "float16": 2e-3, "bfloat16": 1.6e-2}
def run(graph: dict, ins: dict, mode: str) -> dict:
    """The graph's outputs as torch tensors (inputs: host arrays, as the corpus GPU tests pass them)."""
    f = Fusion.from_json(graph)
    rt = runtime(mode)  # (None: the segmenter's plan; else a forced lowering)
    outs = Engine("cupy").run(f, dict(ins)).outputs if rt is None else rt.run(f, dict(ins))[0]
    res = {}
    for k, v in outs.items():
        h = cp.asnumpy(v)
        if f.types[k].dtype.value == "bfloat16":  # (CuPy holds bfloat16 as its bits)
            h = h.view(ml_dtypes.bfloat16)
        res[k] = to_torch(h)
    return res


def check(got: torch.Tensor, want: torch.Tensor, what: str, loose: float = 1.0):
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert tuple(got.shape) == tuple(want.shape), f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    if want.dtype.is_floating_point:
        tol = TOL[str(want.dtype).removeprefix("torch.")] * loose
        torch.testing.assert_close(got, want, rtol=tol, atol=tol, equal_nan=True, msg=lambda m: f"{what}: {m}")
    else:
        assert torch.equal(got, want), f"{what}: values differ"


def _np(t: torch.Tensor) -> np.ndarray:
    return to_numpy(t)


def one_op(op, dt, shape, n_out=1, **attrs) -> dict:
    outs = ["o"] if n_out == 1 else [f"o{k}" for k in range(n_out)]
    return {"format": "segfuse.fusion/1", "name": "g", "inputs": [{"name": "x", "dtype": dt, "shape": list(shape)}],
            "ops": [{"op": op, "out": outs[0] if n_out == 1 else outs, "inputs": ["x"], **attrs}], "outputs": outs}


def special(x: torch.Tensor) -> torch.Tensor:
    x = x.clone()
    if x.dim() == 2 and x.shape[0] >= 4 and x.shape[1] >= 3:
        x[0] = -float("inf")
        x[1, 1] = float("inf")
        x[2, 2] = float("nan")
        x[3] = 0.5
    return x


MODES = ["plan", "grid", "block"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dt", ["float32", "float16", "bfloat16", "float64"])
@pytest.mark.parametrize("shape", [(6, 37), (64, 4096), (3, 0)])
def test_softmax_logsumexp_var(mode, dt, shape):
    if mode == "block" and shape[1] > 1000:
        pytest.skip("one block of 262144 elements: covered by plan/grid")
    g = torch.Generator().manual_seed(0)
    x = special(torch.randn(shape, generator=g, dtype=torch.float64) * 3).to(TORCH[dt])
    ops = [("softmax", {"dim": 1}, lambda t: torch.softmax(t, 1)),
           ("log_softmax", {"dim": 0}, lambda t: torch.log_softmax(t, 0)),
           ("logsumexp", {"dims": [1]}, lambda t: torch.logsumexp(t, [1])),
           ("var", {"dims": 1}, lambda t: torch.var(t, 1)),
           ("std", {"dims": [0, 1], "correction": 0}, lambda t: torch.std(t, correction=0))]
    for op, attrs, fn in ops:
        xin = x if op in ("softmax", "log_softmax", "logsumexp") else torch.nan_to_num(x, posinf=7.0, neginf=-7.0, nan=1.0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            want = fn(xin)
        got = run(one_op(op, dt, shape, **attrs), {"x": _np(xin)}, mode)["o"]
        check(got, want, f"{op} {dt} {shape} [{mode}]", loose=4.0 if shape[1] > 1000 else 1.0)


@pytest.mark.parametrize("mode", MODES)
def test_var_mean_and_symbolic_sizes(mode):
    g = {"format": "segfuse.fusion/1", "name": "s", "inputs": [{"name": "x", "dtype": "float32", "shape": ["R", "N"]}],
         "ops": [{"op": "var_mean", "out": ["v", "m"], "inputs": ["x"], "dims": [1], "correction": 2, "keepdim": True},
                 {"op": "softmax", "out": "p", "inputs": ["x"], "dim": 0}],
         "outputs": ["v", "m", "p"]}
    for shape in ((5, 3000), (4, 1), (2, 0)):
        x = torch.randn(shape, generator=torch.Generator().manual_seed(1))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            v, m = torch.var_mean(x, [1], correction=2, keepdim=True)
        got = run(g, {"x": x.numpy()}, mode)
        check(got["v"], v, f"var {shape}", 4.0)
        check(got["m"], m, f"mean {shape}", 4.0)
        check(got["p"], torch.softmax(x, 0), f"softmax {shape}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dt", ["float32", "float16", "int64", "int8", "bool", "float64"])
@pytest.mark.parametrize("op", ["cummax", "cummin"])
def test_cummax_cummin(mode, dt, op):
    g = torch.Generator().manual_seed(2)
    for shape, dim in (((8, 5000), 1), ((300, 6), 0), ((), 0), ((4, 0), 1)):
        x = torch.randint(-3, 4, shape, generator=g).to(TORCH[dt])
        if dt in ("float32", "float16", "float64") and x.numel() > 20:
            flat = x.view(-1)
            flat[7], flat[11], flat[13] = float("nan"), float("inf"), float("nan")
        want = getattr(torch, op)(x, dim)
        got = run(one_op(op, dt, shape, n_out=2, dim=dim), {"x": _np(x)}, mode)
        check(got["o0"], want.values, f"{op} values {dt} {shape} [{mode}]")
        check(got["o1"], want.indices, f"{op} indices {dt} {shape} [{mode}]")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dt", ["float32", "int64", "bfloat16"])
def test_select(mode, dt):
    x = torch.randint(-9, 9, (4, 6, 5)).to(TORCH[dt])
    for dim, index in ((0, 2), (-1, -1), (1, 0)):
        got = run(one_op("select", dt, (4, 6, 5), dim=dim, index=index), {"x": _np(x)}, mode)["o"]
        check(got, torch.select(x, dim, index), f"select {dim} {index}")


def _scatter_graph(dt, bins_shape, idx_shape, dim, reduce, include_self, op="scatter", src_shape=None):
    src_shape = src_shape or idx_shape
    return {"format": "segfuse.fusion/1", "name": "sm",
            "inputs": [{"name": "s", "dtype": dt, "shape": list(bins_shape)},
                       {"name": "i", "dtype": "int64", "shape": list(idx_shape)},
                       {"name": "v", "dtype": dt, "shape": list(src_shape)}],
            "ops": [{"op": op, "out": "o", "inputs": ["s", "i", "v"], "dim": dim, "reduce": reduce,
                     "include_self": include_self}], "outputs": ["o"]}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dt", ["float32", "int64", "float16", "int32"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("bins, n", [(10, 64), (256, 1 << 20), (1 << 18, 1 << 16)])
def test_scatter_mean(mode, dt, include_self, bins, n):
    if mode == "block" and n > 8192:
        pytest.skip("one block: small sizes only")
    g = torch.Generator().manual_seed(3)
    s = torch.randint(-8, 9, (bins,), generator=g).to(TORCH[dt])
    i = torch.randint(0, bins, (n,), generator=g)
    i[:64] = 3  # a hot bin
    v = torch.randint(-8, 9, (n,), generator=g).to(TORCH[dt])
    want = s.double().scatter_reduce(0, i, v.double(), "mean", include_self=include_self) if dt == "float16" else \
        s.scatter_reduce(0, i, v, "mean", include_self=include_self)
    got = run(_scatter_graph(dt, (bins,), (n,), 0, "mean", include_self), {"s": _np(s), "i": i.numpy(), "v": _np(v)}, mode)
    check(got["o"], want.to(TORCH[dt]), f"scatter mean {dt} {bins}/{n} [{mode}]")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dt", ["float32", "int64", "float16", "bfloat16"])
@pytest.mark.parametrize("reduce", ["mul", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_index_reduce(mode, dt, reduce, include_self):
    g = torch.Generator().manual_seed(4)
    for rows, n, cols in ((6, 9, 5), (512, 100000, 8)):
        if mode == "block" and n > 1000:
            continue
        vals = torch.tensor([1, -1, 2, -2, 1, 1, 1, 1]) if reduce == "mul" else torch.arange(-6, 7)
        s = vals[torch.randint(0, len(vals), (rows, cols), generator=g)].to(TORCH[dt])
        v = vals[torch.randint(0, len(vals), (n, cols), generator=g)].to(TORCH[dt])
        i = torch.randint(0, rows, (n,), generator=g)
        if reduce == "mul":
            i = torch.randint(0, rows, (n,), generator=g) % 3 if n < 100 else torch.randint(0, rows, (n,), generator=g)
            v = torch.where(torch.rand(n, cols, generator=g) < 0.02, v, torch.ones((), dtype=v.dtype))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            wide = s.double().index_reduce(0, i, v.double(), {"mul": "prod"}.get(reduce, reduce), include_self=include_self)
        want = wide.floor().to(TORCH[dt]) if dt == "int64" else wide.to(TORCH[dt])
        graph = _scatter_graph(dt, (rows, cols), (n,), 0, reduce, include_self, op="index_reduce", src_shape=(n, cols))
        got = run(graph, {"s": _np(s), "i": i.numpy(), "v": _np(v)}, mode)
        check(got["o"], want, f"index_reduce {reduce} {dt} {rows}x{cols} <- {n} [{mode}]")


@pytest.mark.parametrize("mode", MODES)
def test_empty_index_of_another_rank(mode):
    x = torch.randn(3, 4)
    e = torch.zeros((2, 0, 5), dtype=torch.int64)
    g = {"format": "segfuse.fusion/1", "name": "e",
         "inputs": [{"name": "x", "dtype": "float32", "shape": [3, 4]}, {"name": "i", "dtype": "int64", "shape": [2, 0, 5]}],
         "ops": [{"op": "scatter", "out": "o", "inputs": ["x", "i", 1.0], "dim": 1, "reduce": "add"},
                 {"op": "scatter", "out": "m", "inputs": ["x", "i", 2.0], "dim": 0, "reduce": "mean"},
                 {"op": "gather", "out": "g", "inputs": ["x", "i"], "dim": 0},
                 {"op": "mul", "out": "o2", "inputs": ["o", 2]}],
         "outputs": ["o", "m", "g", "o2"]}
    got = run(g, {"x": x.numpy(), "i": e.numpy()}, mode)
    check(got["o"], x.scatter_add(1, e, torch.ones(2, 0, 5)), "scatter")
    check(got["m"], x.scatter_reduce(0, e, torch.full((2, 0, 5), 2.0), "mean"), "scatter mean")
    check(got["g"], x.gather(0, e), "gather")
    check(got["o2"], x * 2, "scatter * 2")


@pytest.mark.parametrize("op", ["scatter", "index_reduce"])
def test_bad_index_fails_the_run_naming_the_op(op):
    n = 4096
    i = np.zeros(n, np.int64)
    i[1000] = 77
    graph = _scatter_graph("float32", (16, 4) if op == "index_reduce" else (16,), (n,), 0, "mean", True, op=op,
                           src_shape=(n, 4) if op == "index_reduce" else (n,))
    ins = {"s": np.zeros((16, 4) if op == "index_reduce" else (16,), np.float32), "i": i,
           "v": np.ones((n, 4) if op == "index_reduce" else (n,), np.float32)}
    with pytest.raises(RunError, match=f"{op}: index 77 is out of bounds for dimension 0 with size 16"):
        run(graph, ins, "plan")
    ins["i"][1000] = 5
    assert run(graph, ins, "plan")["o"].shape[0] == 16  # the next run is fine
