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
    # GET /metrics also on this port (Triton's --metrics-port, 8002 there), without the token; None: off
    metrics_port: int | None = None
    # KServe v2 gRPC (server/grpc; the grpc extra) on this port beside HTTP, same host; None: off (Triton's is 8001)
    grpc_port: int | None = None
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
    max_regions: int = 1024  # shared-memory regions registered (each system region holds a descriptor), 413 beyond
    max_queued_runs: int = 256  # runs admitted (waiting or running) before new ones get 429
    max_fusions: int = 1024  # registered fusions (unloaded ones kept for reload count too), 413 beyond
    max_fusion_bytes: int = 64 * MiB  # their canonical JSON together (server/fusions.py graph_bytes), 413 beyond
    # The budget of validating one graph and of planning one run's shape class (compiler/limits.py), 413 beyond:
    max_plan_work: int = 1_000_000  # work units (segmenter steps visited, size expressions simplified)
    max_plan_seconds: float = 10.0  # wall-clock seconds
    max_run_bytes: int = 16 * GiB  # memory one run may need (its buffers, scratch, inline outputs), 413 beyond
    # Connections (server/http_limits.py): 431 past the header bytes, 408 (and a close) past a timeout.
    max_header_bytes: int = 64 * 1024  # a request's line and headers together
    header_timeout: float = 10.0  # seconds from connecting (or a later request's first byte) to the headers' end
    body_timeout: float = 30.0  # seconds without a byte of an unfinished body while the server reads it
    keep_alive_timeout: float = 5.0  # seconds an idle keep-alive connection is kept (uvicorn's timeout_keep_alive)
    run_workers: int = 1  # threads that run fusions (each on its own CUDA stream)
    max_batch: int = 32  # runs a worker takes from the queue at once (launched back to back, one wait)
    log_level: str = "info"
    log_format: str = "text"  # text (uvicorn's lines) | json (one object per line, server/logs.py)
    # uvicorn's line per request: off as in Triton (its --log-verbose adds them), since it costs throughput
    access_log: bool = False
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
        if self.metrics_port is not None:
            if not 0 <= self.metrics_port <= 65535:
                raise ValueError(f"metrics_port must be 0-65535, not {self.metrics_port}")
            if self.metrics_port == self.port != 0:
                raise ValueError(f"metrics_port must differ from port ({self.port}): /metrics is served on "
                                 "the HTTP port already")
            if self.metrics_port == self.grpc_port != 0:
                raise ValueError(f"metrics_port must differ from grpc_port ({self.metrics_port})")
        if self.grpc_port is not None:
            if not 0 <= self.grpc_port <= 65535:
                raise ValueError(f"grpc_port must be 0-65535, not {self.grpc_port}")
            if self.grpc_port == self.port != 0:
                raise ValueError(f"grpc_port must differ from port ({self.port}): HTTP listens there")
        if self.log_format not in ("text", "json"):
            raise ValueError(f"log_format must be text or json, not '{self.log_format}'")
        if self.backend not in ("auto", "cupy", "numpy"):
            raise ValueError(f"backend must be auto, cupy or numpy, not '{self.backend}'")
        for name in ("max_body_bytes", "max_ops", "max_rank", "max_buffer_bytes", "max_total_bytes",
                     "max_region_bytes", "max_regions", "max_queued_runs", "run_workers", "max_batch", "max_fusions",
                     "max_fusion_bytes", "max_plan_work", "max_run_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if not self.max_plan_seconds > 0:
            raise ValueError("max_plan_seconds must be more than 0 seconds")
        for name in ("header_timeout", "body_timeout", "keep_alive_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be more than 0 seconds")
        if self.max_header_bytes < 1024:
            raise ValueError("max_header_bytes must be at least 1024")


def _parse(name: str, raw: str, typ) -> object:
    typ = str(typ)
    try:
        if typ.startswith("int"):
            return parse_size(raw)
    except ValueError:
        raise ValueError(f"{Settings.ENV_PREFIX}{name.upper()}={raw!r} is not an integer") from None
    if typ == "bool":
        flag = _BOOLEANS.get(raw.strip().lower())
        if flag is None:
            raise ValueError(f"{Settings.ENV_PREFIX}{name.upper()}={raw!r} is not a boolean (1/0, true/false, "
                             "yes/no, on/off)")
        return flag
    if typ.startswith("float"):
        try:
            return float(raw)
        except ValueError:
            raise ValueError(f"{Settings.ENV_PREFIX}{name.upper()}={raw!r} is not a number") from None
    return raw


_BOOLEANS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False,
             "": False}

_UNITS = {"k": 1 << 10, "m": MiB, "g": GiB, "t": 1 << 40}


def parse_size(text: str | int) -> int:
    """'64M', '2G', '1024', '8k' -> bytes (binary units). Plain integers pass through."""
    if isinstance(text, int):
        return text
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    if t and t[-1] in _UNITS:
        return int(float(t[:-1]) * _UNITS[t[-1]])
    return int(t)
