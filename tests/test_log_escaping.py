"""A client cannot write log lines: control characters a request carries into a log record (a
percent-encoded CR/LF in the path, a C1 "next line", an escape sequence) are escaped in the text
format, so every record starts one line of its own and a forged "INFO: ..." never begins a line;
a traceback's lines stay lines, indented under their record. The JSON format escapes them too
(including the line separators JSON itself leaves raw). Oracle: the lines of the log output."""

from __future__ import annotations

import json
import logging
import logging.config
import sys

import httpx
from helpers.processes import serve_logged
from segfuse.server.logs import log_config

FORGED = "INFO:     127.0.0.1:1 - \"GET /v2/forged HTTP/1.1\" 200 OK"
BREAKS = ["\r\n", "\n", "\r", "\x85", "\u2028", "\x0b", "\x1b[2K\r"]


def formatters(fmt: str) -> tuple[logging.Formatter, logging.Formatter]:
    """(the default formatter, the access formatter) exactly as `segfuse serve` configures them."""
    cfg = log_config("info", fmt)
    conf = logging.config.DictConfigurator(cfg)
    return (conf.configure_formatter(dict(cfg["formatters"]["default"])),
            conf.configure_formatter(dict(cfg["formatters"]["access"])))


def record(msg, args=(), name="segfuse.server", exc_info=None) -> logging.LogRecord:
    return logging.LogRecord(name, logging.INFO, __file__, 1, msg, args, exc_info)


def assert_one_record(text: str) -> None:
    lines = text.splitlines()  # Python's line breaks: \r, \n, \x0b, \x0c, \x1c-\x1e, \x85, \u2028, \u2029
    assert len(lines) == 1, lines
    assert "forged" in lines[0] and "\x1b" not in lines[0]


def test_text_records_escape_control_characters_in_messages_and_arguments():
    default, access = formatters("text")
    for br in BREAKS:
        assert_one_record(default.format(record("GET /v2/buffers/x%s [r-1] -> 404: not found" % (br + FORGED))))
        assert_one_record(default.format(record("%s -> %d: %s", (f"GET /v2/buffers/x{br}{FORGED}", 404, "no"))))
        assert_one_record(default.format(record(f"buffer 'x{br}{FORGED}' not found")))
        line = access.format(record('%s - "%s %s HTTP/%s" %d', ("127.0.0.1:5", "GET", f"/x{br}{FORGED}", "1.1", 404),
                                    name="uvicorn.access"))
        assert_one_record(line)
        assert "/x" in line and "404 Not Found" in line
    plain = default.format(record("%s -> %d: %s", ("GET /v2/buffers/missing [r-42]", 404, "buffer 'missing' not found")))
    assert plain.endswith("GET /v2/buffers/missing [r-42] -> 404: buffer 'missing' not found")
    assert "\\r\\n" + FORGED in default.format(record(f"x\r\n{FORGED}"))  # escaped, still readable


def test_a_traceback_stays_under_its_record():
    default, _ = formatters("text")
    try:
        raise ValueError(f"bad name 'x\n{FORGED}'")
    except ValueError:
        text = default.format(record("internal error on GET /x\r\n" + FORGED, exc_info=sys.exc_info()))
    first, *rest = text.split("\n")
    assert first.startswith("INFO:") and "\\r\\n" in first
    assert any("Traceback (most recent call last):" in line for line in rest), text
    assert any("ValueError: bad name" in line for line in rest), text
    for line in rest:  # every line of the traceback is indented: none can pass for a record
        assert line[:1].isspace(), text


def test_json_records_escape_line_separators():
    default, access = formatters("json")
    for br in BREAKS:
        out = default.format(record(f"x{br}{FORGED}"))
        assert len(out.splitlines()) == 1, out
        assert json.loads(out)["message"] == f"x{br}{FORGED}"
        out = access.format(record('%s - "%s %s HTTP/%s" %d', ("127.0.0.1:5", "GET", f"/x{br}{FORGED}", "1.1", 404),
                                   name="uvicorn.access"))
        assert len(out.splitlines()) == 1 and f"/x{br}{FORGED}" in json.loads(out)["message"], out


def test_a_served_request_cannot_forge_a_text_log_line():
    """`segfuse serve` (text format, access lines on): a request whose path decodes to CR/LF and a
    forged access line; the server's failure line and its access line for it stay one line each."""
    with serve_logged("--log-level", "info", "--access-log") as served:
        path = "/v2/buffers/x%0D%0AINFO:%20%20%20%20%20forged%0Aline%C2%85INFO:%20forged%20too"
        r = httpx.get(served.url + path, headers={"x-request-id": "r-inj"})
        assert r.status_code in (400, 404), r.text
    out = served.output
    lines = out.splitlines()
    assert any("[r-inj]" in line for line in lines), out
    assert any("INFO:" in line and "/v2/buffers/x" in line and "HTTP/1.1" in line for line in lines), out
    for line in lines:
        assert not line.startswith(("INFO:     forged", "line", "INFO: forged")), out
