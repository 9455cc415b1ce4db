"""`segfuse.torch.capture`: plain PyTorch functions traced with torch.export become segfuse graphs that
compute what eager PyTorch computes (the oracle: the same function run eagerly on the same inputs).
Covers the mechanism (naming, dynamic sizes, in-place updates, refusals) and the pointwise, cast,
creation and shape families; the graphs run on the NumPy backend and, from their JSON, on the service."""

from __future__ import annotations

import inspect
import warnings

import ml_dtypes
import numpy as np
import pytest

torch = pytest.importorskip("torch")
import segfuse.torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from segfuse.compiler import FusionDefinition  # noqa: E402
from segfuse.torch.capturing import CaptureError, unsupported_reason  # noqa: E402
from segfuse.torch.capturing.lowering import has_lowering  # noqa: E402
from torch.export import Dim  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")


def _leaves(x) -> list:
    return torch.utils._pytree.tree_leaves(x)


def _capture(fn, *xs, **kw) -> FusionDefinition:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return segfuse.torch.capture(fn, *xs, **kw)


def _run(fd: FusionDefinition, *xs) -> dict:
    names = [i["name"] for i in fd.to_dict()["inputs"]]
    return fd.execute({n: x.numpy() for n, x in zip(names, xs)})


def _assert_matches_eager(fn, fd: FusionDefinition, *xs) -> None:
    """fd on the NumPy backend equals fn run eagerly, output by output (exact for integers and bools)."""
    want = _leaves(fn(*[x.clone() for x in xs]))
    got = _run(fd, *[x.clone() for x in xs])
    assert len(got) == len(want)
    for (name, g), w in zip(got.items(), want):
        g = torch.from_numpy(np.array(g, order="C")) if g.dtype != ml_dtypes.bfloat16 else \
            torch.from_numpy(g.astype(np.float32)).to(torch.bfloat16)
        torch.testing.assert_close(g, w, msg=lambda m, name=name: f"{fn.__name__} output {name}: {m}")


def _line_of(fn, text: str) -> int:
    """The line of `fn`'s source that contains `text` (where a refusal must point)."""
    lines, first = inspect.getsourcelines(fn)
    return first + next(k for k, ln in enumerate(lines) if text in ln)


# ---- pointwise and casts -----------------------------------------------------------------------
def arithmetic(x, i):
    return (x + 2 * i, x - i, torch.add(x, i, alpha=3), torch.sub(x, i, alpha=2), torch.rsub(x, 3),
            x * i, x / (i.abs() + 1), x ** 2, 2 ** i.abs(), x.pow(i.abs()), i % 3, i // 3, torch.fmod(i, 4),
            torch.div(i, 3, rounding_mode="trunc"), torch.div(-i, 4, rounding_mode="trunc"),
            torch.div(i, 3, rounding_mode="floor"), torch.div(x, 0.7, rounding_mode="trunc"),
            torch.maximum(x, i), torch.minimum(x, i.float()), torch.atan2(x, x + 1))


def comparisons_and_logic(x, i):
    return (x > 0, x <= i, i == 2, i != 0, (x > 0) & (i > 0), (x > 0) | (i < 0), (x > 0) ^ (i > 0),
            torch.logical_and(x, i), torch.logical_not(i), ~i, i & 6, i | 1, i ^ 5, i << 2, i >> 1,
            torch.isnan(x / 0), torch.isinf(x / 0), torch.isfinite(x / 0))


def math_functions(x, i):
    return (torch.exp(x), torch.exp2(x), torch.expm1(x), torch.log(x.abs() + 1), torch.log2(x.abs() + 1),
            torch.log1p(x.abs()), torch.sqrt(x.abs()), torch.rsqrt(x.abs() + 1), torch.sin(x), torch.cos(x),
            torch.tanh(x), torch.sigmoid(x), torch.relu(x), torch.nn.functional.silu(x), torch.erf(x),
            torch.nn.functional.gelu(x), torch.nn.functional.gelu(x, approximate="tanh"), torch.floor(x * 3),
            torch.ceil(x * 3), torch.round(x * 3), torch.trunc(x * 3), torch.sign(x), torch.reciprocal(x + 5),
            torch.abs(i), -i, x.square(), torch.nn.functional.hardtanh(x), torch.lerp(x, x * 2, 0.3),
            torch.exp(i))


