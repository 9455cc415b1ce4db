"""`torch.compile(fn, backend="segfuse")`: the parts of a graph segfuse supports become segfuse ops,
Inductor compiles the rest.

The backend is the entry point `segfuse` of the `torch_dynamo_backends` group (pyproject.toml), so
`backend="segfuse"` works without importing segfuse first. For each graph dynamo gives it:

1. Inductor's `compile_fx` runs as for `backend="inductor"` (AOTAutograd's functionalization and
   forward/backward split, `mode`, Inductor's options, CUDA graphs), with two changes: the graph is
   decomposed with the table capture uses (`capture_decompositions`: torch.export's, keeping whole
   the ops segfuse lowers itself), and each forward or inference graph passes through
   `take_subgraphs` before Inductor compiles it.
2. `take_subgraphs` partitions the ATen graph into the largest subgraphs whose nodes segfuse lowers
   (torch.fx's `CapabilityBasedPartitioner`, asking capture's `unsupported_reason`), keeps the ones
   worth a kernel (`worth_a_kernel`), lowers each with `fusion_from_graph` and puts one call of its
   `segfuse.torch` op (a custom op with a fake implementation: an extern call to Inductor) in its place.
3. The graph left is decomposed again with Inductor's own table (it then holds what Inductor expects)
   and compiled by `compile_fx_inner`. Backward graphs go to Inductor whole.

Options (`torch.compile(..., options={...})`): `"segfuse.rest"`: "inductor" (default) or "eager" (the
graph left runs op by op, no Inductor); `"segfuse.fallback"`: "error" (default) or "eager" (when
Inductor fails on a graph, that graph is compiled again with "segfuse.rest": "eager");
`"segfuse.min_ops"`: the smallest subgraph taken (2); every other key is an Inductor option, checked
as `backend="inductor"` checks it. `mode` is Inductor's ("reduce-overhead": CUDA graphs).

Each compiled graph logs one INFO record on `logging.getLogger("segfuse.torch.compile")`: the
subgraphs taken (their ops) and the ops left, with why; the record's `segfuse_stats` attribute holds
them as a `CompileStats`. docs/torch-compile.md says more.
"""

from __future__ import annotations

from .backend import capture_decompositions, segfuse_backend
from .partition import CompileStats, Subgraph, take_subgraphs, worth_a_kernel

__all__ = ["CompileStats", "Subgraph", "capture_decompositions", "segfuse_backend", "take_subgraphs",
           "worth_a_kernel"]
