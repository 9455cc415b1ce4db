"""Per-fusion inference statistics in Triton's shape (GET /v2/models[/{m}[/versions/1]]/stats), the one
record that Triton's metric families (server/triton_metrics.py) and `segfuse_infer_rejected_total` are
read from too.

Every front door (the HTTP routes, the fast lane, gRPC) counts through these calls, on the event loop:
- `record_rejected(fusion, error)`: a request refused before its fusion ran (the request disagrees with
  the fusion, a buffer it names is missing, a limit, a full run queue): not a run, so neither a success
  nor a failure here, as in Triton 2.51; counted by reason (`REJECTION_REASONS`) in
  `segfuse_infer_rejected_total`. server/routers/infer.py calls it for decoding and parsing errors,
  server/runs.py from admission on; a request cancelled while it waited counts as a CANCELED failure;
- `record_ok(fusion, outcome)` / `record_fail(fusion, t_admit, reason)`: a run that ended (server/runs.py),
  the failure with Triton's `reason` (`FAILURE_REASONS`).

Durations come from the run's `timings_us` and are mapped onto Triton's fields as follows:

- success: runs that succeeded, admission to done (`total`); fail: runs that failed (run errors, out of
  memory: BACKEND; `parameters.timeout` passed before the run started: REJECTED, as Triton's queue
  timeout), admission to failure;
- queue: admission until the pins were held and the run was handed to a worker (`queue`);
- compute_input: the engine preparing the run, planning and (on a cold cache) compiling
  (`plan` + `compile`);
- compute_infer: the engine executing the plan (`run`);
- compute_output: the rest of `total`: host transfers of inline inputs and returned outputs,
  output copies and binding stored buffers;
- cache_hit / cache_miss: Triton's response cache; segfuse has none, so they stay 0 (the engine's
  plan and kernel cache is reported in the response parameters and in /metrics).

Keyed by fusion id: a name registered again with another graph starts from zero.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from segfuse.compiler import Fusion
from segfuse.compiler.errors import SegfuseError

DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
             "cache_hit", "cache_miss")
# Triton's `reason` label of nv_inference_request_failure, in the order Triton 2.51 lists them.
FAILURE_REASONS = ("OTHER", "CANCELED", "BACKEND", "REJECTED")
# segfuse_infer_rejected_total's `reason` label: a closed set, from the refusal's status.
REJECTION_REASONS = ("invalid", "not_found", "conflict", "too_large", "queue_full", "unavailable", "other")
_REASON_OF_STATUS = {400: "invalid", 404: "not_found", 409: "conflict", 413: "too_large", 429: "queue_full",
                     503: "unavailable"}


def _status(error: BaseException) -> int | None:
    status = getattr(error, "status", None) or getattr(error, "status_code", None)  # ApiError, HTTPException
    if isinstance(status, int):
        return status
    if isinstance(error, SegfuseError):  # the graph refused the inputs: an invalid request (400)
        return 400
    if isinstance(error, MemoryError):  # answered 413 (server/errors.py)
        return 413
    return None


def rejection_reason(error: BaseException) -> str:
    """The `reason` of a request refused before its fusion ran, from the status it is answered with
    (pydantic's and FastAPI's validation errors are 400s too)."""
    status = _status(error)
    if status is None and type(error).__name__ in ("ValidationError", "RequestValidationError"):
        return "invalid"
    return _REASON_OF_STATUS.get(status, "other")


def failure_reason(error: BaseException) -> str:
    """Triton's `reason` of a run that failed: REJECTED for parameters.timeout passed before it started
    (the only 429 after admission), CANCELED, BACKEND for what the engine or the device raised,
    OTHER for the rest (a shared-memory region that went away meanwhile)."""
    if isinstance(error, asyncio.CancelledError):
        return "CANCELED"
    status = _status(error)
    if status == 429:
        return "REJECTED"
    if isinstance(error, SegfuseError) or status in (None, 413):  # RunError, device out of memory, a bug
        return "BACKEND"
    return "OTHER"


@dataclass
class _Entry:
    last_inference_ms: int = 0
    inference_count: int = 0
    execution_count: int = 0
    counts: dict = field(default_factory=lambda: dict.fromkeys(DURATIONS, 0))
    ns: dict = field(default_factory=lambda: dict.fromkeys(DURATIONS, 0))
    failures: dict = field(default_factory=lambda: dict.fromkeys(FAILURE_REASONS, 0))
    rejected: dict = field(default_factory=lambda: dict.fromkeys(REJECTION_REASONS, 0))

    def add(self, what: str, us: float) -> None:
        self.counts[what] += 1
        self.ns[what] += max(0, int(us * 1000))


@dataclass(frozen=True)
class FusionCounts:
    """One fusion's counts as the metrics read them (a copy: a scrape may run on another thread)."""

    name: str
    inference_count: int
    execution_count: int
    counts: dict
    ns: dict
    failures: dict
    rejected: dict


