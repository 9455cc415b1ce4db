"""Waiting for a condition, never for a speed: limits are hang guards, scaled for a loaded machine.

SCALE multiplies every limit: SEGFUSE_TEST_TIMEOUT_SCALE where set, else the machine's load per
core when the session starts (at least 1, at most 10), so that a machine many jobs share waits
longer without being told. A limit only ends a wait that would otherwise hang."""

from __future__ import annotations

import os
import time
from collections.abc import Callable


def _scale() -> float:
    given = os.environ.get("SEGFUSE_TEST_TIMEOUT_SCALE")
    if given:
        return max(1.0, float(given))
    try:
        cores = len(os.sched_getaffinity(0))  # the cores this process may use, not the host's
    except AttributeError:
        cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0] / cores
    except OSError:  # no load average on this platform
        load = 1.0
    return min(10.0, max(1.0, load))


SCALE = _scale()


def scaled(seconds: float) -> float:
    """A hang guard of `seconds` on a quiet machine, stretched by SCALE."""
    return seconds * SCALE


def wait_until(condition: Callable[[], object], seconds: float, what: str, poll: float = 0.05):
    """Poll `condition` until it returns something truthy and return that; AssertionError naming
    `what` once `seconds` (scaled) have passed without it."""
    deadline = time.monotonic() + scaled(seconds)
    while True:
        got = condition()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not after {scaled(seconds):.0f} s")
        time.sleep(poll)
