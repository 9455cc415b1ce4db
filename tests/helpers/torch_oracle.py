"""PyTorch as the oracle: NumPy arrays <-> torch tensors, and the check that a result is torch's.

The conversion is bit-exact both ways for every dtype, bfloat16 included (NumPy's bfloat16 is
ml_dtypes'): its bits are reinterpreted, never converted through float32, so NaN payloads and
signed zeros survive a round trip."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch


def to_torch(a: np.ndarray) -> torch.Tensor:
    """A torch tensor with `a`'s dtype, shape and bits (a copy: nothing is shared with `a`)."""
    a = np.array(a, copy=True, order="C")  # (np.ascontiguousarray would make 0-d arrays 1-d)
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A NumPy array with `t`'s dtype (ml_dtypes.bfloat16 for torch.bfloat16), shape and bits (a copy)."""
    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16).copy()
    return t.numpy().copy()


def check_same(actual: np.ndarray, expected: torch.Tensor, what: str = "", tol: dict | None = None) -> None:
    """segfuse's result equals torch's: dtype, shape, and values (exact, or within `tol` for floats)."""
    act = to_torch(actual)
    assert act.dtype == expected.dtype, f"{what}: dtype {act.dtype} != torch's {expected.dtype}"
    assert tuple(act.shape) == tuple(expected.shape), f"{what}: shape {tuple(act.shape)} != {tuple(expected.shape)}"
    if expected.dtype.is_floating_point:
        torch.testing.assert_close(act, expected, equal_nan=True, **(tol or {}), msg=lambda m: f"{what}: {m}")
    else:
        assert torch.equal(act, expected), f"{what}: values differ\n{act}\n{expected}"


def topk_scatter_in_torch(x, d):
    """helpers.graphs.topk_scatter's outputs (o, v), computed by torch."""
    v, i = torch.sort(x, dim=0, descending=True, stable=True)
    v, i = v[:4], i[:4]
    return torch.scatter(d, 0, i, v * 2.0), v