class StatsRecorder:
    def __init__(self, registry):
        self.registry = registry  # FusionRegistry: entries of fusions it no longer has are dropped
        self._by_id: dict[str, _Entry] = {}

    def _entry(self, fusion: Fusion, ran: bool = True) -> _Entry:
        e = self._by_id.get(fusion.id)
        if e is None:
            if len(self._by_id) > 2 * len(self.registry) + 16:
                self._by_id = {k: v for k, v in self._by_id.items() if self.registry.has_id(k)}
            e = self._by_id[fusion.id] = _Entry()
        if ran:
            e.last_inference_ms = int(time.time() * 1000)
        return e

    def record_ok(self, fusion: Fusion, outcome):
        """Count a successful run from its RunOutcome; returns the outcome."""
        t = outcome.params.get("timings_us", {})
        e = self._entry(fusion)
        e.inference_count += 1
        e.execution_count += 1
        total, queue = t.get("total", 0.0), t.get("queue", 0.0)
        prepare = t.get("plan", 0.0) + t.get("compile", 0.0)
        infer = t.get("run", 0.0)
        e.add("success", total)
        e.add("queue", queue)
        e.add("compute_input", prepare)
        e.add("compute_infer", infer)
        e.add("compute_output", total - queue - prepare - infer)
        return outcome

    def record_fail(self, fusion: Fusion, t_admit: float, reason: str = "BACKEND") -> None:
        """Count a run that was admitted and failed (t_admit: its time.perf_counter() at admission;
        reason: one of FAILURE_REASONS, `failure_reason` of its error)."""
        e = self._entry(fusion)
        e.add("fail", (time.perf_counter() - t_admit) * 1e6)
        e.failures[reason] += 1

    def record_rejected(self, fusion: Fusion, error: BaseException, t_admit: float | None = None) -> None:
        """Count a request on `fusion` refused before it ran, by `rejection_reason(error)`; one cancelled
        while it waited (t_admit: when it was admitted) is a CANCELED failure instead, as in Triton."""
        if t_admit is not None and isinstance(error, asyncio.CancelledError):
            self.record_fail(fusion, t_admit, "CANCELED")
            return
        self._entry(fusion, ran=False).rejected[rejection_reason(error)] += 1

    def forget(self, fusion_id: str) -> None:
        self._by_id.pop(fusion_id, None)

    def counts(self) -> list[FusionCounts]:
        """Every registered fusion's counts (zeros for one without any), in the stats route's order."""
        out = []
        for f in self.registry.all():
            e = self._by_id.get(f.id) or _Entry()
            out.append(FusionCounts(f.name, e.inference_count, e.execution_count, dict(e.counts), dict(e.ns),
                                    dict(e.failures), dict(e.rejected)))
        return out

    def model_stats(self, fusion: Fusion, version: str) -> dict:
        e = self._by_id.get(fusion.id) or _Entry()
        d = {k: {"count": e.counts[k], "ns": e.ns[k]} for k in DURATIONS}
        batch = [{"batch_size": 1, **{k: d[k] for k in ("compute_input", "compute_infer", "compute_output")}}]
        return {"name": fusion.name, "version": version, "last_inference": e.last_inference_ms,
                "inference_count": e.inference_count, "execution_count": e.execution_count,
                "inference_stats": d, "response_stats": {}, "batch_stats": batch if e.execution_count else [],
                "memory_usage": []}
