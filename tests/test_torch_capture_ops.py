"""segfuse.torch.capture on the scatter, index, sort, scan, reduction and normalization families:
plain PyTorch functions captured, their graphs run from the JSON on the NumPy backend (the plan
with its real buffer aliasing) and, for a few, through segfuse.torch.fusion on CPU tensors, against
eager PyTorch on the same inputs (exact for integers and bools, assert_close for floats)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from segfuse.compiler import Fusion, load_fusion
from segfuse.compiler.engine import Engine
from segfuse.torch import capture, fusion
from segfuse.torch.capturing import CaptureError
from segfuse.torch.convert import from_numpy, to_numpy
from torch.utils._pytree import tree_leaves
from torch_graphs import E, K, prologue_graph, torch_prologue

gen = torch.Generator().manual_seed(0)


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=gen).to(dtype)


def randint(lo, hi, *shape, dtype=torch.int64):
    return torch.randint(lo, hi, shape, generator=gen).to(dtype)


def run_numpy(fd, *tensors) -> list[torch.Tensor]:
    """The captured graph, read back from its JSON (what a service registers), run on the NumPy
    backend; its outputs in order."""
    f = load_fusion(fd.to_json())
    res = Engine.default("numpy").run(f, {n: to_numpy(t.clone()) for n, t in zip(f.input_names, tensors)}).outputs
    return [from_numpy(res[o.name]) for o in f.outputs]


def assert_same(got, want) -> None:
    want = tree_leaves(want)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert (g.dtype, g.shape) == (w.dtype, w.shape)
        if w.dtype in (torch.float16, torch.bfloat16):
            # torch's CPU kernels round some intermediates of these dtypes; segfuse rounds once from
            # float32: one unit in the last place apart
            torch.testing.assert_close(g, w, equal_nan=True, rtol=2 * torch.finfo(w.dtype).eps, atol=1e-5)
        elif w.dtype.is_floating_point:
            torch.testing.assert_close(g, w, equal_nan=True)
        else:
            assert torch.equal(g, w), (g, w)


def check(fn, *inputs, dynamic=None):
    """Capture fn on inputs, run the graph, compare with fn itself; returns the definition."""
    fd = capture(fn, *inputs, dynamic=dynamic)
    assert_same(run_numpy(fd, *inputs), fn(*[t.clone() for t in inputs]))
    return fd


# ---- scatter ---------------------------------------------------------------------------
def scatter_add(x, index, src):
    return x.scatter_add(0, index, src)


def scatter_add_inner_dim(x, index, src):
    return x.scatter_add(1, index, src)  # index narrower than x and src along dim 0


def scatter_src_and_value(x, index, src):
    return x.scatter(0, index, src), x.scatter(0, index, 2.5), x.scatter(0, index, src, reduce="multiply")


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_scatter_add_with_duplicate_indices_matches_torch(dtype):
    x, src = randn(5, 4).mul(4).to(dtype), randn(9, 4).mul(4).to(dtype)
    check(scatter_add, x, randint(0, 5, 9, 4), src)
    check(scatter_add_inner_dim, x, randint(0, 4, 3, 2), src)


def test_scatter_src_value_and_reduce_forms_match_torch():
    # one write per target (the last write of duplicates is unspecified in PyTorch)
    index = torch.argsort(randn(5, 4), 0)[:3]
    check(scatter_src_and_value, randn(5, 4), index, randn(3, 4))


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
def test_scatter_reduce_matches_torch(reduce, include_self, dtype):
    def scatter_reduce(x, index, src):
        return x.scatter_reduce(1, index, src, reduce, include_self=include_self)

    x, src = randn(4, 6).mul(5).to(dtype), randn(4, 9).mul(5).to(dtype)
    check(scatter_reduce, x, randint(0, 6, 4, 9), src)


def test_scatter_whose_input_is_read_again_is_not_updated_in_place():
    def read_again(x, index, src):
        y = x.scatter_add(0, index, src)
        t = x * 3
        u = t.scatter(0, index[:2], src[:2])  # t, an intermediate, read again below
        return y, x + y, u + t

    check(read_again, randn(6, 3), randint(0, 6, 8, 3), randn(8, 3))


def test_in_place_scatter_of_an_input_read_before_and_after():
    def in_place(x, index, src):
        before = x * 2
        x.scatter_add_(0, index, src)
        return before + x

    x, index, src = randn(6, 3), randint(0, 6, 8, 3), randn(8, 3)
    fd = capture(in_place, x, index, src)
    want_x = x.clone()
    want = in_place(want_x, index, src)
    got_x = x.clone()
    got, updated = fusion(fd)(got_x, index, src)
    torch.testing.assert_close(got, want)
    assert updated is got_x
    torch.testing.assert_close(got_x, want_x)  # the input, updated in place (alias_of)


# ---- index_add, index_reduce, index_put ----------------------------------------------------
def index_add(x, index, source):
    return x.index_add(0, index, source, alpha=2), x.index_add(1, index[:3], source[:5, :3])


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64])
def test_index_add_matches_torch(dtype):
    check(index_add, randn(5, 6).mul(4).to(dtype), randint(0, 5, 7), randn(7, 6).mul(4).to(dtype))


@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_index_reduce_matches_torch(reduce, include_self):
    def index_reduce(x, index, source):
        return x.index_reduce(0, index, source, reduce, include_self=include_self)

    check(index_reduce, randn(5, 3), randint(0, 5, 8), randn(8, 3))


def index_put_accumulate(x, index, values):
    y = x.clone()
    y.index_put_((index,), values, accumulate=True)
    return y


def index_put_forms(x, index, values):
    y = x.clone()
    y[index] = values  # one write per row (the index is unique)
    z = x.clone()
    z[:, index[:2]] = torch.full((), 3.0)  # a dim other than the first
    w = x.clone()
    w[x > 0] = torch.zeros(())  # a boolean mask with one value
    u = x.clone()
    u[index[:2]] += 1.0  # index, add, index_put
    v = x.clone()
    v[:, index[:2]] = x[:, :2] * 2  # a dim other than the first, a value per element
    return y, z, w, u, v


def test_index_put_with_accumulate_adds_duplicates():
    index = torch.tensor([0, 3, 3, -1, 0, 3])  # duplicates, and a negative index
    check(index_put_accumulate, randn(5, 4), index, randn(6, 4))
    check(index_put_accumulate, randint(-9, 9, 5, 4), index, randint(-9, 9, 6, 4))
    check(index_put_accumulate, randn(5, 4), index.view(2, 3), randn(4))  # a 2-d index, values broadcast


def test_index_put_forms_match_torch():
    check(index_put_forms, randn(5, 4), torch.tensor([3, -4, 2, 0]), randn(4, 4))


def test_index_put_accumulate_on_an_input_updates_it_in_place():
    def accumulate_into(x, index, values):
        x.index_put_((index,), values, accumulate=True)
        return x

    x, index, values = randn(5, 4), torch.tensor([1, 1, 4, 1]), randn(4, 4)
    want = accumulate_into(x.clone(), index, values)
    got_x = x.clone()
    fusion(capture(accumulate_into, x, index, values))(got_x, index, values)
    torch.testing.assert_close(got_x, want)


# ---- gathers -------------------------------------------------------------------------------
def gathers(x, index, rows):
    return (torch.gather(x, 1, index), torch.take_along_dim(x, index - 6, 1), torch.take_along_dim(x, rows),
            x.index_select(0, rows), x.index_select(1, rows[:2]))


def advanced_indexing(x, rows):
    return x[rows], x[rows - 5], x[rows.view(2, 2)], x[:, rows[:3]], x[..., rows[:2] % 2], x[rows][:, rows[:2]]


def test_gather_take_along_dim_and_index_select_match_torch():
    check(gathers, randn(5, 6), randint(0, 6, 5, 3), torch.tensor([4, 0, 2, 2]))


def test_gather_with_sparse_grad_matches_torch():
    # sparse_grad changes only the layout of a gradient: the forward values are gather's
    def fn(x, index):
        return torch.gather(x, 1, index, sparse_grad=True)

    check(fn, randn(4, 5), randint(0, 5, 4, 3))


def test_advanced_indexing_with_one_index_tensor_matches_torch():
    check(advanced_indexing, randn(5, 6, 2), torch.tensor([4, 0, 2, 2]))


def test_indexing_along_a_dynamic_dim_counts_negative_indices_from_its_size():
    def pick(x, rows):
        return x[rows], x[:, rows[:2] % 3]

    fd = capture(pick, randn(6, 3), torch.tensor([0, -5]), dynamic={"x": {0: "T"}})
    assert fd.to_dict()["inputs"][0]["shape"] == ["T", 3]
    for t in (3, 8):
        x, rows = randn(t, 3), randint(-t, t, 2)
        assert_same(run_numpy(fd, x, rows), pick(x, rows))


def put_two_index_tensors(x, i):
    y = x.clone()
    y[i, i] = torch.ones(())
    return y


@pytest.mark.parametrize("fn, op, alternative", [
    (lambda x, i: x[i, i], "aten.index.Tensor", "linear index"),
    (put_two_index_tensors, "aten.index_put.default", "linear index"),
    (lambda x, i: x[x > 0], "aten.index.Tensor", "torch.where"),
], ids=["two_index_tensors", "put_with_two_index_tensors", "boolean_mask_read"])
def test_indexing_segfuse_cannot_express_is_refused_with_the_way_to_write_it(fn, op, alternative):
    def index_it(x, i):
        return fn(x, i)

    with pytest.raises(CaptureError) as e:
        capture(index_it, randn(4, 4), torch.tensor([1, 2]))
    assert e.value.op == op
    assert alternative in e.value.alternative
    assert e.value.location is not None and "test_torch_capture_ops.py:" in e.value.location


def test_masked_put_of_several_values_is_refused():
    def put(x, values):
        y = x.clone()
        y[x > 0] = values
        return y

    with pytest.raises(CaptureError) as e:
        capture(put, randn(4), randn(4))
    assert e.value.op == "aten.index_put.default" and "torch.where" in e.value.alternative


# ---- sort, argsort, topk -------------------------------------------------------------------
def sorts(x):
    return (torch.sort(x, -1), torch.sort(x, dim=0, descending=True), torch.argsort(x, 1),
            torch.topk(x, 3), torch.topk(x, 2, dim=0, largest=False), torch.msort(x), torch.topk(x, 4, sorted=False))


def assert_sorted_like_torch(got_values, got_indices, want_values, x, dim):
    """Values equal torch's; indices pick those values out of x (ties may come in any order)."""
    assert torch.equal(got_values, want_values)
    assert torch.equal(torch.gather(x, dim, got_indices), got_values)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32])
