"""Small constant tensors written into the graph: what torch.export lifts out of a function
(`torch.tensor(3.0)`, the value of `x[i] = 2.0` or `w[mask] = 0.0`, `torch.tensor([1, 2, 3])`).

A graph has no constant buffers; a constant of up to `MAX_CONSTANT_ELEMENTS` elements becomes
creation ops that compute it: `full` for one value (every 0-d constant), else the `cat` of one `full`
per run of equal values of the flattened constant, reshaped to its shape. Larger constants are
refused: a graph that spells them out element by element would be larger than the work it does.
"""

from __future__ import annotations

import torch
from segfuse.compiler.builder import FusionDefinition, Tensor
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily

from .errors import CaptureError
from .sizes import supported_dtypes_text, torch_to_dtype

__all__ = ["MAX_CONSTANT_ELEMENTS", "constant_tensor", "small_constant", "too_large"]

MAX_CONSTANT_ELEMENTS = 64


def too_large(value: torch.Tensor) -> bool:
    return value.numel() > MAX_CONSTANT_ELEMENTS


def small_constant(gm: torch.fx.GraphModule, node: torch.fx.Node) -> torch.Tensor | None:
    """The tensor a get_attr node of `gm` reads, where it is a constant this module writes into a
    graph (not a parameter, a FakeTensor, or larger than MAX_CONSTANT_ELEMENTS)."""
    if node.op != "get_attr":
        return None
    value = gm
    for part in str(node.target).split("."):
        value = getattr(value, part, None)
    if not isinstance(value, torch.Tensor) or isinstance(value, (torch.nn.Parameter, FakeTensor)) \
            or too_large(value):
        return None
    return value


def constant_tensor(fd: FusionDefinition, value: torch.Tensor, what: str) -> Tensor:
    """`value` (a real tensor of at most MAX_CONSTANT_ELEMENTS elements) as ops of `fd`; `what`
    names it in a refusal."""
    dt = torch_to_dtype(value.dtype)
    if dt is None:
        raise CaptureError(f"its dtype {value.dtype} is not supported by segfuse", op=what,
                           alternative=supported_dtypes_text())
    if too_large(value):
        raise CaptureError(f"a constant of {value.numel()} elements (segfuse writes constants of up to "
                           f"{MAX_CONSTANT_ELEMENTS} into the graph)", op=what)
    shape = list(value.shape)
    with unset_fake_temporarily():  # (a real tensor, read where a fake mode may be active: torch.compile's)
        flat = value.detach().cpu().reshape(-1).tolist()
    runs: list[list] = []  # [value, count] per run of equal values (-0.0 and 0.0 differ, NaN is one)
    for v in flat:
        if runs and repr(runs[-1][0]) == repr(v):
            runs[-1][1] += 1
        else:
            runs.append([v, 1])
    ops = fd.ops
    if len(runs) <= 1:
        return ops.full(shape, runs[0][0] if runs else 0, dt.value)
    out = ops.cat([ops.full([count], v, dt.value) for v, count in runs], 0)
    return out if len(shape) == 1 else ops.reshape(out, shape)
