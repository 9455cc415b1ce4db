"""Number literals reach the generated CUDA kernels exactly, for every dtype: each dtype's extremes
(min, max, the smallest normal and subnormal, eps), -0.0, +-inf, NaN, int64's -2^63 and 2^63 - 1,
both bools, as a fill, a pad value and a pointwise operand (tests/literal_cases.py), run through
the CUDA runtime on the CPU emulator of the kernels (tests/cuda_emulator.py) and compared bit for
bit with PyTorch on the CPU. (The code generator once wrote -2^63 as +9.22e18 for float tensors.)
The GPU suite runs the same cases on the device: tests/gpu/test_literal_extremes_gpu.py."""

from __future__ import annotations

import cuda_emulator as emu
import literal_cases as lc
import numpy as np
import pytest
from helpers.emulated import on_device
from segfuse.compiler import Engine
from segfuse.compiler.ir import Fusion

pytestmark = pytest.mark.skipif(not emu.available(), reason="needs a C++17 compiler (c++)")


@pytest.mark.parametrize("dt,chunk", lc.cases(), ids=[f"{dt}-{c}" for dt, c in lc.cases()])
def test_literal_extremes_in_emulated_kernels(emulated, dt, chunk):
    rt, Array = emulated
    graph, ins, want = lc.case(dt, chunk)
    f = Fusion.from_json(graph)
    got, _ = rt.run(f, on_device(ins, Array), Engine("numpy").plan(f, {k: np.shape(v) for k, v in ins.items()}))
    for k, w in want.items():
        lc.assert_exact(np.array(got[k]), w, f"{dt} {k} ({graph['ops'][list(want).index(k)]})")
