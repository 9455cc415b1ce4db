"""torch.compile(fn, backend="segfuse") on CPU: compiled results against the same functions run by
eager PyTorch; the subgraphs taken and the ops left, as the `segfuse.torch.compile` logger reports
them, against what the functions hold; segfuse's ops really running (their CPU path counted); the
rules for subgraphs too small to take; dynamic shapes; the backend found by name through its entry
point in a fresh process; the eager fallback when Inductor fails; and refused options."""

from __future__ import annotations

import logging
import operator
import subprocess
import sys
import textwrap
from contextlib import contextmanager
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from segfuse.torch.compiling import capture_decompositions, segfuse_backend, take_subgraphs
from segfuse.torch.op import TorchFusion
from torch.fx.experimental.proxy_tensor import make_fx
from torch_graphs import torch_prologue

E, K = 8, 2  # experts, experts per token (small: the tests compile on two cores)
LOGGER = "segfuse.torch.compile"


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@contextmanager
def counting_segfuse_runs():
    """Counts the runs of segfuse ops' CPU path (what a segfuse op call executes on CPU tensors)."""
    with mock.patch.object(TorchFusion, "_run_cpu", autospec=True, side_effect=TorchFusion._run_cpu) as m:
        yield m


def stats_of(caplog) -> list:
    return [r.segfuse_stats for r in caplog.records if r.name == LOGGER and hasattr(r, "segfuse_stats")]


def assert_same(got, want):
    got, want = (got if isinstance(got, (tuple, list)) else (got,)), (want if isinstance(want, (tuple, list)) else (want,))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        if g.dtype.is_floating_point:
            torch.testing.assert_close(g, w)
        else:
            assert torch.equal(g, w), (g, w)


def ops_of(stats) -> list[set[str]]:
    """The ATen op packets (aten.scatter_add, ...) of each subgraph taken."""
    return [{op.rsplit(".", 1)[0] for op in s.aten_ops} for s in stats.subgraphs]


def route(hidden, mask, weight, bias):
    """A mixed function: a linear gate (a matmul: no segfuse op) feeding a masked softmax, top-k and the
    MoE routing prologue (scatter_add, cumsum, pad, argsort, scatter), then a gather of hidden rows."""
    logits = F.linear(hidden, weight, bias)
    probs = torch.softmax(logits.masked_fill(mask, float("-inf")), dim=-1)
    weights, ids = torch.topk(probs, K, dim=-1)
    counts, offsets, input_perm, output_perm = torch_prologue(ids, E, K)
    return hidden[input_perm], weights, counts, offsets, output_perm


class Router(torch.nn.Module):
    def __init__(self, D: int = 6):
        super().__init__()
        self.gate = torch.nn.Linear(D, E)

    def forward(self, hidden, mask):
        return route(hidden, mask, self.gate.weight, self.gate.bias)


def router_inputs(T: int, gen: torch.Generator, D: int = 6):
    hidden = torch.randn(T, D, generator=gen)
    mask = torch.zeros(T, E, dtype=torch.bool)
    mask[:, torch.randperm(E, generator=gen)[:2]] = True  # two experts masked for every token
    return hidden, mask


# ---- the rewrite, on ATen graphs traced here (no Inductor) --------------------------------
def aten_graph(fn, *args):
    """`fn` as the functional ATen graph the backend partitions (FakeTensor values in node.meta)."""
    return make_fx(torch.func.functionalize(fn), decomposition_table=capture_decompositions(),
                   tracing_mode="fake")(*args)


def test_rewritten_graph_calls_segfuse_ops_and_matches_eager():
    gen = torch.Generator().manual_seed(0)
    args = (*router_inputs(11, gen), torch.randn(E, 6, generator=gen), torch.randn(E, generator=gen))
    with torch.no_grad():
        want = route(*args)
        gm = aten_graph(route, *args)
        stats = take_subgraphs(gm)
        with counting_segfuse_runs() as runs:
            got = gm(*args)
    assert_same(got, want)
    prologue = [ops for ops in ops_of(stats) if "aten.scatter_add" in ops]
    assert prologue and {"aten.cumsum", "aten.sort"} <= prologue[0], ops_of(stats)
    assert runs.call_count == len(stats.subgraphs) >= 1
    left = dict(stats.left)
    matmul = [op for op in left if op.split(".")[1] in ("mm", "addmm")]
    assert matmul, left
    assert "no segfuse equivalent" in left[matmul[0]]
    # the graph calls exactly the segfuse ops reported, and each ATen op of the graph was taken or left
    called = {n.target._schema.name for n in gm.graph.nodes if n.op == "call_function"
              and isinstance(n.target, torch._ops.OpOverload) and n.target.namespace == "segfuse"}
    assert called == {s.op for s in stats.subgraphs}
    assert stats.ops_taken + sum(stats.ops_left.values()) == sum(
        1 for n in aten_graph(route, *args).graph.nodes if n.op == "call_function"
        and n.target is not operator.getitem and "sym_size" not in str(n.target))


