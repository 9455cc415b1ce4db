"""KServe v2 / Triton protocol rules that are not about tensors: the one model version, names that
routes reserve, the KServe fields of an infer body and Triton's request parameters.

Decisions (docs/http-api.md, "Request parameters"), where Triton 2.51 is the reference:
- every fusion has exactly one version, "1"; any other version in a URL or body is 404 / 400;
- `parameters.timeout` (Triton: microseconds) is honoured: a run that has not started on a worker
  within it fails with 429 and Retry-After, like a full run queue (Triton answers 503 "Request
  timeout expired"; here 503 means "not ready");
- `parameters.priority` is accepted and has no effect: runs wait in one queue in arrival order
  (requests that carry one are counted, `segfuse_infer_priority_requests_total`);
- `sequence_id`/`sequence_start`/`sequence_end` are accepted and ignored, as Triton does for a
  model without a sequence batcher: a fusion keeps no state between runs;
- other request parameters are custom ones, which Triton passes on to its backend: accepted and
  ignored when their value is a string, a number or a boolean, 400 otherwise (as Triton);
- fields of the body that KServe v2 does not define are ignored (server/models.py InferRequest).
"""

from __future__ import annotations

import time

from segfuse.compiler import Fusion

from .errors import ApiError, bad_request
from .models import UINT64_MAX, InferRequest

MODEL_VERSION = "1"

# Literal path segments of our routes under /v2/models/: a fusion with one of these names would
# shadow a route (GET /v2/models/stats would answer the fusion's metadata). tests/test_protocol_*
# check that this covers every route of the app.
RESERVED_MODEL_NAMES = frozenset({"stats", "ready", "infer", "config", "versions", "trace", "setting"})

MAX_TIMEOUT_US = UINT64_MAX  # parameters.timeout: Triton's is a uint64 of microseconds


def versions_of(fusion: Fusion) -> list[str]:
    return [MODEL_VERSION]


def check_version(fusion: Fusion, version: str, loc: tuple = ("path", "version")) -> None:
    """404 unless `version` is the fusion's one version."""
    if version != MODEL_VERSION:
        msg = (f"fusion '{fusion.name}' has no version '{version}' (its only version is "
               f"'{MODEL_VERSION}')")
        raise ApiError(404, msg, [{"loc": list(loc), "msg": msg}])


def check_name(name: str) -> None:
    """400 for a fusion name that a fixed route under /v2/models/ uses."""
    if name in RESERVED_MODEL_NAMES:
        msg = (f"graph.name '{name}' is reserved: /v2/models/{name} is a route of the server "
               f"(reserved names: {', '.join(sorted(RESERVED_MODEL_NAMES))}); choose another name")
        raise bad_request(msg, ["graph", "name"])


def check_request(fusion: Fusion, req: InferRequest) -> float | None:
    """Check the KServe fields and Triton parameters of an infer body. Returns the deadline
    (time.perf_counter() seconds) by which the run must start, or None."""
    if req.model_name is not None and req.model_name not in (fusion.name, fusion.id):
        raise bad_request(f"body.model_name '{req.model_name}' does not match the fusion of the URL, "
                          f"'{fusion.name}'", ["body", "model_name"])
    if req.model_version is not None and req.model_version != MODEL_VERSION:
        raise bad_request(f"body.model_version '{req.model_version}' does not match: fusion "
                          f"'{fusion.name}' has only version '{MODEL_VERSION}'", ["body", "model_version"])
    for k, out in enumerate(req.outputs or []):
        extra = out.parameters.model_extra if out.parameters is not None else None
        if extra and extra.get("class_count"):
            raise bad_request("class_count: the classification extension is not supported; "
                              "request the output without class_count",
                              ["outputs", k, "parameters", "class_count"])
    p = req.parameters
    if p is None:
        return None
    for name, value in (p.model_extra or {}).items():
        if value is None or not isinstance(value, (str, int, float)):  # (bool is an int)
            raise bad_request(f"parameters.{name}: a request parameter is a string, a number or a boolean, not "
                              f"{_json_kind(value)}", ["parameters", name])
    if p.timeout:
        if p.timeout > MAX_TIMEOUT_US:
            msg = f"parameters.timeout is over the largest timeout, {MAX_TIMEOUT_US} us (Triton's uint64)"
            raise bad_request(msg, ["parameters", "timeout"])
        return time.perf_counter() + p.timeout / 1e6
    return None


def _json_kind(value) -> str:
    return "null" if value is None else "an array" if isinstance(value, list) else "an object"


def count_priority(metrics, req: InferRequest) -> None:
    """parameters.priority has no effect (one run queue): count the requests that carry one, so an
    operator sees whether clients rely on it."""
    if req.parameters is not None and req.parameters.priority is not None:
        metrics.priority_requests.inc()


def check_started_in_time(deadline: float | None) -> None:
    """Called when a run starts on a worker thread: 429 if its deadline has passed."""
    if deadline is None:
        return
    late = time.perf_counter() - deadline
    if late > 0:
        msg = (f"the run did not start within parameters.timeout ({late * 1e6:.0f} us late): the server "
               "is busy; retry later or raise the timeout")
        raise ApiError(429, msg, [{"loc": ["parameters", "timeout"], "msg": msg}], {"Retry-After": "1"})
