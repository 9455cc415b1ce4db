"""The PyTorch oracle's conversion (helpers/torch_oracle.py) keeps every bit: NumPy -> torch ->
NumPy returns the same dtype, shape and bytes for every dtype segfuse has, bfloat16 NaN payloads,
signed zeros, subnormals and 0-d arrays included, and never shares memory with its argument.
Oracle: the arrays' own bytes."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
from helpers.torch_oracle import to_numpy, to_torch

TORCH_OF = {"bool": torch.bool, "uint8": torch.uint8, "int8": torch.int8, "int16": torch.int16,
            "int32": torch.int32, "int64": torch.int64, "float16": torch.float16,
            "bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}


def every_bit_pattern(dtype: str) -> np.ndarray:
    """Every 16-bit pattern for 16-bit types (all NaN payloads, both zeros, subnormals), else a
    random sample of bytes."""
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    if dt.itemsize == 2:
        return np.arange(1 << 16, dtype=np.uint16).view(dt)
    if dt == np.bool_:
        return np.array([True, False, True])
    return np.frombuffer(np.random.default_rng(0).bytes(dt.itemsize * 4096), dt).copy()


@pytest.mark.parametrize("dtype", list(TORCH_OF))
def test_numpy_torch_numpy_keeps_every_bit(dtype):
    a = every_bit_pattern(dtype)
    t = to_torch(a)
    assert t.dtype == TORCH_OF[dtype] and tuple(t.shape) == a.shape
    back = to_numpy(t)
    assert back.dtype == a.dtype and back.shape == a.shape
    assert back.tobytes() == a.tobytes()


def test_torch_sees_the_bfloat16_values_numpy_holds():
    a = np.array([1.5, -0.0, 3.0e38, 1e-40, np.inf], ml_dtypes.bfloat16)
    t = to_torch(a)
    assert t.float().tolist() == a.astype(np.float32).tolist()
    assert torch.signbit(t).tolist() == np.signbit(a.astype(np.float32)).tolist()


@pytest.mark.parametrize("dtype", ["bfloat16", "float32", "int64"])
def test_0d_strided_and_read_only_arrays_convert_as_copies(dtype):
    dt = ml_dtypes.bfloat16 if dtype == "bfloat16" else dtype
    zero_d = np.array(2.5 if dtype != "int64" else 7, dt)
    assert to_torch(zero_d).shape == () and to_numpy(to_torch(zero_d)).tobytes() == zero_d.tobytes()
    strided = np.arange(24, dtype=np.float64).astype(dt).reshape(4, 6)[::2, ::-3]
    assert to_numpy(to_torch(strided)).tobytes() == np.ascontiguousarray(strided).tobytes()
    frozen = np.arange(6, dtype=np.float64).astype(dt)
    frozen.flags.writeable = False
    t = to_torch(frozen)
    t[0] = 9  # a copy: the read-only array is untouched
    assert frozen[0] == 0
    back = to_numpy(t)
    back[1] = 9  # and the tensor is untouched by writes to its conversion
    assert t[1].item() == 1
