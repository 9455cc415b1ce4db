"""The server's one log configuration (issue 17, item 17): uvicorn's loggers and segfuse's on the
same handlers at one level, as text (uvicorn's format) or as JSON lines (`--log-format json`): one
object per line with time, level, logger, message and, inside a request, its request_id.

The request id travels in a context variable that GuardMiddleware sets for the request; uvicorn's
access line is written while the response starts, inside that context, so it carries the id too.
"""

from __future__ import annotations

import contextvars
import copy
import json
import logging
import time

FORMATS = ("text", "json")

REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("segfuse_request_id", default=None)


class JsonFormatter(logging.Formatter):
    """One JSON object per record. Only the standard library: the record's own fields, the
    message with its arguments filled in, the traceback as a string."""

    def format(self, record: logging.LogRecord) -> str:
        ms = int(record.msecs)
        line = {"time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{ms:03d}Z",
                "level": record.levelname, "logger": record.name, "message": record.getMessage()}
        rid = REQUEST_ID.get()
        if rid is not None:
            line["request_id"] = rid
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def log_config(level: str, fmt: str = "text") -> dict:
    """uvicorn's logging configuration (for uvicorn.run's log_config) with segfuse's loggers (the
    backend chosen, failed requests by request id, kernel-cache warnings) on the same handler and
    at the same level; with fmt "json" both of uvicorn's formatters write JsonFormatter lines."""
    from uvicorn.config import LOGGING_CONFIG

    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not '{fmt}'")
    cfg = copy.deepcopy(LOGGING_CONFIG)
    cfg["loggers"]["segfuse"] = {"handlers": ["default"], "level": level.upper(), "propagate": False}
    if fmt == "json":
        for name in ("default", "access"):
            cfg["formatters"][name] = {"()": f"{__name__}.JsonFormatter"}
    return cfg
