"""segfuse.torch on CPU tensors (the NumPy backend): results against PyTorch computing the same thing
directly; the custom op's fake implementation (shapes and dtypes, concrete and symbolic) for every
example graph against the shapes a real run produces; torch.library.opcheck; torch.compile with
fullgraph=True; bad inputs; and the error blocks of the CUDA path, on a CuPy stand-in."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import segfuse.torch as sft
import sympy
import torch
import torch.nn.functional as F
from cupy_standin import fake_cupy
from segfuse.compiler import Fusion, FusionDefinition, run_graph
from segfuse.compiler.errors import BindError, DeferredRunError, RunError
from segfuse.compiler.shapes import parse_size
from segfuse.torch import fake
from segfuse.torch.convert import to_numpy
from torch.fx.experimental.proxy_tensor import make_fx
from torch_graphs import SCATTER_ADD, E, K, prologue_graph, torch_prologue

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_FILES = sorted((ROOT / "examples").glob("*.json"))


def _equal(got, want):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, g.shape, w.dtype, w.shape)
        assert torch.equal(g, w), (g, w)


def example_inputs(name: str, gen: torch.Generator, T: int = 37) -> list[torch.Tensor]:
    """Valid inputs (indices in range) for each example graph, in its input order."""
    if name.startswith("moe_problem_sizes"):
        return [torch.randint(0, 256 if name.endswith("e256") else 16, (T, 8), generator=gen)]
    if name in ("moe_expert_offsets", "moe_blockscale_offsets"):
        return [torch.randint(0, 500, (16,), generator=gen)]
    if name == "moe_argsort":
        return [torch.randint(0, 16, (T, 4), generator=gen)]
    if name == "elementwise_chain":
        return [torch.randn(T, generator=gen) for _ in range(3)]
    if name == "scatter_add":
        return [torch.randn(10, generator=gen), torch.randint(0, 10, (T,), generator=gen), torch.randn(T, generator=gen)]
    raise KeyError(f"examples/{name}.json has no inputs in {Path(__file__).name}: add them to example_inputs")


def torch_reference(name: str, xs: list[torch.Tensor]):
    """What each example computes, written with torch's ops (examples/README.md's table)."""
    if name.startswith("moe_problem_sizes"):
        flat = xs[0].flatten()
        return torch.zeros(256 if name.endswith("e256") else 16, dtype=torch.long).scatter_add(0, flat, torch.ones_like(flat))
    if name == "moe_expert_offsets":
        return F.pad(torch.cumsum(xs[0], 0), (1, 0))
    if name == "moe_blockscale_offsets":
        t = xs[0]
        return F.pad(torch.cumsum(t, 0), (1, 0)), F.pad(torch.cumsum((t + 127) // 128 * 128, 0), (1, 0))
    if name == "moe_argsort":
        s = torch.argsort(xs[0].flatten(), dim=0, descending=True, stable=True)
        return s // 4, torch.empty_like(s).scatter_(0, s, torch.arange(s.numel()))
    if name == "elementwise_chain":
        a, b, c = xs
        return torch.where(a > 0, a * b + c, torch.exp(c) * 0.5)
    if name == "scatter_add":
        return xs[0].clone().scatter_add_(0, xs[1], xs[2])
    raise KeyError(name)


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.stem)
def test_examples_match_torch(path):
    op = sft.fusion(path)
    gen = torch.Generator().manual_seed(1)
    xs = example_inputs(path.stem, gen)
    want = torch_reference(path.stem, xs)
    got = op(*xs)
    if path.stem == "elementwise_chain":
        torch.testing.assert_close(got, want)
    else:
        _equal(got, want)
    if path.stem == "scatter_add":
        assert got is xs[0]  # alias_of: the input itself, updated in place


@pytest.mark.parametrize("idt", ["int64", "int32"])
@pytest.mark.parametrize("T", [1, 7, 300])
def test_prologue_matches_torch(T, idt):
    op = sft.fusion(prologue_graph(idt))
    ids = torch.randint(0, E, (T, K), dtype=getattr(torch, idt), generator=torch.Generator().manual_seed(T))
    _equal(op(ids), torch_prologue(ids))
    _equal(op(topk_ids=ids), torch_prologue(ids))  # by name


def test_one_op_per_graph_and_every_source_kind(tmp_path):
    g = prologue_graph()
    op = sft.fusion(g)
    path = tmp_path / "g.json"
    path.write_text(json.dumps(g))
    assert sft.fusion(json.dumps(g)) is op and sft.fusion(str(path)) is op and sft.fusion(Fusion.from_json(g)) is op
    assert op.op is getattr(torch.ops.segfuse, f"f_{op.fusion.id}").default
    with FusionDefinition("scaled") as fd:
        x = fd.define_tensor("x", shape=["N"], dtype="float32")
        fd.add_output(fd.ops.mul(x, 3.0), "y")
    x = torch.randn(11)
    torch.testing.assert_close(sft.fusion(fd)(x), x * 3.0)


def _fake_outputs(op, xs, mode):
    if mode == "fake":
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode() as m:
            outs = op.op(*[m.from_tensor(x) for x in xs])
    else:  # symbolic sizes (SymInts), as torch.compile(dynamic=True) traces
        gm = make_fx(lambda *a: op.op(*a), tracing_mode="symbolic")(*[x.clone() for x in xs])
        outs = next(n for n in gm.graph.nodes if n.op == "output").args[0]
        outs = [n.meta["val"] for n in (outs if isinstance(outs, (tuple, list)) else [outs]) if n is not None]
    return list(outs) if isinstance(outs, (tuple, list)) else [] if outs is None else [outs]


def _graphs_for_fake():
    from importlib.util import module_from_spec, spec_from_file_location

    spec = spec_from_file_location("moe_builder", ROOT / "examples" / "moe_builder.py")
    builder = module_from_spec(spec)
    spec.loader.exec_module(builder)
    cases = [(p.stem, json.loads(p.read_text())) for p in EXAMPLE_FILES]
    cases += [(name, build().to_dict()) for name, build in builder.FUSIONS.items()]
    return cases


@pytest.mark.parametrize("mode", ["fake", "symbolic"])
@pytest.mark.parametrize("name, graph", _graphs_for_fake(), ids=lambda v: v if isinstance(v, str) else "")
def test_fake_shapes_and_dtypes_of_every_example(name, graph, mode):
    op = sft.fusion(graph)
    f = op.fusion
    for T in (5, 64):
        xs = example_inputs(name, torch.Generator().manual_seed(T), T)
        real = run_graph(f, {n: to_numpy(x) for n, x in zip(f.input_names, xs)})  # the oracle's shapes
        want = [(tuple(real[o.name].shape), str(real[o.name].dtype)) for o in f.outputs if o.alias_of is None]
        got = _fake_outputs(op, xs, mode)
        assert [(tuple(int(d) for d in t.shape), str(t.dtype).removeprefix("torch.")) for t in got] == want
        if mode == "symbolic":  # sizes that follow an input's size stay symbolic
            for o, t in zip([o for o in f.outputs if o.alias_of is None], got):
                declared = f.types[o.name].shape
                assert [isinstance(d, int) for d in declared] == [
                    not isinstance(d, torch.SymInt) or d.node.is_constant() for d in t.shape], (o.name, t.shape)


def test_symbolic_size_expressions_evaluate_like_python():
    syms = {"T", "K", "N"}
    env = {"T": 13, "K": 4, "N": 5}
    for text, want in [("T*K", 52), ("T*K+1", 53), ("(T+3)//4", 4), ("T//K*K", 12), ("N*N*2", 50), ("T-N", 8),
                       ("(T*K+127)//128*128", 128)]:
        assert fake._eval(parse_size(text, syms), env) == want, text
    with pytest.raises(NotImplementedError):
        fake._eval(sympy.Max(sympy.Symbol("T"), 3), env)


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=lambda p: p.stem)
def test_opcheck_every_example(path):
    op = sft.fusion(path)
    xs = example_inputs(path.stem, torch.Generator().manual_seed(3))
    torch.library.opcheck(op.op, tuple(xs))


def test_opcheck_prologue_int32():
    op = sft.fusion(prologue_graph("int32"))
    torch.library.opcheck(op.op, (torch.randint(0, E, (9, K), dtype=torch.int32),))


def decode_step(op, logits):
    """Router logits -> top-k experts -> the prologue -> index ops (a decode step's routing)."""
    _, topk_ids = torch.topk(logits, K, dim=-1)
    counts, offsets, input_perm, output_perm = op(topk_ids)
    sorted_tokens = input_perm[output_perm]  # each slot's token, back in slot order
    return counts, offsets[1:] - offsets[:-1], sorted_tokens


@pytest.mark.parametrize("dynamic", [False, True])
def test_torch_compile_fullgraph(dynamic):
    op = sft.fusion(prologue_graph())
    compiled = torch.compile(lambda x: decode_step(op, x), fullgraph=True, dynamic=dynamic)
    for T in (6, 6, 19):
        logits = torch.randn(T, E, generator=torch.Generator().manual_seed(T))
        got, want = compiled(logits), decode_step(op, logits)
        _equal(got, want)
        ids = torch.topk(logits, K, dim=-1)[1]
        _equal(got[0], torch_prologue(ids)[0])
        assert torch.equal(got[2], torch.arange(T).repeat_interleave(K))  # slot s holds token s // K


def test_torch_compile_in_place_update():
    upd = sft.fusion(SCATTER_ADD)

    def step(dst, index, src):
        upd(dst, index, src)
        return dst * 2

    dst, index, src = torch.zeros(8), torch.tensor([0, 0, 3, 7]), torch.ones(4)
    out = torch.compile(step, fullgraph=True)(dst, index, src)
    want = torch.zeros(8).scatter_add_(0, index, src)
    _equal(dst, want)
    _equal(out, want * 2)


def test_out_tensors():
    op = sft.fusion(prologue_graph())
    ids = torch.randint(0, E, (20, K))
    counts = torch.empty(E, dtype=torch.int64)
    perm = torch.empty(20 * K, dtype=torch.int64)
    res = op(ids, out=[counts, None, None, perm])
    assert res[0] is counts and res[3] is perm
    _equal(res, torch_prologue(ids))
    with pytest.raises(TypeError, match=r"out.counts: expected torch.int64\[256\]"):
        op(ids, out={"counts": torch.empty(3, dtype=torch.int64)})
    with pytest.raises(TypeError, match="out.nope: unknown output"):
        op(ids, out={"nope": counts})


def test_bad_inputs_name_the_input():
    op = sft.fusion(prologue_graph())
    with pytest.raises(TypeError, match="inputs.ids: unknown input"):
        op(ids=torch.zeros(2, K, dtype=torch.long))
    with pytest.raises(TypeError, match="inputs.topk_ids: missing input"):
        op()
    with pytest.raises(TypeError, match="inputs.topk_ids: expected a torch.Tensor"):
        op(np.zeros((2, K), np.int64))
    with pytest.raises(BindError, match="topk_ids.*dtype float32 does not match the graph's int64"):
        op(torch.zeros(2, K))
    with pytest.raises(BindError, match="size 3 at dim 1 should be 8"):
        op(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(RunError, match="index 300 is out of bounds"):  # on the CPU: raised by the call itself
        op(torch.full((2, K), 300, dtype=torch.long))
    sft.check()  # a no-op without CUDA calls


def test_error_blocks_report_the_first_failure_of_each_op():
    from segfuse.compiler.cuda.external_stream import BLOCKS_PER_CHUNK, ErrorBlocks
    from segfuse.compiler.cuda.thread_state import ERR_WORDS

    class Owner:
        def __init__(self, graph):
            self.fusion = Fusion.from_json(graph)

    blocks = ErrorBlocks(fake_cupy(object))
    a, b = Owner(prologue_graph()), Owner(SCATTER_ADD)
    ptrs = [blocks.claim(a), blocks.claim(b)] + [blocks.claim(a) for _ in range(BLOCKS_PER_CHUNK)]
    assert len(set(ptrs)) == len(ptrs) and not blocks.dirty()
    scatter = next(n.index for n in a.fusion.nodes if n.op.name == "scatter")

    def fail(ptr, op_index, value):  # what a kernel writes: code 1 (index), op, value, dim, size
        np.frombuffer((np.ctypeslib.as_ctypes_type(np.int64) * ERR_WORDS).from_address(ptr), np.int64)[:] = \
            [1, op_index, value, 0, 256]

    fail(ptrs[0], scatter, 999)
    fail(ptrs[-1], scatter, 1000)  # in the second chunk
    assert blocks.dirty()
    with pytest.raises(DeferredRunError, match="graph 'moe_prologue_int64' failed: scatter: index 999 is out of bounds") as e:
        blocks.raise_failures()
    assert e.value.later_failures == 1
    assert not blocks.dirty()
    blocks.raise_failures()  # cleared: nothing left to raise



def test_eager_calls_skip_the_dispatcher_and_others_do_not(monkeypatch):
    from torch._subclasses.fake_tensor import FakeTensorMode

    chain = sft.fusion("examples/elementwise_chain.json")
    upd = sft.fusion(SCATTER_ADD)
    through = []
    for f in (chain, upd):
        real = f.op
        monkeypatch.setattr(f, "op", lambda *a, real=real: through.append(real) or real(*a))
    a, b, c = (torch.randn(50, generator=torch.Generator().manual_seed(i)) for i in range(3))
    want = torch.where(a > 0, a * b + c, torch.exp(c) * 0.5)
    torch.testing.assert_close(chain(a, b, c), want)  # eager: the implementation, directly
    assert through == []
    dst, index, src = torch.zeros(8), torch.tensor([0, 0, 3, 7]), torch.ones(4)
    v = dst._version
    assert upd(dst, index, src) is dst and dst._version > v  # in place: the version bumped as the op would
    torch.testing.assert_close(dst, torch.zeros(8).scatter_add_(0, index, src))
    assert through == []
    with torch.autograd.profiler.profile() as prof:  # the profiler sees the op
        torch.testing.assert_close(chain(a, b, c), want)
    assert len(through) == 1 and any(f"f_{chain.fusion.id}" in e.name for e in prof.function_events)
    with torch.device("cpu"):  # a torch function mode
        torch.testing.assert_close(chain(a, b, c), want)
    assert len(through) == 2
    with FakeTensorMode() as m:  # fake tensors: the fake implementation
        out = chain(*(m.from_tensor(x) for x in (a, b, c)))
    assert len(through) == 3 and tuple(out.shape) == (50,)
    ag = a.clone().requires_grad_()  # a gradient: the dispatcher (which knows there is no formula)
    out = chain(ag, b, c)
    assert len(through) == 4 and out.requires_grad
    with pytest.raises(RuntimeError, match="no autograd formula"):
        out.sum().backward()
    with torch.no_grad():
        chain(ag, b, c)
    assert len(through) == 4