def selections_and_casts(x, i):
    return (torch.where(x > 0, x, 0.0), torch.where(i > 0, i, x), torch.clamp(x, -0.5, 0.5),
            torch.clamp(x, min=-0.5), torch.clamp(i, max=2), x.clamp_min(0.1), i.clamp_max(1),
            x.masked_fill(x > 0, 7.5), i.masked_fill(i > 0, 3.9), x.to(torch.int32), i.type_as(x), i.float(),
            x.half(), x.bool(), (i > 0).long(), x.to(torch.float64) * 3, i.to(torch.uint8), x.double().float())


@pytest.mark.parametrize("fn", [arithmetic, comparisons_and_logic, math_functions, selections_and_casts])
def test_pointwise_functions_match_eager(fn):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, generator=g)
    i = torch.randint(-5, 6, (4, 6), generator=g)
    _assert_matches_eager(fn, _capture(fn, x, i), x, i)


def reduced_precision(x, y):
    return x * y + 1.5, torch.exp(x), (x > y).to(torch.float16), x.float() / 3, x.to(torch.bfloat16) * 2, \
        torch.nn.functional.gelu(x, approximate="tanh")


def test_reduced_precision_pointwise_matches_eager():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8, 5, generator=g).half()
    y = torch.randn(5, generator=g).half()
    _assert_matches_eager(reduced_precision, _capture(reduced_precision, x, y), x, y)


def weak_scalars(x, i, b, s):
    # Python numbers do not widen a tensor's dtype; a 0-d tensor widens it only across categories
    return x * 2.5, i + 1, i * 0.5, b + 1, b * 2.5, i + s, x + s, i.to(torch.int64) + i


def test_scalar_promotion_follows_torch():
    x = torch.randn(3).half()
    i = torch.arange(3, dtype=torch.int16)
    b = torch.tensor([True, False, True])
    s = torch.tensor(1.25, dtype=torch.float64)
    _assert_matches_eager(weak_scalars, _capture(weak_scalars, x, i, b, s), x, i, b, s)


# ---- creation -----------------------------------------------------------------------------------
def creations(x):
    t = x.shape[0]
    return (torch.zeros(3, 2), torch.ones_like(x), torch.full((2,), 5), torch.full((t, 2), True),
            torch.arange(t), torch.arange(1, 10, 3), torch.arange(0.0, 1.0, 0.25), torch.arange(t * 2, dtype=torch.float32),
            torch.empty(3).fill_(2.0), torch.zeros_like(x, dtype=torch.int64), x.new_full((2, 2), 3.0),
            torch.scalar_tensor(3.5), torch.zeros(t, 3).zero_(), torch.empty_like(x).fill_(-1), x.new_zeros(t + 1),
            torch.ones(t, dtype=torch.int8) * 3)


def test_creation_functions_match_eager_at_every_size():
    fd = _capture(creations, torch.randn(4, 6), dynamic={"x": {0: "T"}})
    for t in (2, 5, 11):
        x = torch.randn(t, 6)
        _assert_matches_eager(creations, fd, x)


# ---- shapes -------------------------------------------------------------------------------------
def shapes(x):
    return (x.reshape(-1), x.view(-1, 3), x.permute(1, 0), x.t(), x.transpose(0, 1), x.unsqueeze(1).expand(-1, 3, 6),
            x[None].squeeze(0), x.unsqueeze(-1).squeeze(-1), torch.nn.functional.pad(x, (1, 2), value=9.0),
            torch.nn.functional.pad(x, (0, 0, 2, 0)), x[:, 1:4], x[1], x[:-1], x[..., ::2], x[x.shape[0] - 1],
            torch.cat([x, x * 2], 0), torch.cat([x, x[:, :2]], 1), torch.stack([x, x], 1), x.clone(), x.contiguous(),
            x.detach(), x.split(2, dim=1), x.unbind(1), x.chunk(3, 1), x.repeat(2, 1, 3), x.flatten(), x.narrow(1, 2, 3),
            x.unflatten(1, (2, 3)), x.movedim(0, 1), x.broadcast_to(2, x.shape[0], 6))


def test_shape_functions_match_eager_at_every_size():
    fd = _capture(shapes, torch.randn(4, 6), dynamic={"x": {0: "T"}})
    for t in (3, 4, 9):
        _assert_matches_eager(shapes, fd, torch.randn(t, 6))


def static_shapes(x, y):
    return x.unsqueeze(1).expand(4, 3, 6), x.unbind(0), x[2:3].squeeze(), x.view(3, 8), torch.cat([x, y]), \
        x.new_ones(2).copy_(y[0, :2])


