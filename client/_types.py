"""Small value types the client takes and returns."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class Buffer:
    """A named buffer stored on the server.

    As an input, the run reads it in place of sending data. As an output, the run stores the
    result under this name instead of returning it (`overwrite=True` replaces an existing
    buffer of that name; without it the server refuses to clobber one).
    """

    name: str
    overwrite: bool = False


@dataclass(frozen=True)
class FusionRef:
    """A fusion registered on the server; pass it to `run` or `plan` instead of the graph."""

    id: str
    name: str
    info: dict = field(default_factory=dict, compare=False, repr=False)  # the server's full answer


@dataclass
class RunResult:
    """What one run returned.

    `outputs` holds the arrays that came back; `buffers` maps each output stored on the server
    to its buffer name. `timings_us` and the cache counters are the server's report.
    """

    model_name: str
    id: str | None  # the request id, echoed
    fusion_id: str  # content hash of the graph that ran
    outputs: dict[str, np.ndarray]
    buffers: dict[str, str]
    timings_us: dict[str, float]
    cache_hits: int
    cache_misses: int
    parameters: dict = field(default_factory=dict, repr=False)  # the response's raw parameters

    def __getitem__(self, name: str) -> np.ndarray:
        try:
            return self.outputs[name]
        except KeyError:
            where = f" (stored in buffer '{self.buffers[name]}')" if name in self.buffers else ""
            raise KeyError(f"no array for output '{name}'{where}") from None

    def __contains__(self, name: str) -> bool:
        return name in self.outputs
