"""`Engine`: the one entry point that runs fusions, whatever the backend.

The server, the CLI and `FusionDefinition.execute` all go through it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .ir import Fusion
from .numpy_backend import run_graph


@dataclass
class RunResult:
    outputs: dict[str, object]
    timings_us: dict[str, float] = field(default_factory=dict)  # plan, compile, run
    cache_hits: int = 0
    cache_misses: int = 0


class Engine:
    """Runs fusions on one backend ('numpy' now; 'cupy' with the GPU backend)."""

    _defaults: dict[str, Engine] = {}

    def __init__(self, backend: str = "numpy"):
        if backend not in ("numpy",):
            raise ValueError(f"unknown backend '{backend}' (available: numpy)")
        self.backend = backend

    @classmethod
    def default(cls, backend: str = "numpy") -> Engine:
        if backend not in cls._defaults:
            cls._defaults[backend] = cls(backend)
        return cls._defaults[backend]

    @property
    def device(self) -> str:
        return "cpu"

    def run(self, fusion: Fusion, inputs: dict[str, np.ndarray]) -> RunResult:
        t0 = time.perf_counter()
        outs = run_graph(fusion, inputs)
        return RunResult(outputs=outs, timings_us={"plan": 0.0, "compile": 0.0,
                                                   "run": (time.perf_counter() - t0) * 1e6})
