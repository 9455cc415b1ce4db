"""`PlanCache`: plans cached per (fusion, shape class), like nvFuser's FusionExecutorCache.

A lookup first narrows by the fusion and the 0/1/n class of every size symbol, then replays the
size tests recorded with each cached plan (`Checks.replay`); a plan whose tests all give the
same answers at the new sizes is exactly the plan the segmenter would make, so it is reused
without planning. Least recently used entries are dropped beyond `capacity`.

Replaying the size tests costs about 100 us (sympy), too much for a serving hot path that sees
the same sizes again and again; so the answer for each exact set of sizes is memoized too.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from ..ir import Bound, Fusion
from ..plan import Plan
from .capability import DEFAULT_CAPABILITY, Capability
from .pipeline import plan_checks, segment
from .shapes import base_key


class PlanCache:
    def __init__(self, capacity: int = 256, cap: Capability = DEFAULT_CAPABILITY):
        self.capacity, self.cap = capacity, cap
        self._entries: OrderedDict = OrderedDict()  # (fusion id, base key) -> [Plan, ...]
        self._exact: OrderedDict = OrderedDict()  # (fusion id, exact sizes) -> Plan
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def cached(self, fusion: Fusion, bound: Bound) -> Plan | None:
        """The plan remembered for exactly these sizes, or None; never plans (a server asks
        before it runs: a run that would plan is planned elsewhere first, under a budget)."""
        with self._lock:
            return self._exact.get((fusion.id, tuple(sorted(bound.env.items()))))

    def get(self, fusion: Fusion, bound: Bound) -> tuple[Plan, bool]:
        """(plan, hit) for the run's sizes."""
        exact_key = (fusion.id, tuple(sorted(bound.env.items())))
        with self._lock:
            plan = self._exact.get(exact_key)
            if plan is not None:
                self._exact.move_to_end(exact_key)
                self.hits += 1
                return plan, True
        key = (fusion.id, base_key(bound.env))
        with self._lock:
            for plan in self._entries.get(key, []):
                exact = plan.heuristics.get("exact_sizes")
                if plan_checks(plan).replay(bound.env) and (not exact or plan_checks(plan).env == bound.env):
                    self._entries.move_to_end(key)
                    self._remember(exact_key, plan)
                    self.hits += 1
                    return plan, True
        plan = segment(fusion, bound, self.cap)
        with self._lock:
            self._entries.setdefault(key, []).append(plan)
            self._entries.move_to_end(key)
            while sum(len(v) for v in self._entries.values()) > self.capacity:
                oldest = next(iter(self._entries))
                self._entries[oldest].pop(0)
                if not self._entries[oldest]:
                    del self._entries[oldest]
            self._remember(exact_key, plan)
            self.misses += 1
        return plan, False

    def _remember(self, exact_key, plan: Plan) -> None:
        # caller holds the lock
        self._exact[exact_key] = plan
        while len(self._exact) > 4 * self.capacity:
            self._exact.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._exact.clear()


# The process's plan cache: every Engine's unless given one, and the CUDA runtime's for runs it is
# handed no plan for (plans depend on the graph and the shape class only).
SHARED_PLANS = PlanCache()
