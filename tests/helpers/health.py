"""Whether the event loop stays free: /v2/health/live probed while a long request is in flight."""

from __future__ import annotations

import asyncio
import time

import httpx

from helpers.waiting import scaled

# A health answer within this is prompt on any machine; before the fixes, a 40 MB JSON body or a
# gzip bomb held every request for the whole decode (over 2 s on a quiet machine).
HEALTH_BOUND_S = scaled(1.0)


async def slowest_health_while(url: str, request) -> tuple[float, int, object, float]:
    """(the slowest /v2/health/live answer, how many answered, the response, how long `request`
    took) while `request` (a coroutine) is in flight."""
    async with httpx.AsyncClient(base_url=url, timeout=scaled(60)) as probe:
        t0 = time.perf_counter()
        task = asyncio.ensure_future(request)
        slowest, answered = 0.0, 0
        while not task.done():
            t = time.perf_counter()
            r = await probe.get("/v2/health/live")
            slowest = max(slowest, time.perf_counter() - t)
            assert r.status_code == 200
            answered += 1
            await asyncio.sleep(0.01)
        response = await task
        return slowest, answered, response, time.perf_counter() - t0


def assert_health_stayed_free(slowest: float, answered: int, took: float, at_least: int) -> None:
    """Health answered `at_least` times while the request ran, each within HEALTH_BOUND_S or a
    third of the request's time, whichever is longer: a loop held by the request answers once,
    after about all of it, however slow the machine; a free one answers promptly throughout."""
    bound = max(HEALTH_BOUND_S, took / 3)
    assert answered >= at_least and slowest < bound, dict(answered=answered, slowest=slowest, took=took, bound=bound)
