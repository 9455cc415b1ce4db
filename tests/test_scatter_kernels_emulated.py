"""Scatter kernels run on the CUDA emulator (tests/cuda_emulator.py) against PyTorch on the CPU:
two bugs the GPU suite's random graphs found on the H200 (2026-12-06, seed 1796593907).

* A scatter whose self is a private copy made by an earlier segment, its result an intermediate
  of a single-block segment: the kernel accumulated into shared memory that was never loaded
  with self (the codegen took the copy's buffer for the place it writes).
* Sums and products into float16 and bfloat16 targets: atomics in the 16-bit type rounded at
  every source (128 float16 additions of 0.805 to -3.09 gave 100.6875, not 100.0). segfuse
  accumulates them in float32 and rounds once (docs/graph-format.md), in every kernel form:
  single-block (the target an output or an intermediate), single-block with a first phase that
  several blocks share, grid with per-block histograms, grid with global atomics, include_self
  false.

The GPU runs the same graphs in tests/gpu/test_scatter_gpu.py."""

from __future__ import annotations

import cuda_emulator as emu
import numpy as np
import pytest
import scatter_cases as sc
from helpers.emulated import on_device
from segfuse.compiler.engine import Engine
from segfuse.compiler.ir import Fusion

PLANS = Engine("numpy")

pytestmark = pytest.mark.skipif(not emu.available(), reason="needs a C++17 compiler (c++)")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_scatter_into_a_private_copy_read_in_the_same_block(emulated, seed):
    ins = sc.private_copy_inputs(seed)
    f = Fusion.from_json(sc.private_copy_graph())
    plan = PLANS.plan(f, {n: a.shape for n, a in ins.items()})
    seg = next(s for s in plan.segments if "a" in s.intermediates)  # (the case the bug needed)
    assert getattr(seg.kind, "value", seg.kind) == "single_block" and any(a.tensor == "a" for a in seg.aliases)
    rt, Array = emulated
    got, _ = rt.run(f, on_device(ins, Array), plan)
    for name, want in sc.private_copy_want(ins).items():
        np.testing.assert_array_equal(np.asarray(got[name]), want, err_msg=name)


@pytest.mark.parametrize("dt,size,reduce,include_self,then", sc.WIDE_CASES)
def test_16bit_scatter_sums_round_once(emulated, dt, size, reduce, include_self, then):
    n_out, n_dom = sc.SIZES[size]
    ins = sc.wide_inputs(dt, n_out, n_dom, reduce, seed=n_out + n_dom)
    f = Fusion.from_json(sc.wide_graph(dt, n_out, n_dom, reduce, include_self, then))
    plan = PLANS.plan(f, {n: a.shape for n, a in ins.items()})
    kinds = {getattr(s.kind, "value", s.kind) for s in plan.segments}
    assert ("single_block" in kinds) == size.startswith("single block"), kinds
    rt, Array = emulated
    got, _ = rt.run(f, on_device(ins, Array), plan)
    sc.check_wide(np.asarray(got["z" if then else "y"]), ins, dt, reduce, include_self, then)
