"""Tensors between PyTorch and segfuse: dtypes, and CPU tensors as NumPy arrays (the NumPy backend).

bfloat16 crosses as its 16-bit pattern (NumPy holds it as ml_dtypes.bfloat16, CuPy as uint16), bool
as bytes: both views, never copies.
"""

from __future__ import annotations

import numpy as np
import torch
from segfuse.compiler.dtypes import DType

_TORCH = {dt: getattr(torch, dt.value) for dt in DType}
_FROM_TORCH = {v: k for k, v in _TORCH.items()}


def torch_dtype(dt: DType) -> torch.dtype:
    return _TORCH[dt]


def dtype_from_torch(dt: torch.dtype) -> DType | None:
    """The segfuse dtype of a torch dtype, None where segfuse has none."""
    return _FROM_TORCH.get(dt)


def segfuse_dtype(t: torch.Tensor, where: str) -> DType:
    """The segfuse dtype of a tensor; TypeError naming the input otherwise."""
    dt = _FROM_TORCH.get(t.dtype)
    if dt is None:
        raise TypeError(f"{where}: dtype {t.dtype} is not supported (supported: "
                        f"{', '.join(str(v) for v in _TORCH.values())})")
    return dt


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A NumPy view of a CPU tensor (its memory: writes show in the tensor)."""
    t = t.detach()
    if t.dtype is torch.bfloat16:
        return t.view(torch.int16).numpy().view(DType.bfloat16.np)
    return t.numpy()


def from_numpy(a: np.ndarray) -> torch.Tensor:
    """A fresh contiguous CPU tensor holding `a` (0-d stays 0-d)."""
    a = np.array(a, copy=True, order="C")  # (never a view of an input: a custom op's outputs are fresh)
    if a.dtype == DType.bfloat16.np:
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)
