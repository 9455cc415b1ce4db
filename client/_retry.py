"""The client's retry policy, written once for `Client` and `AsyncClient`.

Connection failures (nothing reached the server: refused, connect timeout) are retried by httpx's
own transport (`httpx.HTTPTransport(retries=...)`), for every request. On top of that, `retrying`
wraps a call (see `_builder`) and drives it step by step: it yields each `httpx.Request` to send
and a float (seconds to sleep) before each retry; the shells send and sleep. It retries

- a 429 (run queue full) or 503 (not ready) answer, for every method: the server refuses those
  before a run is admitted, so a refused `POST .../infer` never ran. It waits `Retry-After`
  seconds (capped at `max_backoff`), or the exponential backoff when the answer names none;
- a connection lost after the request went out (read/write error, a broken response) for
  idempotent methods only (GET, HEAD, PUT, DELETE): a POST may have run, so it is not repeated.

Every wait is stretched by a random factor between 1 and 2 (jitter), so that clients refused
together do not come back together. Health probes (`is_live`, `is_ready`) are not retried on a
status: they answer what the server says now. `retries=0` turns all of it off.
"""

from __future__ import annotations

import random
from collections.abc import Generator
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime

import httpx

from ._builder import PROBE, Call, transport_error

RETRY_STATUSES = frozenset({429, 503})
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE"})

# A step of a retrying call: a request to send, or seconds to sleep before the next attempt.
Flow = Generator["httpx.Request | float", "httpx.Response | None", object]


@dataclass(frozen=True)
class RetryPolicy:
    """`retries` more attempts at most per request; waits of `backoff` * 2**n seconds (n = the
    retry, from 0), or the server's Retry-After, never more than `max_backoff`."""

    retries: int = 3
    backoff: float = 0.25
    max_backoff: float = 10.0

    def __post_init__(self):
        if not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError(f"retries is a count >= 0, not {self.retries!r}")
        if self.backoff < 0 or self.max_backoff < 0:
            raise ValueError("backoff and max_backoff are seconds >= 0")

    def delay(self, retry: int, retry_after: str | None = None) -> float:
        wait = parse_retry_after(retry_after)
        if wait is None:
            wait = self.backoff * 2 ** retry
        return min(self.max_backoff, wait * (1 + random.random()))

    def retries_on_error(self, request: httpx.Request, error: httpx.TransportError) -> bool:
        """A connection lost after sending, on an idempotent request (connect failures are the
        transport's; timeouts are not retried: the request may still be running)."""
        return (request.method in IDEMPOTENT and not isinstance(error, (httpx.ConnectError, httpx.TimeoutException))
                and isinstance(error, (httpx.NetworkError, httpx.RemoteProtocolError)))


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header: delta-seconds or an HTTP date; None if absent or unreadable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - datetime.now(timezone.utc)).total_seconds())


def retrying(call: Call, policy: RetryPolicy) -> Flow:
    """Drive `call`, sending each of its requests again as the policy allows (module docstring).
    The shell sends a yielded request and sends back the response, or throws the
    `httpx.TransportError` in; it sleeps a yielded float and sends back None."""
    try:
        request = next(call)
    except StopIteration as done:
        return done.value
    while True:
        retry = 0
        while True:
            try:
                response = yield request
            except httpx.TransportError as e:
                if retry < policy.retries and policy.retries_on_error(request, e):
                    yield policy.delay(retry)
                    retry += 1
                    continue
                raise transport_error(e, request) from None
            if (retry < policy.retries and response.status_code in RETRY_STATUSES
                    and not request.extensions.get(PROBE)):
                yield policy.delay(retry, response.headers.get("Retry-After"))
                retry += 1
                continue
            break
        try:
            request = call.send(response)
        except StopIteration as done:
            return done.value
