"""Small value types the client takes and returns."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ._arrays import as_numpy_dtype


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
class Region:
    """A shared-memory region registered on the server (system or CUDA, Triton's extensions), or
    a tensor in one: `offset` and `byte_size` are bytes from the start of the region.

    As an input, the server reads the tensor in place; it needs `dtype` and `shape` (`tensor()`
    sets them, and `byte_size` with them). As an output, the result is written into the region
    when the run succeeded, and `byte_size` (its room for the output) is required. The
    `register_*_shared_memory` methods return the Region they registered.
    """

    name: str
    offset: int = 0
    byte_size: int | None = None
    dtype: Any = None  # a NumPy dtype (or its name); inputs only
    shape: tuple | None = None  # inputs only

    def tensor(self, dtype, shape, offset: int | None = None) -> Region:
        """The same region holding one tensor of `dtype` and `shape` at `offset` (default: this one's)."""
        dt = as_numpy_dtype(dtype)
        shape = tuple(int(d) for d in shape)
        return replace(self, dtype=dt, shape=shape, offset=self.offset if offset is None else int(offset),
                       byte_size=math.prod(shape) * dt.itemsize)


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
    to its buffer name, `regions` each output written to shared memory to its region. `timings_us` and the cache counters are the server's report.
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
    regions: dict[str, str] = field(default_factory=dict)

    def __getitem__(self, name: str) -> np.ndarray:
        try:
            return self.outputs[name]
        except KeyError:
            where = f" (stored in buffer '{self.buffers[name]}')" if name in self.buffers else \
                f" (written to shared memory region '{self.regions[name]}')" if name in self.regions else ""
            raise KeyError(f"no array for output '{name}'{where}") from None

    def __contains__(self, name: str) -> bool:
        return name in self.outputs