def test_static_shape_functions_match_eager():
    x, y = torch.randn(4, 6), torch.randn(2, 6)
    _assert_matches_eager(static_shapes, _capture(static_shapes, x, y), x, y)


def writes_into_slices(x, v):
    y = x.clone()
    y[:, 0] = v                       # select_scatter (torch decomposes it: a where on an arange mask)
    y[1::2] = 0.5                     # slice_scatter with a step
    y[x.shape[0] - 2:, 1:] = -1.0     # a start that is a size, a write into a slice of a slice
    z = x.clone()
    z[-2:].copy_(v[:2, None])         # copy_ into a slice counted from the end
    z[..., :2] = 0
    return y, z


@pytest.mark.parametrize("dynamic", [None, {"x": {0: "T"}, "v": {0: "T"}}], ids=["static", "dynamic"])
def test_writes_into_slices_match_eager(dynamic):
    fd = _capture(writes_into_slices, torch.randn(6, 3), torch.randn(6), dynamic=dynamic)
    for t in ((6,) if dynamic is None else (2, 5, 8)):
        _assert_matches_eager(writes_into_slices, fd, torch.randn(t, 3), torch.randn(t))


def flips_and_rolls(x):
    return (torch.flip(x, (0, 1)), torch.flip(x, (-1,)), torch.roll(x, 1, 0), torch.roll(x, (1, -2), (0, 1)),
            torch.roll(x, 3), torch.roll(x, -7, 1), x.flipud())


@pytest.mark.parametrize("dynamic", [None, {"x": {0: "T"}}], ids=["static", "dynamic"])
def test_flip_and_roll_match_eager(dynamic):
    fd = _capture(flips_and_rolls, torch.randn(4, 3), dynamic=dynamic)
    for t in ((4,) if dynamic is None else (1, 3, 6)):
        _assert_matches_eager(flips_and_rolls, fd, torch.randn(t, 3))


def pads_and_rounds(x):
    # the registry's pad is a constant pad and its round has no decimals: these overloads are not
    # claimed by the generic rule, so torch decomposes the pads and capture lowers round(decimals=)
    return (F.pad(x, (1, 2), mode="reflect"), F.pad(x[None], (2, 1, 1, 0), mode="replicate"),
            F.pad(x[None], (1, 2), mode="circular"), F.pad(x, (1, 1), value=2.5), torch.round(x * 100, decimals=1),
            torch.round(x * 1000, decimals=-2), torch.round(x.half() * 10, decimals=2), torch.round(x, decimals=0))


def test_ops_the_registry_takes_in_part_are_decomposed_or_lowered_whole():
    assert not has_lowering(torch.ops.aten.pad.default)
    fd = _capture(pads_and_rounds, torch.randn(4, 6), dynamic={"x": {0: "T"}})
    for t in (1, 3, 7):
        _assert_matches_eager(pads_and_rounds, fd, torch.randn(t, 6))


# ---- constants fn makes ---------------------------------------------------------------------------
def writes_constants(x, w, i):
    y = x.clone()
    y[1] = 2.0                        # the value written: a 0-d constant torch.export lifts
    v = w.clone()
    v[v > 0] = 0.0                    # a masked write of one
    return (y, v, x + torch.tensor(3.0), x * torch.tensor([1.0, -2.0, 2.0, 2.0, 2.0, 0.5]),
            torch.tensor([[1, 2, 2], [3, 3, 3]], dtype=torch.int32) + i, torch.tensor([True, False] * 3) & (x > 0),
            torch.isnan(x * torch.tensor([float("nan"), 1.0] * 3)), 1 / (x * 0 + torch.tensor([-0.0, 0.0] * 3)))


def test_small_constants_fn_makes_are_written_into_the_graph():
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
    i = torch.randint(-5, 5, (2, 3), dtype=torch.int32, generator=g)
    fd = _capture(writes_constants, x, w, i)
    assert [inp["name"] for inp in fd.to_dict()["inputs"]] == ["x", "w", "i"]
    _assert_matches_eager(writes_constants, fd, x, w, i)


def writes_constant_rows(x):
    y = x.clone()
    y[0] = 2.0
    y[:, -1] = torch.tensor(7.5)
    y[y < -1] = 0.0
    return y


def test_constant_writes_serve_every_size():
    fd = _capture(writes_constant_rows, torch.randn(4, 3), dynamic={"x": {0: "T"}})
    for t in (1, 3, 8):
        _assert_matches_eager(writes_constant_rows, fd, torch.randn(t, 3))


