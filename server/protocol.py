"""KServe v2 / Triton protocol rules that are not about tensors: the one model version, names that
routes reserve, the KServe fields of an infer body and Triton's request parameters.

Decisions (docs/http-api.md, "Protocol parity"):
- every fusion has exactly one version, "1"; any other version in a URL or body is 404 / 400;
- `parameters.timeout` (Triton: microseconds) is honoured: a run that has not started on a worker
  within it fails with 429 and Retry-After, like a full run queue (Triton answers 503 "Request
  timeout expired"; here 503 means "not ready");
- `priority` (other than 0) and `sequence_id`/`sequence_start`/`sequence_end` (other than their
  defaults) are refused with 400: runs are served in arrival order and segfuse keeps no sequence
  state;
- request parameters segfuse does not know are refused with 400: no backend here reads custom
  parameters, so one can only be a typo or a feature segfuse lacks.
"""

from __future__ import annotations

import time

from segfuse.compiler import Fusion

from .errors import ApiError, bad_request
from .models import InferRequest, RequestParameters

MODEL_VERSION = "1"

# Literal path segments of our routes under /v2/models/: a fusion with one of these names would
# shadow a route (GET /v2/models/stats would answer the fusion's metadata). tests/test_protocol_*
# check that this covers every route of the app.
RESERVED_MODEL_NAMES = frozenset({"stats", "ready", "infer", "config", "versions", "trace", "setting"})

# Request-level parameters with a meaning here (the model's fields: binary_data_output, timeout,
# priority, sequence_*). Anything else is refused.
KNOWN_REQUEST_PARAMETERS = frozenset(RequestParameters.model_fields)
MAX_TIMEOUT_US = 2 ** 64 - 1  # parameters.timeout: Triton's is a uint64 of microseconds


def versions_of(fusion: Fusion) -> list[str]:
    return [MODEL_VERSION]


def check_version(fusion: Fusion, version: str, loc: tuple = ("path", "version")) -> None:
    """404 unless `version` is the fusion's one version."""
    if version != MODEL_VERSION:
        msg = (f"fusion '{fusion.name}' has no version '{version}' (its only version is "
               f"'{MODEL_VERSION}')")
        raise ApiError(404, msg, [{"loc": list(loc), "msg": msg}])


def check_name(name: str) -> None:
    """422 for a fusion name that a fixed route under /v2/models/ uses."""
    if name in RESERVED_MODEL_NAMES:
        msg = (f"graph.name '{name}' is reserved: /v2/models/{name} is a route of the server "
               f"(reserved names: {', '.join(sorted(RESERVED_MODEL_NAMES))}); choose another name")
        raise ApiError(422, msg, [{"loc": ["graph", "name"], "msg": msg}])


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
    unknown = sorted(p.model_extra or {})
    if unknown:
        raise bad_request(f"unknown request parameter(s) {', '.join(unknown)}; segfuse knows "
                          f"{', '.join(sorted(KNOWN_REQUEST_PARAMETERS))}", ["parameters", unknown[0]])
    if p.priority:
        raise bad_request(f"parameters.priority {p.priority}: priority levels are not supported, runs "
                          "are served in arrival order (omit it or send 0)", ["parameters", "priority"])
    if p.sequence_id not in (None, 0, "") or p.sequence_start or p.sequence_end:
        raise bad_request("parameters.sequence_id/sequence_start/sequence_end: sequences (stateful "
                          "models) are not supported; every run is independent", ["parameters", "sequence_id"])
    if p.timeout:
        if p.timeout > MAX_TIMEOUT_US:
            msg = f"parameters.timeout is over the largest timeout, {MAX_TIMEOUT_US} us (Triton's uint64)"
            raise bad_request(msg, ["parameters", "timeout"])
        return time.perf_counter() + p.timeout / 1e6
    return None


def check_started_in_time(deadline: float | None) -> None:
    """Called when a run starts on a worker thread: 429 if its deadline has passed."""
    if deadline is None:
        return
    late = time.perf_counter() - deadline
    if late > 0:
        msg = (f"the run did not start within parameters.timeout ({late * 1e6:.0f} us late): the server "
               "is busy; retry later or raise the timeout")
        raise ApiError(429, msg, [{"loc": ["parameters", "timeout"], "msg": msg}], {"Retry-After": "1"})
