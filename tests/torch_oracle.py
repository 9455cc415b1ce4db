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
