"""Server settings: one dataclass, defaults overridable by SEGFUSE_* environment variables and by
`segfuse serve` flags (flags win over the environment, the environment over the defaults)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields

MiB = 1 << 20
GiB = 1 << 30


@dataclass
class Settings:
    host: str = "127.0.0.1"
    port: int = 8000
    backend: str = "auto"  # auto | cupy | numpy
    device: int = 0
    cache_dir: str | None = None  # kernel cache: segfuse's cubins in kernels/, CuPy's in cupy/
    fusion_dir: str | None = None  # fusion repository: *.json registered at start, registrations kept there
    token: str | None = None  # bearer token; None or "" = no auth
    # Limits (413 beyond, except max_queued_runs: 429).
    max_body_bytes: int = 256 * MiB
    max_ops: int = 4096
    max_rank: int = 8
    max_buffer_bytes: int = 4 * GiB
    max_total_bytes: int = 32 * GiB
    max_region_bytes: int = 64 * GiB  # shared-memory regions registered, all together (server/regions.py)
    max_queued_runs: int = 256  # runs admitted (waiting or running) before new ones get 429
    max_fusions: int = 1024  # registered fusions (unloaded ones kept for reload count too), 413 beyond
    max_fusion_bytes: int = 64 * MiB  # their canonical JSON together (server/fusions.py graph_bytes), 413 beyond
    run_workers: int = 1  # threads that run fusions (each on its own CUDA stream)
    max_batch: int = 32  # runs a worker takes from the queue at once (launched back to back, one wait)
    log_level: str = "info"
    log_format: str = "text"  # text (uvicorn's lines) | json (one object per line, server/logs.py)
    extra: dict = field(default_factory=dict)

    ENV_PREFIX = "SEGFUSE_"

    @classmethod
    def from_env(cls, environ: dict | None = None, **overrides) -> Settings:
        """Defaults, then SEGFUSE_<FIELD> variables, then `overrides` whose value is not None."""
        env = os.environ if environ is None else environ
        values = {}
        for f in fields(cls):
            if f.name == "extra":
                continue
            raw = env.get(cls.ENV_PREFIX + f.name.upper())
            if raw is not None:
                values[f.name] = _parse(f.name, raw, f.type)
        values.update({k: v for k, v in overrides.items() if v is not None})
        s = cls(**values)
        s.check()
        return s

    def check(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0-65535, not {self.port}")
        if self.log_format not in ("text", "json"):
            raise ValueError(f"log_format must be text or json, not '{self.log_format}'")
        if self.backend not in ("auto", "cupy", "numpy"):
            raise ValueError(f"backend must be auto, cupy or numpy, not '{self.backend}'")
        for name in ("max_body_bytes", "max_ops", "max_rank", "max_buffer_bytes", "max_total_bytes",
                     "max_region_bytes", "max_queued_runs", "run_workers", "max_batch", "max_fusions",
                     "max_fusion_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")


def _parse(name: str, raw: str, typ) -> object:
    typ = str(typ)
    try:
        if typ.startswith("int"):
            return parse_size(raw)
    except ValueError:
        raise ValueError(f"{Settings.ENV_PREFIX}{name.upper()}={raw!r} is not an integer") from None
    return raw


_UNITS = {"k": 1 << 10, "m": MiB, "g": GiB, "t": 1 << 40}


def parse_size(text: str | int) -> int:
    """'64M', '2G', '1024', '8k' -> bytes (binary units). Plain integers pass through."""
    if isinstance(text, int):
        return text
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    if t and t[-1] in _UNITS:
        return int(float(t[:-1]) * _UNITS[t[-1]])
    return int(t)