def test_sort_argsort_topk_match_torch(dtype):
    x = randint(-3, 4, 6, 8).to(dtype)  # many ties
    fd = capture(sorts, x)
    g = run_numpy(fd, x)
    w = tree_leaves(sorts(x))
    assert_sorted_like_torch(g[0], g[1], w[0], x, -1)
    assert_sorted_like_torch(g[2], g[3], w[2], x, 0)
    assert torch.equal(torch.gather(x, 1, g[4]), torch.sort(x, 1).values)
    assert_sorted_like_torch(g[5], g[6], w[5], x, -1)
    assert_sorted_like_torch(g[7], g[8], w[7], x, 0)
    assert torch.equal(g[9], w[9])
    assert torch.equal(g[10].sort(-1).values, w[10].sort(-1).values)  # (sorted=False: any order)
    assert torch.equal(torch.gather(x, -1, g[11]), g[10])


def test_stable_sorts_keep_ties_in_input_order_like_torch():
    def stable(x):
        return (torch.argsort(x, stable=True), torch.argsort(x, dim=0, descending=True, stable=True),
                torch.sort(x, stable=True, descending=True))

    check(stable, randint(0, 3, 5, 9))


@pytest.mark.parametrize("fn, op, alternative", [
    (lambda x: x.median(1).values, "aten.median.dim", "torch.sort"),
    (lambda x: torch.logcumsumexp(x, 1), "aten.logcumsumexp.default", "torch.cumsum"),
    (lambda x: torch.linalg.vector_norm(x, dim=1), "aten.linalg_vector_norm.default", ".sum(dim).sqrt()"),
], ids=["median", "logcumsumexp", "vector_norm"])
def test_ops_segfuse_lacks_are_refused_with_the_nearest_supported_form(fn, op, alternative):
    def uses_it(x):
        return fn(x)

    with pytest.raises(CaptureError) as e:
        capture(uses_it, randn(4, 6))
    assert e.value.op == op and alternative in e.value.alternative
    assert "test_torch_capture_ops.py:" in e.value.location