@pytest.mark.parametrize("fn", [
    pytest.param(lambda x, i: torch.softmax(x, -1), id="one reduction"),
    pytest.param(lambda x, i: (x * 2 + 1).exp().clamp(max=3.0), id="elementwise chain"),
    pytest.param(lambda x, i: x.reshape(-1)[2:], id="views"),
    pytest.param(lambda x, i: torch.zeros(E).scatter_add(0, i, torch.ones_like(x[:, 0])), id="a scatter on fills"),
])
def test_subgraphs_not_worth_a_kernel_are_left(fn):
    x, idx = torch.randn(5, 3), torch.randint(0, E, (5,))
    gm = aten_graph(fn, x, idx)
    stats = take_subgraphs(gm)
    assert stats.subgraphs == ()
    assert stats.left and all("gains nothing" in why or "elementwise" in why for _, why in stats.left), stats.left
    assert_same(gm(x, idx), fn(x, idx))


def test_min_ops_takes_a_single_scatter():
    def fn(x, i):
        return torch.zeros(E).scatter_add(0, i, torch.ones_like(x[:, 0]))

    x, idx = torch.randn(5, 3), torch.randint(0, E, (5,))
    gm = aten_graph(fn, x, idx)
    stats = take_subgraphs(gm, min_ops=1)
    assert ["aten.scatter_add" in ops for ops in ops_of(stats)] == [True]
    with counting_segfuse_runs() as runs:
        assert_same(gm(x, idx), fn(x, idx))
    assert runs.call_count == 1


def test_unconnected_parts_become_separate_subgraphs():
    def fn(x, y):
        return torch.cumsum(x * 2, 0), torch.softmax(y.float() - 1, -1)

    x, y = torch.randint(0, 9, (6,)), torch.randn(4, 5)
    gm = aten_graph(fn, x, y)
    stats = take_subgraphs(gm)
    assert sorted(map(sorted, ops_of(stats))) == [["aten._softmax", "aten.sub"], ["aten.cumsum", "aten.mul"]]
    assert_same(gm(x, y), fn(x, y))