# ---- dynamic sizes ------------------------------------------------------------------------------
def computes_with_sizes(x, rows, i):
    t = x.shape[0]
    return (x / t, rows - t, torch.arange(t) * 2 + t * x.shape[1], x * (t // 2), i * t, i / t, x * (t / 3),
            i + t / 3, torch.full((2,), t), torch.tensor(t) + x, torch.where(x > 0, x, t), torch.clamp(x * 10, max=t),
            torch.arange(t, 2 * t), x + (t - 1) % t, (x > 0) + t, x.masked_fill(x > 0, t), x.new_tensor(t) * x)


def test_sizes_used_as_numbers_follow_torch_at_every_size():
    g = torch.Generator().manual_seed(4)

    def inputs(t):
        return (torch.randn(t, 3, generator=g), torch.arange(3) * 7,
                torch.randint(-9, 9, (t, 3), dtype=torch.int32, generator=g))

    fd = _capture(computes_with_sizes, *inputs(4), dynamic={"x": {0: "T"}, "i": {0: "T"}})
    for t in (1, 2, 5, 9):
        _assert_matches_eager(computes_with_sizes, fd, *inputs(t))


# ---- dynamic sizes ------------------------------------------------------------------------------
def flatten_and_count(topk_ids, weights):
    flat = topk_ids.reshape(-1)
    pos = torch.arange(flat.shape[0]) * 2
    return {"flat": flat + 1, "pos": pos, "scaled": weights.view(-1) * (flat % 3).to(weights.dtype)}


def test_one_capture_serves_every_size_and_names_the_symbols():
    fd = _capture(flatten_and_count, torch.randint(0, 8, (6, 4)), torch.rand(6, 4),
                  dynamic={"topk_ids": {0: "T"}, "weights": {0: "T"}})
    spec = fd.to_dict()
    assert [(i["name"], i["shape"]) for i in spec["inputs"]] == [("topk_ids", ["T", 4]), ("weights", ["T", 4])]
    types = fd.fusion().types
    assert str(types["flat"]) == "int64[4*T]" and str(types["pos"]) == "int64[4*T]"
    for t in (2, 3, 17):
        args = torch.randint(0, 8, (t, 4)), torch.rand(t, 4)
        _assert_matches_eager(flatten_and_count, fd, *args)


def test_a_capture_from_one_token_serves_every_size():
    # (torch.export specializes a dim whose example is 0 or 1 unless told otherwise: a decode step's T = 1)
    fd = _capture(flatten_and_count, torch.randint(0, 8, (1, 4)), torch.rand(1, 4),
                  dynamic={"topk_ids": {0: "T"}, "weights": {0: "T"}})
    assert [i["shape"] for i in fd.to_dict()["inputs"]] == [["T", 4], ["T", 4]]
    for t in (1, 2, 9):
        _assert_matches_eager(flatten_and_count, fd, torch.randint(0, 8, (t, 4)), torch.rand(t, 4))


def two_sizes(x, y):
    return torch.cat([x, y]) * 2, x + 1


@pytest.mark.parametrize("dynamic, names", [
    ({"x": {0: Dim("rows")}, "y": {0: Dim("more")}}, ["rows", "more"]),  # torch.export.Dim: its name
    ({"x": {0: Dim.DYNAMIC}, "y": {0: Dim.AUTO}}, ["x_0", "y_0"]),      # unnamed: parameter_dim
    (({0: "A"}, {0: "B"}), ["A", "B"]),                                 # a tuple in parameter order
    ({"x": (None, "C"), "y": [None, "C"]}, [3, 3]),                     # per-dim lists; one name, one symbol
])
def test_dynamic_dims_become_named_size_symbols(dynamic, names):
    x, y = torch.randn(4, 3), torch.randn(5, 3)
    fd = _capture(two_sizes, x, y, dynamic=dynamic)
    shapes = [i["shape"] for i in fd.to_dict()["inputs"]]
    if isinstance(names[0], str):
        assert [s[0] for s in shapes] == names
        _assert_matches_eager(two_sizes, fd, torch.randn(7, 3), torch.randn(2, 3))
    else:
        assert shapes == [[4, "C"], [5, "C"]]
        _assert_matches_eager(two_sizes, fd, torch.randn(4, 6), torch.randn(5, 6))


def test_sizes_derived_from_a_fresh_symbol_evaluate_to_pytorchs_sizes():
    # a graph's input of PyTorch's size 2*s0 + 1 gets a symbol of its own, and sizes PyTorch writes
    # with s0 are written with that symbol, exactly (what torch.compile's subgraphs need)
    import sympy
    from segfuse.compiler.shapes import evaluate, parse_size
    from segfuse.torch.capturing.sizes import SizeNames
    from torch.utils._sympy.functions import FloorDiv

    s0, s1 = sympy.symbols("s0 s1", integer=True, positive=True)
    sizes = SizeNames({"s1": "x_0"})
    assert sizes.fresh(2 * s0 + 1, "in0_0") == "in0_0" and sizes.fresh(2 * s0 + 1, "other") == "in0_0"
    for expr, value in [(4 * s0 + 2, lambda a, b: 4 * a + 2), (s0, lambda a, b: a), (s0 + s1, lambda a, b: a + b),
                        (FloorDiv(s0, 3) * 2, lambda a, b: a // 3 * 2), (6 * s0 * s1, lambda a, b: 6 * a * b)]:
        text = sizes.size(expr)
        for a in (1, 2, 5, 8):
            for b in (1, 3):
                assert evaluate(parse_size(text), {"in0_0": 2 * a + 1, "x_0": b}) == value(a, b), (expr, text)


# ---- names and in-place updates --------------------------------------------------------------------
def test_inputs_are_named_after_parameters_and_outputs_after_dict_keys():
    def fn(hidden, scale, k):
        return {"out": hidden * scale, "hidden": hidden + k}

    fd = _capture(fn, torch.randn(3), torch.randn(3), 2)
    spec = fd.to_dict()
    assert [i["name"] for i in spec["inputs"]] == ["hidden", "scale"]  # k (a number) is a constant of the trace
    assert spec["outputs"] == ["out", "hidden_out"]  # a key naming an input is suffixed

    def plain(a, b):
        return a + b, a - b, a

    spec = _capture(plain, torch.randn(2), torch.randn(2)).to_dict()
    assert spec["outputs"] == ["output_0", "output_1", "output_2"]
    x, y = torch.randn(2), torch.randn(2)
    _assert_matches_eager(plain, _capture(plain, x, y), x, y)


def keys_like_builder_names(x):
    return {"t1": x + 1, "t0": x * 2, "o": (x + 1) * 3}


def test_outputs_take_their_keys_even_where_the_builder_used_the_name():
    x = torch.randn(4)
    fd = _capture(keys_like_builder_names, x)
    assert fd.to_dict()["outputs"] == ["t1", "t0", "o"]
    _assert_matches_eager(keys_like_builder_names, fd, x)


def add_in_place(x, y):
    x.add_(y * 2)
    return x.clamp(max=1.0) * 3


def mutate_and_return(x, y):
    x.masked_fill_(y > 0, 0.0)
    return {"x_new": x, "y2": y * 2}


def test_an_updated_input_becomes_an_output_aliasing_it():
    x, y = torch.randn(5), torch.randn(5)
    fd = _capture(add_in_place, x.clone(), y)
    assert fd.to_dict()["outputs"] == ["output_0", {"name": "x_updated", "alias_of": "x"}]
    eager_x = x.clone()
    want = add_in_place(eager_x, y)
    xs = x.numpy().copy()
    got = fd.execute({"x": xs, "y": y.numpy()})
    torch.testing.assert_close(torch.from_numpy(got["output_0"]), want)
    torch.testing.assert_close(torch.from_numpy(xs), eager_x)  # the input's buffer holds the update

    fd = _capture(mutate_and_return, x.clone(), y)
    assert fd.to_dict()["outputs"] == [{"name": "x_new", "alias_of": "x"}, "y2"]  # returned once, under its key
    op = segfuse.torch.fusion(fd)
    mine, eager_x = x.clone(), x.clone()
    mutate_and_return(eager_x, y)
    op(mine, y)
    torch.testing.assert_close(mine, eager_x)


# ---- refusals -------------------------------------------------------------------------------------
def uses_nonzero(x):
    y = x * 2
    return torch.nonzero(y)


def branches_on_data(x):
    if x.sum() > 0:
        return x + 1
    return x - 1


def takes_kth_values(x):
    return torch.kthvalue(x, 2, 0).values + 1


def reads_a_large_constant(x):
    return x + _LARGE_CONSTANT


_LARGE_CONSTANT = torch.arange(65.0)  # (segfuse writes constants of up to 64 elements into a graph)


def slices_by_size(x):
    return x.reshape(-1)[: x.shape[0] * 2]


@pytest.mark.parametrize("fn, arg, dynamic, op, text, alternative", [
    (uses_nonzero, torch.randn(3), None, "aten.nonzero.default", "torch.nonzero(y)", None),
    (branches_on_data, torch.randn(3), None, "data-dependent control flow", "if x.sum() > 0", "torch.where"),
    (takes_kth_values, torch.randn(3), None, "aten.kthvalue.default", "torch.kthvalue", "torch.sort"),
    (slices_by_size, torch.randn(4, 3), {"x": {0: "T"}}, "aten.slice.Tensor", "x.reshape(-1)[", "minus a number"),
])
def test_unsupported_code_is_refused_with_op_location_and_alternative(fn, arg, dynamic, op, text, alternative):
    with pytest.raises(CaptureError) as e:
        _capture(fn, arg, dynamic=dynamic)
    err = e.value
    where = f"{__file__}:{_line_of(fn, text)}"
    assert err.op == op and err.location == where
    assert op in str(err) and where in str(err)
    if alternative is None:
        assert err.alternative is None
    else:
        assert alternative in err.alternative and alternative in str(err)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.float8_e4m3fn, torch.uint16])
def test_unsupported_dtypes_are_refused(dtype):
    def plain(x):
        return x * 1

    x = torch.zeros(3).to(dtype)
    with pytest.raises(CaptureError) as e:
        _capture(plain, x)
    assert e.value.op == "input x" and str(dtype) in str(e.value) and "float32" in e.value.alternative


def test_a_large_tensor_fn_does_not_take_is_refused():
    with pytest.raises(CaptureError) as e:
        _capture(reads_a_large_constant, torch.randn(65))
    assert "not one of its arguments" in str(e.value) and "argument" in e.value.alternative
    assert "65 elements" in str(e.value)


def test_unsupported_reason_answers_per_node_without_building():
    def mixed(x):
        return torch.kthvalue(x, 2).values, x.exp() + 1

    ep = torch.export.export(segfuse.torch.capturing._Traced(mixed), (torch.randn(4),), strict=True)
    ep = ep.run_decompositions(segfuse.torch.capturing.decompositions())
    reasons = {str(n.target): unsupported_reason(n) for n in ep.graph.nodes if n.op == "call_function"}
    assert "aten.kthvalue.default" in reasons["aten.kthvalue.default"]
    assert reasons["aten.exp.default"] is None and reasons["aten.add.Tensor"] is None


def test_segfuse_torch_capture_is_the_function():
    assert segfuse.torch.capture.__module__ == "segfuse.torch" and callable(segfuse.torch.capture)
    fd = _capture(lambda a: a * 2, torch.ones(2))
    assert fd.name == "_lambda_" and isinstance(fd, FusionDefinition)


# ---- the captured JSON on the service ---------------------------------------------------------------
def routing(topk_ids, hidden):
    flat = topk_ids.reshape(-1)
    hidden.mul_(2)
    pos = torch.arange(flat.shape[0]).view(topk_ids.shape)
    return {"shifted": (flat + 1) * 3, "pos": pos, "masked": torch.where(topk_ids > 2, hidden, 0.0)}


def test_the_captured_json_registers_and_runs_on_the_service():
    from helpers.servers import LiveServer
    from segfuse.client import Buffer, Client

    fd = _capture(routing, torch.randint(0, 8, (5, 4)), torch.randn(5, 4),
                  dynamic={"topk_ids": {0: "T"}, "hidden": {0: "T"}})
    server = LiveServer(backend="numpy").start()
    try:
        with Client(server.url) as c:
            ref = c.register(fd.to_json())
            for t in (3, 8):
                ids, hidden = torch.randint(0, 8, (t, 4)), torch.randn(t, 4)
                eager_hidden = hidden.clone()
                want = routing(ids, eager_hidden)
                c.put("hidden", hidden.numpy())  # an input updated in place lives in a stored buffer
                res = c.run(ref, inputs={"topk_ids": ids.numpy(), "hidden": Buffer("hidden")})
                for k in ("shifted", "pos", "masked"):
                    torch.testing.assert_close(torch.from_numpy(np.asarray(res[k])), want[k])
                torch.testing.assert_close(torch.from_numpy(c.get("hidden")), eager_hidden)
    finally:
        server.stop()
