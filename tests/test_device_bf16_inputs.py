"""A device array of uint16 bits is a bfloat16 input where the graph declares bfloat16 (CuPy has no
bfloat16): `shape_proxies` binds it as bfloat16, and elsewhere uint16 stays what it is (refused).
The H200 found `Engine("cupy")` refusing such inputs: the dtype check ran before the bfloat16 rule."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from segfuse.compiler.builder import FusionDefinition
from segfuse.compiler.cuda.arrays import dtype_of, shape_proxies
from segfuse.compiler.dtypes import DType, from_numpy


class DeviceBits:
    """What CuPy hands over: a shape, a dtype and __cuda_array_interface__."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype, self.ndim = shape, np.dtype(dtype), len(shape)
        self.__cuda_array_interface__ = {"shape": shape, "typestr": self.dtype.str, "data": (0, False), "version": 3}


def _fusion():
    with FusionDefinition("bits") as fd:
        x = fd.define_tensor("x", shape=["R"], dtype="bfloat16")
        y = fd.define_tensor("y", shape=["R"], dtype="int16")
        fd.add_output(fd.ops.cast(x, "float32") + fd.ops.cast(y, "float32"), "z")
    return fd.fusion()


def test_uint16_bits_bind_as_bfloat16_where_declared():
    f = _fusion()
    assert dtype_of(f, "x", np.uint16) is DType.bfloat16
    proxies = shape_proxies(f, {"x": DeviceBits((5,), np.uint16), "y": DeviceBits((5,), np.int16)})
    assert proxies["x"].dtype == np.dtype(ml_dtypes.bfloat16) and proxies["x"].shape == (5,)
    assert proxies["y"].dtype == np.int16


def test_uint16_elsewhere_is_not_a_segfuse_dtype():
    f = _fusion()
    assert dtype_of(f, "y", np.uint16) is None  # declared int16: the bits are no bfloat16
    assert dtype_of(f, "x", np.float32) is DType.float32  # the binding reports the mismatch later
    with pytest.raises(ValueError, match="unsupported dtype uint16"):
        from_numpy(np.uint16)