# ---- torch.compile ----------------------------------------------------------------------
def test_compiled_mixed_model_matches_eager_at_several_sizes(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    model = Router()
    compiled = torch.compile(model, backend="segfuse", dynamic=True)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad(), counting_segfuse_runs() as runs:
        for T in (3, 8, 17):
            args = router_inputs(T, gen)
            assert_same(compiled(*args), model(*args))
    stats = stats_of(caplog)
    assert len(stats) == 1, [s.summary() for s in stats]  # one symbolic graph serves every T
    (s,) = stats
    assert s.rest == "inductor" and s.graph == "inference"
    assert any({"aten.scatter_add", "aten.cumsum"} <= ops for ops in ops_of(s)), ops_of(s)
    assert any(op.split(".")[1] in ("mm", "addmm") for op in s.ops_left), s.ops_left
    assert runs.call_count == 3 * len(s.subgraphs)
    assert any(s.summary() in r.getMessage() for r in caplog.records if r.levelno == logging.INFO)


def gate_rows_then_route(hidden, weight):
    """The prologue fed by a matmul (no segfuse op) over twice as many rows as tokens: the subgraph's
    input has a size PyTorch derives from the token count (2*T), not a size symbol of its own."""
    logits = hidden.reshape(-1, 3) @ weight  # [2T, E]
    ids = torch.topk(logits, K, dim=-1).indices.reshape(-1, K)
    return torch_prologue(ids, E, K)


def test_subgraph_reading_a_result_of_derived_size_is_taken_under_dynamic_shapes(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    compiled = torch.compile(gate_rows_then_route, backend="segfuse", dynamic=True)
    gen = torch.Generator().manual_seed(4)
    weight = torch.randn(3, E, generator=gen)
    with torch.no_grad(), counting_segfuse_runs() as runs:
        for T in (5, 7, 12):  # (sizes no other dim has: dynamo would give them one symbol)
            hidden = torch.randn(T, 6, generator=gen)
            assert_same(compiled(hidden, weight), gate_rows_then_route(hidden, weight))
    stats = stats_of(caplog)
    assert len(stats) == 1, [s.summary() for s in stats]  # one symbolic graph serves every T
    (s,) = stats
    assert any({"aten.scatter_add", "aten.cumsum", "aten.sort"} <= ops for ops in ops_of(s)), s.summary()
    assert "aten.mm.default" in s.ops_left and not any("derived size" in why for _, why in s.left), s.left
    assert runs.call_count == 3 * len(s.subgraphs)


def adds_constants(x):
    small = torch.cumsum(x * 2, 0) + torch.tensor([1.0, 2.0, 2.0, -0.5])  # written into the segfuse graph
    large = torch.cumsum(x.exp(), 0) * torch.tensor([float(k) for k in range(80)]).reshape(20, 4)
    return small, large


def test_small_constants_join_their_subgraph_and_large_ones_leave_it_to_inductor(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    compiled = torch.compile(adds_constants, backend="segfuse")
    x = torch.randn(20, 4, generator=torch.Generator().manual_seed(5))
    with counting_segfuse_runs() as runs:
        assert_same(compiled(x), adds_constants(x))
    (s,) = stats_of(caplog)
    assert len(s.subgraphs) == 1 and {"aten.cumsum", "aten.add"} <= ops_of(s)[0], s.summary()
    assert "aten.exp" not in ops_of(s)[0]
    assert any("constant tensor too large" in why for op, why in s.left if op.startswith("aten.exp")), s.left
    assert runs.call_count == 1


def test_fullgraph_prologue_is_one_segfuse_op(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)

    def prologue(ids):
        return torch_prologue(ids, E, K)

    compiled = torch.compile(prologue, backend=segfuse_backend, fullgraph=True)
    ids = torch.randint(0, E, (13, K), generator=torch.Generator().manual_seed(2))
    with counting_segfuse_runs() as runs:
        got = compiled(ids)
    assert_same(got, prologue(ids))
    (s,) = stats_of(caplog)
    assert len(s.subgraphs) == 1 and s.left == (), s.summary()
    assert {"aten.scatter_add", "aten.cumsum", "aten.constant_pad_nd", "aten.sort", "aten.scatter"} <= ops_of(s)[0]
    assert runs.call_count == 1


def test_backend_by_name_in_a_fresh_process():
    code = textwrap.dedent("""
        import sys, torch
        def f(x):
            return torch.cumsum(x * 3, 0) - x.max()
        x = torch.arange(10, dtype=torch.int64) % 7
        got = torch.compile(f, backend="segfuse", options={"segfuse.rest": "eager"})(x)
        assert torch.equal(got, f(x)), (got, f(x))
        print("backend module loaded:", "segfuse.torch.compiling" in sys.modules)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-3000:] + "\n(the entry point is installed by `pip install -e .`)"
    assert "backend module loaded: True" in r.stdout


def test_inductor_failure_falls_back_to_eager_only_when_asked(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)

    def fn(x, i):
        return torch.zeros(E).scatter_add(0, i, x.exp()).cumsum(0), x[:, None] @ x[None, :]

    x, idx = torch.randn(5), torch.randint(0, E, (5,))
    failing = {"_raise_error_for_testing": True}  # Inductor's own switch: compile_fx raises
    with pytest.raises(torch._dynamo.exc.BackendCompilerFailed):
        torch.compile(fn, backend="segfuse", options=failing)(x, idx)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="segfuse", options={**failing, "segfuse.fallback": "eager"})
    with counting_segfuse_runs() as runs:
        assert_same(compiled(x, idx), fn(x, idx))
    assert runs.call_count == 1
    assert any(r.levelno == logging.WARNING and "Inductor could not compile" in r.getMessage() for r in caplog.records)
    assert [s.rest for s in stats_of(caplog)][-1] == "eager"


@pytest.mark.parametrize("rest", ["inductor", "eager"])
def test_inputs_requiring_grad_get_eager_gradients(rest):
    def fn(x, i):
        counts = torch.zeros(E).scatter_add(0, i, x.exp())
        return (F.pad(counts.cumsum(0), (1, 0)) * x.sum()).sum()

    x = torch.randn(7, requires_grad=True)
    idx = torch.randint(0, E, (7,), generator=torch.Generator().manual_seed(3))
    compiled = torch.compile(fn, backend="segfuse", options={"segfuse.rest": rest})
    with counting_segfuse_runs() as runs:
        got = compiled(x, idx)
    assert runs.call_count == 1  # the forward's subgraph (the backward is Inductor's, or ATen's)
    (gx,) = torch.autograd.grad(got, x)
    want = fn(x, idx)
    (wx,) = torch.autograd.grad(want, x)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(gx, wx)


@pytest.mark.parametrize("options, message", [
    ({"segfuse.rest": "tvm"}, "segfuse.rest"),
    ({"segfuse.fallback": "retry"}, "segfuse.fallback"),
    ({"segfuse.min_ops": 0}, "segfuse.min_ops"),
    ({"segfuse.minops": 2}, "segfuse.minops"),
    ({"no_such_inductor_option": 1}, "no_such_inductor_option"),
])
def test_bad_options_are_refused(options, message):
    gm = torch.fx.symbolic_trace(lambda x: x + 1)
    with pytest.raises((ValueError, RuntimeError), match=message):
        segfuse_backend(gm, [torch.zeros(2)], options=options)
