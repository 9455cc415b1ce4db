"""`FusionDefinition.execute([...])` on CUDA tensors, as nvFuser's users call it: the outputs are CUDA
tensors equal to torch's; inputs written by torch just before the call are read after that work;
bfloat16, non-contiguous inputs, a 0-d CPU scalar next to CUDA tensors, and an `alias_input` output
updating its CUDA input in place."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cupy")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA GPU", allow_module_level=True)

from segfuse.compiler import DataType, FusionDefinition  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = "cuda"


def _equal(got, want):
    assert got.device == want.device and got.dtype == want.dtype and got.shape == want.shape, (got, want)
    if want.dtype.is_floating_point:
        torch.testing.assert_close(got, want)
    else:
        assert torch.equal(got, want)


def test_routing_on_cuda_tensors_returns_cuda_tensors_equal_to_torch():
    n = 8
    with FusionDefinition() as fd:
        logits = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.Float)
        _, ids = fd.ops.topk(logits, 1, dim=1)
        zeros = fd.ops.full([fd.ops.size(logits, 0), n], fill_value=0, dtype=DataType.Int32)
        counts = fd.ops.sum(fd.ops.scatter(zeros, ids, 1, dim=1), dims=[0], dtype=DataType.Int)
        order = fd.ops.argsort(fd.ops.reshape(ids, new_shape=[-1]), dim=0, stable=True)
        fd.add_output(counts)
        fd.add_output(order)
    for s in (7, 1000):
        # written on torch's current stream just before the call: the run must read it after
        x = torch.randn(s, n, device=DEV).mul_(3).add_(1)
        got = fd.execute([x])
        top = x.topk(1)[1]
        _equal(got[0], torch.zeros(s, n, dtype=torch.int32, device=DEV).scatter(1, top, 1).sum(0))
        _equal(got[1], top.view(-1).argsort(stable=True))


def test_bfloat16_non_contiguous_and_cpu_scalar_inputs():
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1, -1], contiguity=[True, True], dtype=DataType.BFloat16, stride_order=[0, 1])
        s1 = fd.define_tensor(shape=[], contiguity=[], dtype=DataType.Float, is_cpu=True)
        fd.add_output(fd.ops.mul(fd.ops.cast(t0, DataType.Float), s1))
        fd.add_output(fd.ops.neg(t0))
    x = torch.randn(6, 4, device=DEV, dtype=torch.bfloat16).t()
    scale = torch.tensor(2.5)
    scaled, neg = fd.execute([x, scale])
    _equal(scaled, x.float() * 2.5)
    _equal(neg, -x)


def test_alias_input_updates_the_cuda_tensor_in_place():
    with FusionDefinition() as fd:
        t0 = fd.define_tensor(shape=[-1], contiguity=[True], dtype=DataType.Float)
        t1 = fd.ops.add(t0, fd.define_scalar(1.0))
        fd.add_output(t1, alias_input=t0)
        fd.add_output(fd.ops.mul(t1, 2.0))
    x = torch.arange(5, device=DEV, dtype=torch.float32)
    want_x = x + 1
    (doubled,) = fd.execute([x])
    _equal(x, want_x)
    _equal(doubled, want_x * 2)