# ---- scans -------------------------------------------------------------------------------
def scans(x):
    return (torch.cumsum(x, 1), torch.cumprod(x, 0), torch.cummax(x, 1), torch.cummin(x, 0),
            torch.cumsum(x, 0, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.bool])
def test_scans_match_torch(dtype):
    x = randint(-2, 3, 4, 6).to(dtype)  # ties for cummax/cummin (a tie takes the later position)
    if dtype is torch.float32:
        x = x + randn(4, 6).round(decimals=1) * (randn(4, 6) > 0)
    check(scans, x)


# ---- reductions --------------------------------------------------------------------------
def reductions(x):
    return (x.sum(), x.sum(1), x.sum((0, 2), keepdim=True, dtype=torch.float64), x.mean(-1), x.mean((0, 1)),
            x.amax(0), x.amin((1, 2), keepdim=True), x.max(), x.min(), x.max(1), x.min(2, keepdim=True),
            x.prod(1), x.argmax(), x.argmin(1, keepdim=True), torch.maximum(x, -x), x.max(x * 0.5))


def integer_reductions(x):
    return (x.sum(), x.sum(0), x.prod(1), x.amax(1), x.max(0), x.argmin(1), x.any(1), x.all(), (x > 0).sum(1),
            x.bool().all(0), x.to(torch.uint8).any(0), x.mean(1, dtype=torch.float32), x.sum(1, dtype=torch.int32),
            (x > 0).max(1))


