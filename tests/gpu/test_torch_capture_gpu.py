"""The MoE routing prologue written in plain PyTorch (workloads.torch_prologue: scatter_add_, cumsum,
pad, argsort, scatter_), captured once by `segfuse.torch.capture` from a decode step's T = 1 with T
dynamic, runs on the GPU as one kernel at every T up to 16384 (at most two at 65536, where the
histogram takes a kernel of its own), equal to torch's own ops on the same CUDA tensors, through the
Engine and through `segfuse.torch.fusion`."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
cp = pytest.importorskip("cupy")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA GPU", allow_module_level=True)

import segfuse.torch as sft  # noqa: E402
from segfuse.compiler.engine import Engine  # noqa: E402
from torch_graphs import E, K, torch_prologue  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def captured():
    ids = torch.randint(0, E, (1, K), device="cuda")
    return sft.capture(torch_prologue, ids, dynamic={"ids": {0: "T"}})


@pytest.mark.parametrize("T", [1, 7, 128, 4096, 16384, 65536])
def test_the_captured_prologue_is_one_launch_and_equals_torch(captured, T):
    fusion = captured.fusion()
    ids = torch.randint(0, E, (T, K), device="cuda")
    inputs = {"ids": cp.asarray(ids)}
    engine = Engine("cupy")
    got = engine.run(fusion, inputs).outputs
    for k, want in enumerate(torch_prologue(ids)):
        assert torch.equal(torch.as_tensor(got[f"output_{k}"], device="cuda"), want), (T, k)
    prep = engine.prepared(fusion, inputs)
    assert prep.kernels <= (1 if T <= 16384 else 2), (T, prep.kernels, prep.fallbacks)


def test_the_captured_prologue_as_a_torch_op_on_cuda_tensors(captured):
    op = sft.fusion(captured)
    for T in (1, 300):
        ids = torch.randint(0, E, (T, K), device="cuda")
        for got, want in zip(op(ids), torch_prologue(ids)):
            assert got.device == want.device and torch.equal(got, want), T
    sft.check()
