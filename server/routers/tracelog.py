"""Triton's trace and logging extensions.

Trace settings (GET/POST /v2/trace/setting and /v2/models/{m}/trace/setting) answer in Triton's
shape. segfuse has no request tracing, so trace_level is always ["OFF"]: a POST that keeps the
current values (or clears one with null) succeeds, one that would turn tracing on or change a
trace value is refused with 400 naming the setting.

Log settings (GET/POST /v2/logging) act on the "segfuse" logger of the process: log_info,
log_warning, log_error and log_verbose_level (> 0: debug) set its level. Python logging has one
minimum level: turning a level on turns on the more severe ones the request does not name, turning
one off turns off the less severe ones; a request that names a combination that is not one level
(log_info true, log_warning false) is refused with 400. log_file and log_format can only keep
their values ("" and "default"). The logger is the process's: every app in it sees the change.

Silencing the log hides what clients do, so turning warning or error logging off needs a token:
with one set, every request here carries it (GuardMiddleware); on a server without one, such a
request is refused with 403 and changes nothing. More or less verbose above warnings stays open.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request

from ..deps import AnyState, errors
from ..errors import ApiError, bad_request
from .fusions import json_body

router = APIRouter(tags=["trace and logging"])

TRACE_SETTINGS = {"trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1", "log_frequency": "0",
                  "trace_file": "", "trace_mode": "triton"}
LOGGER = "segfuse"


async def _object(request: Request) -> dict:
    body = await request.body()
    doc = json_body(body) if body.strip() else {}
    if not isinstance(doc, dict):
        raise bad_request("the body must be a JSON object of settings", ["body"])
    return doc


def apply_trace(doc: dict) -> dict:
    """The trace settings after `doc` (a setting -> its value, None to clear); HTTP and gRPC call it."""
    for key, value in doc.items():
        loc = ["body", key]
        if key not in TRACE_SETTINGS:
            raise bad_request(f"unknown trace setting '{key}' (known: {', '.join(TRACE_SETTINGS)})", loc)
        if value is None:  # clear: back to the default, which is the only value
            continue
        if key == "trace_level":
            levels = value if isinstance(value, list) else [value]
            if [str(v).upper() for v in levels] != ["OFF"]:
                raise bad_request(f"trace_level {value!r}: request tracing is not implemented in segfuse; "
                                  'only ["OFF"] is accepted', loc)
        elif str(value) != TRACE_SETTINGS[key]:
            raise bad_request(f"{key} {value!r}: request tracing is not implemented in segfuse (trace_level "
                              f"stays OFF), so {key} keeps its value {TRACE_SETTINGS[key]!r}", loc)
    return dict(TRACE_SETTINGS)


@router.get("/v2/trace/setting", summary="Trace settings (tracing is off)", responses=errors(401))
async def get_trace() -> dict:
    return dict(TRACE_SETTINGS)


@router.post("/v2/trace/setting", summary="Update trace settings (only keeping tracing off)",
             responses=errors(400, 401))
async def post_trace(request: Request) -> dict:
    return apply_trace(await _object(request))


@router.get("/v2/models/{model}/trace/setting", summary="Trace settings of a fusion", responses=errors(401, 404))
async def get_model_trace(rt: AnyState, model: str) -> dict:
    rt.fusions.resolve(model)
    return dict(TRACE_SETTINGS)


@router.post("/v2/models/{model}/trace/setting", summary="Update the trace settings of a fusion",
             responses=errors(400, 401, 404))
async def post_model_trace(rt: AnyState, model: str, request: Request) -> dict:
    rt.fusions.resolve(model)
    return apply_trace(await _object(request))


def log_settings() -> dict:
    level = logging.getLogger(LOGGER).getEffectiveLevel()
    return {"log_file": "", "log_info": level <= logging.INFO, "log_warning": level <= logging.WARNING,
            "log_error": level <= logging.ERROR, "log_verbose_level": 1 if level <= logging.DEBUG else 0,
            "log_format": "default"}


LADDER = ("log_verbose_level", "log_info", "log_warning", "log_error")  # least to most severe
LEVELS = (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR)


def _level(current: dict, given: dict) -> int:
    """The minimum level for `given` on top of `current`: turning a level on turns on the more
    severe ones not given, turning one off turns off the less severe ones not given."""
    on = [bool(current[k]) for k in LADDER]
    for i, key in enumerate(LADDER):
        if key not in given:
            continue
        on[i] = bool(given[key])
        for j in range(i + 1, len(LADDER)) if on[i] else range(i):
            if LADDER[j] not in given:
                on[j] = on[i]
    if any(on[i] and not all(on[i:]) for i in range(len(on))):
        raise bad_request("these log settings are not one minimum level (segfuse logs through Python "
                          "logging): a level that is on needs every more severe one on, e.g. log_info "
                          "true with log_warning false is not possible", ["body"])
    return next((level for flag, level in zip(on, LEVELS) if flag), logging.CRITICAL + 10)


@router.get("/v2/logging", summary="Log settings (the segfuse logger)", responses=errors(401))
async def get_logging() -> dict:
    return log_settings()


def _refuse_silencing(level: int, token: str | None) -> None:
    """403 for a level that hides more warnings or errors than now on a server without a token
    (one started at --log-level error may keep that level)."""
    if level > max(logging.WARNING, logging.getLogger(LOGGER).getEffectiveLevel()) and not token:
        msg = ("turning warning or error logging off needs auth: start the server with --token "
               "(SEGFUSE_TOKEN) and send it; without one, log_warning and log_error stay on")
        raise ApiError(403, msg, [{"loc": ["body"], "msg": msg}])


@router.post("/v2/logging", summary="Update log settings (turning warnings or errors off needs a token)",
             responses=errors(400, 401, 403))
async def post_logging(rt: AnyState, request: Request) -> dict:
    return update_log_settings(rt, await _object(request))


def update_log_settings(rt, doc: dict) -> dict:
    """Apply `doc` (a log setting -> its value) and answer the settings; HTTP and gRPC call it."""
    current: dict[str, Any] = log_settings()
    for key, value in doc.items():
        loc = ["body", key]
        if key not in current:
            raise bad_request(f"unknown log setting '{key}' (known: {', '.join(current)})", loc)
        if key in ("log_info", "log_warning", "log_error"):
            if not isinstance(value, bool):
                raise bad_request(f"{key} must be true or false", loc)
        elif key == "log_verbose_level":
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise bad_request("log_verbose_level must be an integer >= 0", loc)
        elif value != current[key]:
            raise bad_request(f"{key} {value!r}: segfuse logs through the server's own handlers; "
                              f"{key} can only keep its value {current[key]!r}", loc)
    level = _level(current, doc)
    _refuse_silencing(level, rt.settings.token)
    logging.getLogger(LOGGER).setLevel(level)
    return log_settings()
