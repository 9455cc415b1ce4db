"""Per-fusion inference statistics in Triton's shape (GET /v2/models[/{m}[/versions/1]]/stats).

The run path calls `record_ok` / `record_fail` where a run ends (on the event loop). Durations come
from the run's `timings_us` and are mapped onto Triton's fields as follows:

- success: runs that succeeded, admission to done (`total`); fail: runs admitted that failed
  (bind or run errors, out of memory, parameters.timeout), admission to failure;
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

import time
from dataclasses import dataclass, field

from segfuse.compiler import Fusion

DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
             "cache_hit", "cache_miss")


@dataclass
class _Entry:
    last_inference_ms: int = 0
    inference_count: int = 0
    execution_count: int = 0
    counts: dict = field(default_factory=lambda: dict.fromkeys(DURATIONS, 0))
    ns: dict = field(default_factory=lambda: dict.fromkeys(DURATIONS, 0))

    def add(self, what: str, us: float) -> None:
        self.counts[what] += 1
        self.ns[what] += max(0, int(us * 1000))


class StatsRecorder:
    def __init__(self, registry):
        self.registry = registry  # FusionRegistry: entries of fusions it no longer has are dropped
        self._by_id: dict[str, _Entry] = {}

    def _entry(self, fusion: Fusion) -> _Entry:
        e = self._by_id.get(fusion.id)
        if e is None:
            if len(self._by_id) > 2 * len(self.registry) + 16:
                self._by_id = {k: v for k, v in self._by_id.items() if self.registry.has_id(k)}
            e = self._by_id[fusion.id] = _Entry()
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

    def record_fail(self, fusion: Fusion, t_admit: float) -> None:
        """Count a run that was admitted and failed (t_admit: its time.perf_counter() at admission)."""
        self._entry(fusion).add("fail", (time.perf_counter() - t_admit) * 1e6)

    def forget(self, fusion_id: str) -> None:
        self._by_id.pop(fusion_id, None)

    def model_stats(self, fusion: Fusion, version: str) -> dict:
        e = self._by_id.get(fusion.id) or _Entry()
        d = {k: {"count": e.counts[k], "ns": e.ns[k]} for k in DURATIONS}
        batch = [{"batch_size": 1, **{k: d[k] for k in ("compute_input", "compute_infer", "compute_output")}}]
        return {"name": fusion.name, "version": version, "last_inference": e.last_inference_ms,
                "inference_count": e.inference_count, "execution_count": e.execution_count,
                "inference_stats": d, "response_stats": {}, "batch_stats": batch if e.execution_count else [],
                "memory_usage": []}
