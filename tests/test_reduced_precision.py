"""Reduced-precision arithmetic (docs/graph-format.md): float16/bfloat16 floor_divide and the scans
near overflow, issue 15's bfloat16 disagreements with PyTorch on the H200.

Every expected value is computed with torch on the CPU in float32 (float64 for float64) and rounded
to the result dtype once, from the cases' own data: never with segfuse's code. torch's own CPU
results for 16-bit operands differ from that rule where its kernels round intermediate steps (the
tests show that they do on this data). The cases are in helpers/reduced_precision.py;
tests/gpu/test_random_graphs_gpu.py runs them on the CuPy backend.
"""

from __future__ import annotations

import pytest
import torch
from helpers.reduced_precision import CASES, HALF, check, half_array, same_bits
from helpers.torch_oracle import to_numpy, to_torch
from segfuse.compiler import Engine, run_graph


@pytest.mark.parametrize("name", sorted(CASES))
def test_reduced_precision_cases(name):
    check(name, lambda f, i: run_graph(f, i))
    check(name, lambda f, i: Engine().run(f, i).outputs)


# ---- the cases are not vacuous -----------------------------------------------------------------
def test_torch_cpu_rounds_16_bit_floor_divide_steps():
    # torch's CPU kernel for two bfloat16/float16 tensors rounds each step of its formula, so it
    # differs from the float32 rule on this data (the disagreement issue 15 saw on the H200)
    for dt in HALF:
        _, _, ins, want, _ = CASES[f"floordiv_{dt}_tensors"]
        native = torch.floor_divide(to_torch(ins["a"]), to_torch(ins["b"]))
        assert not same_bits(to_numpy(native), want), dt
    k, m = to_torch(half_array("bfloat16", [560, 560])), to_torch(half_array("bfloat16", [3, 3]))
    assert torch.floor_divide(k, m).tolist() == [187.0, 187.0]  # pytorch/pytorch#193754
    assert CASES["floordiv_bfloat16_known"][3][0].item() == 186.0


def test_scan_cases_reach_overflow_both_ways():
    for dt in HALF:
        for op in ("cumprod", "cumsum"):
            want = CASES[f"{op}_{dt}_overflow_dim-1"][3]
            assert bool((want == float("inf")).any()) and bool((want == float("-inf")).any()), (op, dt)
            assert bool(torch.isfinite(want).any()), (op, dt)
        p, q = CASES[f"cumprod_{dt}_overflow_dim-1"][3], CASES[f"cumsum_{dt}_overflow_dim-1"][3]
        top = torch.finfo(HALF[dt]).max
        assert p[1, 2].item() == top and p[0, 2].item() < top and p[0, 4].item() == float("inf"), dt
        k = 8 if dt == "bfloat16" else 11
        assert q[0, k - 1].item() == top and q[0, k].item() == float("inf"), dt
    assert CASES["cumsum_float16_back_from_overflow"][3].tolist() == [[60000.0, float("inf"), 60000.0, 60000.0, 1.0]]
    assert CASES["cumprod_float16_back_from_overflow"][3].tolist() == [[256.0, float("inf"), 128.0, 512.0, 256.0]]
