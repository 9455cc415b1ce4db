"""Connection limits uvicorn lacks: header bytes, a header read timeout and a body read timeout.

uvicorn bounds only the idle time between requests (`timeout_keep_alive`); with httptools (its
parser here) nothing bounds how long a client takes to send a request's headers or body, and the
parser gathers an unfinished header without limit: slow clients held 300 connections for minutes
and 40 unfinished 4 MiB headers held 186 MB. Neither limit can be an ASGI middleware (the app sees
a request only once its headers are complete), so `LimitedHttpToolsProtocol` is uvicorn's httptools
protocol with, per connection:

- header bytes: more than `max_header_bytes` before the end of a request's headers (request line
  included) is answered with 431 and the connection closed;
- header timeout: the headers must be complete `header_timeout` seconds after the connection opened
  (or after a later request's first bytes): 408 and close past it (a close, if nothing was sent);
- body timeout: while a request's body is unfinished, at most `body_timeout` seconds without a byte
  of it (time the server is not reading, or a client waits for 100 Continue, does not count): 408
  and close, or a close once a response has started.

Timers are armed only while a request is unfinished at the end of a read, so a request that arrives
in one read (the hot path) costs no timer. `server_options(settings)` gives uvicorn these and the
keep-alive timeout.
"""

from __future__ import annotations

import json
from http import HTTPStatus

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


def _response(status: int, message: str, loc: str) -> bytes:
    body = json.dumps({"error": message, "details": [{"loc": [loc], "msg": message}]}).encode()
    return (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode() + body


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    max_header_bytes = 64 << 10  # class attributes: protocol_class() makes a subclass with the settings'
    header_timeout = 10.0
    body_timeout = 30.0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._phase = "idle"  # idle (between requests) | headers | body
        self._header_bytes = 0  # bytes read while the current request's headers were unfinished
        self._measured = 0  # bytes of its request line and finished headers, as the parser reported them
        self._completed = False  # a request ended during the current read
        self._refused = False
        self._header_timer = self._body_timer = None
        self._last_read = 0.0

    # ---- uvicorn's protocol, extended ----------------------------------------------------------
    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._header_timer = self.loop.call_later(self.header_timeout, self._on_header_timeout)

    def connection_lost(self, exc) -> None:
        self._cancel_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        before, self._completed = self._phase, False
        super().data_received(data)
        if self._refused:
            return self._refuse(431, f"the request's headers are over the limit of {self.max_header_bytes} bytes")
        if self._phase == "headers":
            if self._completed or before == "body":  # this read began with the end of an earlier request
                self._header_bytes = self._measured
            else:
                self._header_bytes = len(data) + (self._header_bytes if before == "headers" else 0)
            if max(self._header_bytes, self._measured) > self.max_header_bytes:
                self._refused = True
                return self._refuse(431, f"the request's headers are over the limit of {self.max_header_bytes} bytes")
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(self.header_timeout, self._on_header_timeout)
        elif self._phase == "body" and self._body_timer is None:
            self._last_read = self.loop.time()
            self._body_timer = self.loop.call_later(self.body_timeout, self._on_body_timeout)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._phase, self._measured = "headers", 0

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self._count(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        self._count(len(name) + len(value) + 4)

    def on_headers_complete(self) -> None:
        if self._refused:
            return
        self._phase, self._header_bytes = "body", 0
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if self._refused:
            return
        self._last_read = self.loop.time()
        super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        self._phase, self._completed = "idle", True
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None
        super().on_message_complete()

    # ---- the limits ------------------------------------------------------------------------------
    def _count(self, n: int) -> None:
        self._measured += n
        if self._measured > self.max_header_bytes:
            self._refused = True  # the parser goes on to the end of this read; nothing more starts

    def _cancel_timers(self) -> None:
        for timer in (self._header_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._body_timer = None

    def _refuse(self, status: int, message: str, loc: str = "headers") -> None:
        """Answer `status` (unless a response is under way) and close the connection."""
        self._cancel_timers()
        self._refused = True
        self.logger.info("%s from %s: %s", status, self.client, message)
        cycle = self.cycle
        if not self.transport.is_closing():
            if cycle is None or not cycle.response_started or cycle.response_complete:
                self.transport.write(_response(status, message, loc))
            self.transport.close()
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app's receive() gets http.disconnect, its sends go nowhere
            cycle.message_event.set()

    def _on_header_timeout(self) -> None:
        self._header_timer = None
        if self._phase == "body" or self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:  # a pipelined request behind a response
            cycle.keep_alive = False
            return
        if self._phase == "headers":
            self._refuse(408, f"the request's headers did not arrive within {self.header_timeout:g} s")
        else:  # connected, and never sent a byte
            self._cancel_timers()
            self.transport.close()

    def _on_body_timeout(self) -> None:
        self._body_timer = None
        if self._phase != "body" or self.transport.is_closing():
            return
        now, cycle = self.loop.time(), self.cycle
        if self.flow.read_paused or (cycle is not None and cycle.waiting_for_100_continue):
            self._last_read = now  # the server is not reading: the client is not the one late
        wait = self._last_read + self.body_timeout - now
        if wait > 0:
            self._body_timer = self.loop.call_later(wait, self._on_body_timeout)
            return
        message = f"no byte of the request's body arrived for {self.body_timeout:g} s"
        if cycle is not None and cycle.response_started:
            self._cancel_timers()
            self.transport.close()  # too late for a status; the body is never finished
            cycle.disconnected = not cycle.response_complete
            cycle.message_event.set()
        else:
            self._refuse(408, message, "body")


def protocol_class(settings) -> type[LimitedHttpToolsProtocol]:
    """LimitedHttpToolsProtocol with the limits of `settings` (uvicorn makes one per connection)."""
    return type("SegfuseHttpProtocol", (LimitedHttpToolsProtocol,), {
        "max_header_bytes": settings.max_header_bytes, "header_timeout": float(settings.header_timeout),
        "body_timeout": float(settings.body_timeout)})


def server_options(settings) -> dict:
    """uvicorn.Config / uvicorn.run keyword arguments for the connection limits of `settings`."""
    return {"http": protocol_class(settings), "timeout_keep_alive": settings.keep_alive_timeout}
