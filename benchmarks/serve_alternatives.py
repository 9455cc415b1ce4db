"""The HTTP alternatives of benchmarks/ab_http.sh, which measured them against `segfuse serve`
(benchmarks/README.md, "The H200 host, second session"); neither is used by the service.

    python3 benchmarks/serve_alternatives.py coalesce PORT   # uvicorn, one write per response
    python3 benchmarks/serve_alternatives.py granian PORT    # granian's ASGI server (pip install granian)

Settings come from SEGFUSE_* variables (SEGFUSE_BACKEND, SEGFUSE_MAX_QUEUED_RUNS, ...)."""

from __future__ import annotations

import os
import sys


class _OneWrite:
    """A transport that holds a response's header block until its body is written, so each response
    is one send() instead of two; a loop callback flushes headers no body follows (HEAD, 204)."""

    __slots__ = ("_transport", "_held", "_loop")

    def __init__(self, transport, loop):
        self._transport, self._held, self._loop = transport, None, loop

    def write(self, data):
        if self._held is not None:
            held, self._held = self._held, None
            if len(data) < 65536:
                self._transport.write(held + data)
                return
            self._transport.write(held)
        elif data[:5] == b"HTTP/" and data[-4:] == b"\r\n\r\n":
            self._held = data
            self._loop.call_soon(self._flush)
            return
        self._transport.write(data)

    def _flush(self):
        if self._held is not None:
            held, self._held = self._held, None
            self._transport.write(held)

    def __getattr__(self, name):
        return getattr(self._transport, name)


def app():
    from segfuse.server import create_app
    from segfuse.server.settings import Settings

    return create_app(Settings.from_env())


def coalesce(port: int) -> None:
    import uvicorn
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class OneWriteProtocol(HttpToolsProtocol):
        def connection_made(self, transport):
            super().connection_made(transport)
            self.transport = _OneWrite(self.transport, self.loop)

    application = app()
    application.state.runtime.freeze_gc = True
    uvicorn.run(application, host="127.0.0.1", port=port, log_level="warning", http=OneWriteProtocol)


def granian(port: int) -> None:
    from granian import Granian

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    Granian("serve_alternatives:app", factory=True, address="127.0.0.1", port=port, interface="asgi",
            loop="uvloop", workers=1, http="1", websockets=False, log_level="warning").serve()


if __name__ == "__main__":
    mode, port = sys.argv[1], int(sys.argv[2])
    {"coalesce": coalesce, "granian": granian}[mode](port)
