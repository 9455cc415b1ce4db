"""The server's one log configuration (issue 17, item 17): uvicorn's loggers and segfuse's on the
same handlers at one level, as text (uvicorn's format) or as JSON lines (`--log-format json`): one
object per line with time, level, logger, message and, inside a request, its request_id.

The request id travels in a context variable that GuardMiddleware sets for the request; uvicorn's
access line is written while the response starts, inside that context, so it carries the id too.

A client cannot write lines of its own: control characters a request carries into a record (a
percent-encoded CR/LF in a path, a C1 "next line", a terminal escape) are escaped in both formats,
so a record starts exactly one line; a traceback keeps its lines, each indented under its record.
"""

from __future__ import annotations

import contextvars
import copy
import functools
import json
import logging
import re
import time

FORMATS = ("text", "json")

REQUEST_ID: contextvars.ContextVar[str | None] = contextvars.ContextVar("segfuse_request_id", default=None)


# C0 and C1 control characters (CR, LF, NEL, ESC, ...) and the Unicode line and paragraph separators
CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(m: re.Match) -> str:
    c = m.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def escape_controls(text: str) -> str:
    """`text` with every control character written as an escape (\\r, \\n, \\x85, \\u2028)."""
    return CONTROL.sub(_escape_char, text)


def _indented(block: str) -> str:
    """A traceback or stack under its record: its lines kept, each indented, their control
    characters escaped (an exception message may quote a request)."""
    return "\n".join("  " + escape_controls(line) for line in block.split("\n"))


class _Escaping:
    """Text formatters (uvicorn's, for its colours and prefixes) over a copy of the record whose
    message, or for access lines whose arguments, carry no control character."""

    access = False

    def format(self, record: logging.LogRecord) -> str:
        record = copy.copy(record)
        if self.access and isinstance(record.args, tuple):
            record.args = tuple(escape_controls(a) if isinstance(a, str) else a for a in record.args)
        else:
            message = record.getMessage()
            if CONTROL.search(message):
                record.msg, record.args = escape_controls(message), ()
                record.__dict__.pop("color_message", None)
        if record.exc_info:
            record.exc_text = None  # formatted again below, indented (not another handler's text)
        elif record.exc_text:
            record.exc_text = _indented(record.exc_text)
        return super().format(record)  # type: ignore[misc]

    def formatException(self, ei) -> str:
        return _indented(super().formatException(ei))  # type: ignore[misc]

    def formatStack(self, stack_info: str) -> str:
        return _indented(super().formatStack(stack_info))  # type: ignore[misc]


@functools.cache
def _text_classes() -> tuple[type, type]:
    from uvicorn.logging import AccessFormatter, DefaultFormatter  # (only a served process needs uvicorn)

    return (type("TextFormatter", (_Escaping, DefaultFormatter), {}),
            type("AccessTextFormatter", (_Escaping, AccessFormatter), {"access": True}))


def text_formatter(**kwargs) -> logging.Formatter:
    """uvicorn's text formatter (kwargs: fmt, use_colors, ...), escaping control characters."""
    return _text_classes()[0](**kwargs)


def access_text_formatter(**kwargs) -> logging.Formatter:
    """uvicorn's access-line formatter, escaping control characters in the request line."""
    return _text_classes()[1](**kwargs)


# Characters json.dumps leaves raw (ensure_ascii off) that readers may take for line breaks.
_JSON_RAW = re.compile("[\x7f-\x9f\u2028\u2029]")


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
        return _JSON_RAW.sub(lambda m: f"\\u{ord(m.group()):04x}", json.dumps(line, ensure_ascii=False))


def log_config(level: str, fmt: str = "text") -> dict:
    """uvicorn's logging configuration (for uvicorn.run's log_config) with segfuse's loggers (the
    backend chosen, failed requests by request id, kernel-cache warnings) on the same handler and
    at the same level; with fmt "json" both of uvicorn's formatters write JsonFormatter lines, with
    "text" uvicorn's own, escaping control characters."""
    from uvicorn.config import LOGGING_CONFIG

    if fmt not in FORMATS:
        raise ValueError(f"log format must be one of {', '.join(FORMATS)}, not '{fmt}'")
    cfg = copy.deepcopy(LOGGING_CONFIG)
    cfg["loggers"]["segfuse"] = {"handlers": ["default"], "level": level.upper(), "propagate": False}
    if fmt == "json":
        for name in ("default", "access"):
            cfg["formatters"][name] = {"()": f"{__name__}.JsonFormatter"}
    else:
        cfg["formatters"]["default"]["()"] = f"{__name__}.text_formatter"
        cfg["formatters"]["access"]["()"] = f"{__name__}.access_text_formatter"
    return cfg
