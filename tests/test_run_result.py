"""`RunResult`: a fast-path run keeps only its run time and builds the timings dict when read; the
other runs pass theirs. Both read the same way (compiler/engine.py)."""

from __future__ import annotations

import numpy as np
import pytest
from segfuse.compiler.engine import Engine, RunResult, _fast_result
from segfuse.compiler.ir import Fusion

GRAPH = {"format": "segfuse.fusion/1", "name": "add1",
         "inputs": [{"name": "x", "dtype": "float32", "shape": ["N"]}],
         "ops": [{"op": "add", "out": "y", "inputs": ["x", 1.0]}], "outputs": ["y"]}


def test_a_fast_result_reads_like_a_full_one():
    out = {"y": np.zeros(3)}
    fast = _fast_result(out, 12.5)
    assert fast.outputs is out and (fast.cache_hits, fast.cache_misses) == (1, 0)
    assert fast.timings_us == {"plan": 0.0, "compile": 0.0, "run": 12.5}
    assert fast.timings_us is fast.timings_us  # built once, then the same dict
    assert fast == RunResult(out, {"plan": 0.0, "compile": 0.0, "run": 12.5}, 1, 0)
    assert "run': 12.5" in repr(fast)
    fast.timings_us = {"run": 1.0}
    assert fast.timings_us == {"run": 1.0}
    with pytest.raises(TypeError):
        hash(fast)


def test_an_engine_run_reports_its_timings_and_cache_counts():
    f = Fusion.from_json(GRAPH)
    eng = Engine("numpy")
    x = np.arange(4, dtype=np.float32)
    first, second = eng.run(f, {"x": x}), eng.run(f, {"x": x})
    np.testing.assert_array_equal(second.outputs["y"], x + 1)
    assert {"plan", "compile", "run"} <= set(first.timings_us) and first.timings_us["run"] >= 0
    assert (second.cache_hits, second.cache_misses) == (1, 0)
    assert RunResult({}).timings_us == {}
