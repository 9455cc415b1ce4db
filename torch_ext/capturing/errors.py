"""`CaptureError`: why a PyTorch function could not become a segfuse graph."""

from __future__ import annotations

from segfuse.compiler.errors import GraphError


class CaptureError(GraphError):
    """A part of the traced function segfuse cannot express: an ATen op with no segfuse equivalent,
    data-dependent control flow, an unsupported dtype, an argument value the mapping does not take.

    `.op` names what was refused (an ATen op such as "aten.nonzero.default", or "input x",
    "control flow"); `.location` is "file:line" in the user's source where torch.export recorded
    it (None when it did not); `.alternative` is the nearest supported way to write it, if any.
    The message says all three."""

    def __init__(self, message: str, *, op: str | None = None, location: str | None = None,
                 alternative: str | None = None):
        self.op, self.location, self.alternative, self.reason = op, location, alternative, message
        text = message
        if op:
            text = f"{op}: {text}"
        if location:
            text = f"{text} (at {location})"
        if alternative:
            text = f"{text}; instead: {alternative}"
        super().__init__(text)
