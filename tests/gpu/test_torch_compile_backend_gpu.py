"""torch.compile(backend="segfuse") on CUDA tensors: with mode="reduce-overhead" (Inductor's CUDA
graphs, recorded around the segfuse op) results equal eager PyTorch's over replays on new inputs,
CUDA graphs are not skipped, and the MoE routing prologue is one segfuse op call; a mixed model (a
linear gate Inductor compiles, the routing segfuse takes) likewise."""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA GPU", allow_module_level=True)

import segfuse.torch as sft  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch._dynamo.utils import counters  # noqa: E402
from torch_graphs import E, K, torch_prologue  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = "cuda"
LOGGER = "segfuse.torch.compile"


@pytest.fixture(autouse=True)
def _fresh():
    torch._dynamo.reset()
    counters.clear()
    sft.check()
    yield
    sft.check()
    torch._dynamo.reset()


def _stats(caplog) -> list:
    return [r.segfuse_stats for r in caplog.records if r.name == LOGGER and hasattr(r, "segfuse_stats")]


def _same(got, want):
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.device == w.device and g.dtype == w.dtype and g.shape == w.shape
        if g.dtype.is_floating_point:
            torch.testing.assert_close(g, w)
        else:
            assert torch.equal(g, w)


def _packets(subgraph) -> set[str]:
    return {op.rsplit(".", 1)[0] for op in subgraph.aten_ops}


@pytest.mark.parametrize("T", [64, 4096])
def test_prologue_under_reduce_overhead_is_one_segfuse_op(caplog, T):
    caplog.set_level(logging.INFO, logger=LOGGER)

    def prologue(ids):
        return torch_prologue(ids, E, K)

    compiled = torch.compile(prologue, backend="segfuse", mode="reduce-overhead", fullgraph=True)
    gen = torch.Generator(device=DEV).manual_seed(T)
    for _ in range(5):  # warm-up, recording, then replays on new contents
        ids = torch.randint(0, E, (T, K), device=DEV, generator=gen)
        got = [t.clone() for t in compiled(ids)]  # (a replay's outputs are overwritten by the next one)
        _same(got, prologue(ids))
    (s,) = _stats(caplog)
    assert len(s.subgraphs) == 1 and s.left == (), s.summary()
    assert {"aten.scatter_add", "aten.cumsum", "aten.sort", "aten.scatter"} <= _packets(s.subgraphs[0])
    assert counters["inductor"]["cudagraph_skips"] == 0


def test_mixed_model_under_reduce_overhead_matches_eager(caplog):
    caplog.set_level(logging.INFO, logger=LOGGER)
    gate = torch.nn.Linear(128, E, device=DEV)

    def route(hidden):
        probs = torch.softmax(gate(hidden), dim=-1)  # the linear: Inductor's (a matmul)
        weights, ids = torch.topk(probs, K, dim=-1)
        counts, offsets, input_perm, output_perm = torch_prologue(ids, E, K)
        return F.silu(hidden[input_perm]), weights, counts, offsets, output_perm

    compiled = torch.compile(route, backend="segfuse", mode="reduce-overhead")
    gen = torch.Generator(device=DEV).manual_seed(0)
    with torch.no_grad():
        for _ in range(5):
            hidden = torch.randn(512, 128, device=DEV, generator=gen)
            got = [t.clone() for t in compiled(hidden)]
            _same(got, route(hidden))
    stats = _stats(caplog)
    assert stats and any({"aten.scatter_add", "aten.cumsum"} <= _packets(sg) for s in stats for sg in s.subgraphs)
    assert any(op.split(".")[1] in ("mm", "addmm") for s in stats for op in s.ops_left)
    assert counters["inductor"]["cudagraph_skips"] == 0
