"""segfuse inside PyTorch programs: fusions as torch ops on torch tensors (the `torch` extra).

    import segfuse.torch
    prologue = segfuse.torch.fusion(graph)          # a dict, JSON, a path, a FusionDefinition or a Fusion
    counts, offsets = prologue(topk_ids)            # torch tensors in, torch tensors out

- CPU tensors run on the NumPy backend; CUDA tensors run on `torch.cuda.current_stream()` with no
  copies (inputs as CuPy views of their pointers, outputs on storages of torch's caching allocator)
  and no host synchronization, capturable in `torch.cuda.graph` (run the op or `op.warmup(...)`
  once first).
- The op is a `torch.library` custom op (`op.op`, `torch.ops.segfuse.f_<id>`) with a fake
  implementation, so `torch.compile(fullgraph=True)` traces through it. Eager calls on plain
  tensors skip the dispatcher (torch_ext/op.py says when).
- Device errors (a bad index) are reported by a later call, or by `check()`, as a
  `DeferredRunError` naming the graph, the op and the index.
"""

from __future__ import annotations

from .op import TorchFusion, register

__all__ = ["TorchFusion", "capture", "check", "fusion"]


def capture(fn, *example_inputs, name=None, dynamic=None):
    """`fn`, a PyTorch function, as a segfuse `FusionDefinition` traced with torch.export on
    `example_inputs`; `dynamic` makes dims size symbols (torch_ext/capturing/__init__.py says how)."""
    from .capturing import capture as _capture

    return _capture(fn, *example_inputs, name=name, dynamic=dynamic)


def fusion(graph) -> TorchFusion:
    """The fusion `graph` as a callable on torch tensors (one per distinct graph in a process)."""
    from segfuse.compiler import Fusion, load_fusion

    f = graph if isinstance(graph, Fusion) else load_fusion(graph)
    return register(f)


def check() -> None:
    """Wait for the device and raise the first failure of any earlier CUDA call or CUDA graph
    replay of a segfuse.torch op (a `DeferredRunError`); the failure is then cleared, and later
    calls run as usual. A no-op before the first CUDA call."""
    import torch

    from . import cuda_path

    if not cuda_path._CUDA:
        return
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError("segfuse.torch.check() synchronizes, so it cannot be called during a CUDA graph capture")
    torch.cuda.synchronize()
    cuda_path._CUDA[0].errors.raise_failures()