def test_float_reductions_match_torch():
    x = randn(3, 4, 5)
    x[1, 2, 3] = x[1, 2, 0] = x.max() + 1  # a tie for argmax: the first position
    check(reductions, x)


def test_integer_and_bool_reductions_match_torch():
    check(integer_reductions, randint(-2, 3, 4, 5, dtype=torch.int32))


def test_nan_propagates_through_reductions_sorts_and_scans_as_in_torch():
    def with_nan(x):
        return (x.max(1), x.min(1), x.argmax(1), x.amin(1), x.max(), x.sum(1), torch.sort(x, dim=1, stable=True),
                torch.topk(x, 2).values, x.cummax(1), x.cummin(1), torch.softmax(x, 1))

    check(with_nan, torch.tensor([[1.0, float("nan"), 3.0, float("nan")], [2.0, 2.0, 0.0, -1.0]]))


def test_any_all_of_floats_count_nan_as_true():
    def logical(x):
        return x.any(0), x.all(0), x.any(), x.all()

    x = torch.tensor([[0.0, float("nan"), 0.0], [0.0, 1.0, -2.0]])
    check(logical, x)


def test_reduction_over_a_dynamic_dim_matches_torch_at_each_size():
    def stats(x):
        return x.sum(0), x.mean(0), x.var(0), x.amax(0), torch.softmax(x, 0), x.cumsum(0)

    fd = capture(stats, randn(5, 3), dynamic={"x": {0: "T"}})
    for t in (1, 4, 9):
        x = randn(t, 3)
        assert_same(run_numpy(fd, x), stats(x))


