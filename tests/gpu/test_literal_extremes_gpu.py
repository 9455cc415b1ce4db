"""Number literals reach the GPU's kernels exactly, for every dtype: the cases of
tests/literal_cases.py (each dtype's extremes, -0.0, +-inf, NaN, int64's -2^63 and 2^63 - 1, as a
fill, a pad value and a pointwise operand) under the segmenter's plan and the forced grid and
single-block lowerings, bit for bit against PyTorch on the CPU. The CPU twin runs them on the
kernel emulator: tests/test_literal_rendering.py."""

from __future__ import annotations

import pytest

cp = pytest.importorskip("cupy")

import literal_cases as lc  # noqa: E402
from segfuse.compiler.engine import Engine  # noqa: E402
from segfuse.compiler.ir import Fusion  # noqa: E402

from .planned_runtime import runtime  # noqa: E402

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("mode", ["plan", "grid", "block"])
@pytest.mark.parametrize("dt,chunk", lc.cases(), ids=[f"{dt}-{c}" for dt, c in lc.cases()])
def test_literal_extremes_on_the_gpu(dt, chunk, mode):
    graph, ins, want = lc.case(dt, chunk)
    f = Fusion.from_json(graph)
    rt = runtime(mode)
    outs = Engine("cupy").run(f, dict(ins)).outputs if rt is None else rt.run(f, dict(ins))[0]
    for k, w in want.items():
        lc.assert_exact(cp.asnumpy(outs[k]), w, f"{dt} {k} [{mode}] ({graph['ops'][list(want).index(k)]})")
