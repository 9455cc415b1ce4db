"""Conversions between NumPy arrays and torch tensors for tests that use PyTorch as the oracle
(bfloat16 goes through float32: NumPy has no native bfloat16)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch


def to_numpy(t: torch.Tensor) -> np.ndarray:
    if t.dtype is torch.bfloat16:
        return t.float().numpy().astype(ml_dtypes.bfloat16)
    return t.numpy().copy()


def to_torch(a: np.ndarray) -> torch.Tensor:
    a = np.asarray(a)
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
    return torch.from_numpy(np.array(a, copy=True, order="C"))


def check_same(actual: np.ndarray, expected: torch.Tensor, what: str = "", tol: dict | None = None) -> None:
    """segfuse's result equals torch's: dtype, shape, and values (exact, or within `tol` for floats)."""
    act = to_torch(actual)
    assert act.dtype == expected.dtype, f"{what}: dtype {act.dtype} != torch's {expected.dtype}"
    assert tuple(act.shape) == tuple(expected.shape), f"{what}: shape {tuple(act.shape)} != {tuple(expected.shape)}"
    if expected.dtype.is_floating_point:
        torch.testing.assert_close(act, expected, equal_nan=True, **(tol or {}), msg=lambda m: f"{what}: {m}")
    else:
        assert torch.equal(act, expected), f"{what}: values differ\n{act}\n{expected}"