# ---- var, std ----------------------------------------------------------------------------
def variances(x):
    return (x.var(1), x.var(), x.var(0, unbiased=False), torch.var(x, (0, 1), correction=2, keepdim=True),
            x.std(1), x.std(0, correction=0), torch.var_mean(x, 1, keepdim=True), torch.std_mean(x, 0),
            torch.var_mean(x, correction=0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_var_std_var_mean_match_torch(dtype):
    check(variances, randn(4, 7, dtype=dtype))


# ---- softmax, log_softmax, logsumexp -------------------------------------------------------
def softmaxes(x):
    return (torch.softmax(x, -1), F.log_softmax(x, 0), torch.logsumexp(x, 1), torch.logsumexp(x, (0, 1), keepdim=True),
            torch.softmax(x, 1, dtype=torch.float64), torch.softmax(x.half(), 1, dtype=torch.float32))


def masked_softmax(scores, mask):
    return scores.masked_fill(~mask, float("-inf")).softmax(-1)


def test_softmax_log_softmax_logsumexp_match_torch():
    check(softmaxes, randn(4, 6) * 4)


def logsumexp_of_every_dim(x):
    # an empty dim list reduces every dim and keeps them (PyTorch's shape: [1, 1])
    return torch.logsumexp(x, dim=(), keepdim=True), torch.logsumexp(x.long(), dim=[], keepdim=True)


def test_logsumexp_of_an_empty_dim_list_matches_torch():
    check(logsumexp_of_every_dim, randn(4, 6) * 4)


def test_logsumexp_of_an_empty_dim_list_without_keepdim_is_refused_like_torch():
    def fn(x):
        return torch.logsumexp(x, dim=())

    x = randn(3, 4)
    with pytest.raises(RuntimeError):
        fn(x)  # (PyTorch's own kernel fails on it)
    with pytest.raises(CaptureError) as e:
        capture(fn, x)
    assert e.value.op == "aten.logsumexp.default" and "keepdim" in str(e.value)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reduced_precision_softmax_rounds_once_from_float32(dtype):
    # the oracle is torch in float32, rounded once (torch's CUDA kernels); its CPU kernels round
    # intermediates of these dtypes, which segfuse does not
    def softmaxes_of(x):
        return torch.softmax(x, -1), F.log_softmax(x, 0), torch.logsumexp(x, 1)

    x = randn(8, 6, dtype=dtype) * 4
    want = [w.to(dtype) for w in softmaxes_of(x.float())]
    assert_same(run_numpy(capture(softmaxes_of, x), x), want)


def test_masked_softmax_matches_torch_including_a_fully_masked_row():
    mask = randn(5, 7) > 0
    mask[0] = True
    mask[3] = False  # every position masked: NaN, as in PyTorch
    fd = check(masked_softmax, randn(5, 7), mask)
    got = run_numpy(fd, randn(5, 7), mask)[0]
    assert got[3].isnan().all() and not got[0].isnan().any()


# ---- normalizations --------------------------------------------------------------------------
def rms_norm(x, w, eps: float = 1e-6):
    """RMSNorm as users write it (Llama's): in float32, rounded back to the input's dtype."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)


def layer_norm_by_hand(x, w, b, eps: float = 1e-5):
    xf = x.float()
    mu = xf.mean(-1, keepdim=True)
    return ((xf - mu) * torch.rsqrt(xf.var(-1, keepdim=True, unbiased=False) + eps) * w + b).to(x.dtype)


def norms(x, w, b):
    return (F.layer_norm(x, (x.shape[-1],), w, b, 1e-5), F.layer_norm(x, x.shape[-2:]), rms_norm(x, w),
            F.rms_norm(x, (x.shape[-1],), w, 1e-6), F.rms_norm(x, (x.shape[-1],)), layer_norm_by_hand(x, w, b))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_norm_and_rms_norm_as_users_write_them_match_torch(dtype):
    x, w, b = randn(3, 4, 16, dtype=dtype) * 3, randn(16, dtype=dtype), randn(16, dtype=dtype)
    check(norms, x, w, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_statistics_match_torch(dtype):
    def statistics(x, w, b):  # (out, mean, rstd) and (out, rstd), as autograd's forward keeps them
        return torch.ops.aten.native_layer_norm(x, [16], w, b, 1e-5), torch.ops.aten._fused_rms_norm(x, [16], w, 1e-6)

    check(statistics, randn(5, 16, dtype=dtype) * 3, randn(16, dtype=dtype), randn(16, dtype=dtype))


def test_captured_rms_norm_runs_as_a_torch_op_at_each_row_count():
    w = randn(32, dtype=torch.bfloat16)
    norm = fusion(capture(rms_norm, randn(8, 32, dtype=torch.bfloat16), w, dynamic={"x": {0: "R"}}))
    for rows in (1, 8, 13):
        x = randn(rows, 32, dtype=torch.bfloat16)
        torch.testing.assert_close(norm(x, w), rms_norm(x, w))


# ---- the MoE routing prologue ---------------------------------------------------------------
def test_moe_prologue_captured_once_runs_at_every_token_count():
    fd = capture(torch_prologue, randint(0, E, 5, K), dynamic={"ids": {0: "T"}})
    assert fd.to_dict()["inputs"] == [{"name": "ids", "dtype": "int64", "shape": ["T", K]}]
    for t in (1, 2, 37, 64):
        ids = randint(0, E, t, K)
        assert_same(run_numpy(fd, ids), torch_prologue(ids))
    prologue = fusion(fd)
    ids = randint(0, E, 19, K)
    assert_same(list(prologue(ids)), torch_prologue(ids))


def test_captured_moe_prologue_plans_the_kernels_of_the_hand_written_graph():
    captured = load_fusion(capture(torch_prologue, randint(0, E, 5, K), dynamic={"ids": {0: "T"}}).to_json())
    by_hand = Fusion.from_json(prologue_graph("int64"))
    engine = Engine.default("numpy")
    for t in (1, 64, 2500):  # one block; a grid and the library sort
        assert engine.plan(captured, {"ids": (t, K)}).kernel_count == \
            engine.plan(by_hand, {"topk_ids": (t, K)}).kernel_count
    assert engine.plan(captured, {"ids": (64, K)}).kernel_count == 1
