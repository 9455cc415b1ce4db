"""Row normalizations written as graphs, and their PyTorch oracles: softmax,
log_softmax, RMSNorm and LayerNorm over dim 1 of [R, D], in float32 or bfloat16 (computed in
float32, rounded at the output). `composite=True` uses the registry's softmax / log_softmax ops
instead (they decompose into the same primitives, with a -inf pad for a symbolic row length).
Shared by tests/test_row_reduction.py, tests/gpu/test_row_reduction_gpu.py and benchmarks/bench_gpu.py."""

from __future__ import annotations

import workloads
from segfuse.compiler.builder import FusionDefinition
from workloads import EPS, NORMS, torch_norm  # noqa: F401  (shared with the benchmarks)


def norm_graph(kind: str, dtype: str = "float32", composite: bool = False, shape=("R", "D")):
    """The benchmarks' graph (workloads.norm_graph); `composite`: softmax / log_softmax as the registry's ops."""
    if not (composite and kind in ("softmax", "log_softmax")):
        return workloads.norm_graph(kind, dtype, shape)
    with FusionDefinition(f"{kind}_{dtype}_op") as fd:
        x = fd.define_tensor("x", shape=list(shape), dtype=dtype)
        if dtype != "float32":  # an unused cast: these graphs have always carried it (kernel digests)
            fd.ops.cast(x, "float32")
        y = getattr(fd.ops, kind)(x, 1, "float32")
        fd.add_output(y if dtype == "float32" else fd.ops.cast(y, dtype), "y")
    return fd.fusion()


def norm_inputs(kind: str, R: int, D: int, dtype: str = "float32", seed: int = 0, special: bool = False):
    """NumPy inputs; `special`: row 0 all -inf (softmax family only), row 1 with a +inf... kept
    finite for the norms (their oracle is NaN there as well), large magnitudes in the last row."""
    import ml_dtypes
    import numpy as np

    rng = np.random.default_rng(seed)
    np_dt = np.float32 if dtype == "float32" else ml_dtypes.bfloat16
    x = (rng.standard_normal((R, D)) * 3).astype(np.float32)
    if special and R >= 3 and D:
        if kind in ("softmax", "log_softmax"):
            x[0] = -np.inf
            x[1, D // 2] = -np.inf
        x[R - 1] *= 1e4
    out = {"x": x.astype(np_dt)}
    if kind in ("rmsnorm", "layernorm"):
        out["w"] = rng.standard_normal(D).astype(np_dt)
    if kind == "layernorm":
        out["b"] = rng.standard_normal(D).astype(np_dt)
    return out
