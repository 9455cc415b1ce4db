"""Connection limits (server/http_limits.py): a request's headers are held to a size and a time, an
unfinished body to a wait between bytes, an idle keep-alive connection to a time; past each the
server answers 431 or 408 (or closes) and lets the connection go. Raw sockets, so that the test
decides exactly what a client sends and when; the limits are set small to keep the test short."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from helpers.graphs import MOE_PROBLEM_SIZES
from helpers.servers import LiveServer
from helpers.waiting import scaled

# The time limits are short to keep the test short, and stretch with a loaded machine (SCALE) so
# that a client's deliberate pauses (PAUSE_S) stay well inside them.
LIMIT_S = scaled(2.0)
PAUSE_S = 0.5
LIMITS = {"header_timeout": LIMIT_S, "body_timeout": LIMIT_S, "keep_alive_timeout": LIMIT_S, "max_header_bytes": 4096}
WAIT_S = scaled(30)  # how long a test waits for the server to act, far over any limit above


class LimitedServer(LiveServer):
    """LiveServer on uvicorn with the connection limits `segfuse serve` uses."""

    def __init__(self, **settings):
        import uvicorn
        from segfuse.server.http_limits import server_options

        super().__init__(**settings)
        config = uvicorn.Config(self.app, host="127.0.0.1", port=0, log_level="warning", lifespan="on",
                                **server_options(self.app.state.settings))
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)


@pytest.fixture(scope="module")
def server():
    import httpx

    s = LimitedServer(backend="numpy", **LIMITS).start()
    assert httpx.post(s.url + "/v2/fusions", json=MOE_PROBLEM_SIZES).status_code == 201
    yield s
    s.stop()


def connect(server) -> socket.socket:
    host, port = server.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.settimeout(WAIT_S)
    return sock


def until_closed(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes the connection; fails if it keeps it open."""
    out = b""
    while True:
        try:
            data = sock.recv(65536)
        except ConnectionResetError:
            return out
        except TimeoutError:
            raise AssertionError(f"the server kept the connection open; it sent {out[:200]!r}") from None
        if not data:
            return out
        out += data


def answer(raw: bytes) -> tuple[int, dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def request(path: str = "/v2/health/live", method: str = "GET", body: bytes = b"", extra: bytes = b"") -> bytes:
    length = b"Content-Length: %d\r\n" % len(body) if body or method != "GET" else b""
    return b"%s %s HTTP/1.1\r\nHost: x\r\n%s%s\r\n%s" % (method.encode(), path.encode(), length, extra, body)


def test_a_connection_that_sends_nothing_is_closed(server):
    with connect(server) as sock:
        assert until_closed(sock) == b""


@pytest.mark.parametrize("drip", [False, True], ids=["stalled", "dripped"])
def test_headers_that_do_not_finish_in_time_get_408(server, drip):
    """Stalled, or one byte every 0.1 s (never idle for long): the headers' time is a total."""
    with connect(server) as sock:
        partial = request()[:-2]  # all but the blank line that ends the headers
        if not drip:
            sock.sendall(partial)
        else:
            def dripping():
                for i in range(len(partial)):
                    try:
                        sock.sendall(partial[i:i + 1])
                    except OSError:
                        return
                    time.sleep(0.1)

            threading.Thread(target=dripping, daemon=True).start()
        status, doc = answer(until_closed(sock))
    assert status == 408 and f"headers did not arrive within {LIMIT_S:g} s" in doc["error"]
    assert doc["details"][0]["loc"] == ["headers"]


@pytest.mark.parametrize("finished", [False, True])
def test_headers_over_the_limit_get_431(server, finished):
    big = b"X-Big: " + b"a" * 8000 + (b"\r\n" if finished else b"")
    with connect(server) as sock:
        sock.sendall(request(extra=big)[:None if finished else -4])
        status, doc = answer(until_closed(sock))
    assert status == 431 and "over the limit of 4096 bytes" in doc["error"]


def test_unfinished_giant_headers_are_cut_off_early(server):
    """4 MiB of one header line, never finished: the server answers once 4 KiB (plus at most one
    read) have come, and stops reading; the client cannot push the rest in."""
    with connect(server) as sock:
        sent = 0
        line = request()[:-2] + b"X-Big: "
        sock.sendall(line)
        chunk = b"a" * 65536
        try:
            while sent < 4 << 20:
                sent += sock.send(chunk)
        except OSError:
            pass
        status, doc = answer(until_closed(sock))
    assert status == 431
    assert sent < 4 << 20  # the server closed the connection long before


def test_requests_within_the_limits_keep_their_connection(server):
    with connect(server) as sock:
        for _ in range(3):  # keep-alive: one connection, headers just under the limit
            sock.sendall(request(extra=b"X-Pad: " + b"p" * 3000 + b"\r\n"))
            data = sock.recv(65536)
            assert data.startswith(b"HTTP/1.1 200") and data.endswith(b'{"live":true}')
            time.sleep(PAUSE_S)  # idle, but under the keep-alive timeout
        # then idle past the keep-alive timeout: closed
        assert until_closed(sock) == b""


@pytest.mark.parametrize("path", ["/v2/fusions", "/v2/models/moe_problem_sizes/infer"])
def test_a_body_that_stops_gets_408(server, path):
    with connect(server) as sock:
        sock.sendall(request(path, "POST", b"x" * 100)[:-90])  # 10 of 100 body bytes, then nothing
        status, doc = answer(until_closed(sock))
    assert status == 408 and f"no byte of the request's body arrived for {LIMIT_S:g} s" in doc["error"]
    assert doc["details"][0]["loc"] == ["body"]


def test_a_slow_but_steady_body_is_served(server):
    """A body that takes several body timeouts to arrive, never pausing for one: the wait is per
    byte, not a total. Oracle: the fusion it registers."""
    body = json.dumps({**MOE_PROBLEM_SIZES, "name": "slow_body"}).encode()
    with connect(server) as sock:
        sock.sendall(request("/v2/fusions", "POST", b"", b"Content-Type: application/json\r\n")
                     .replace(b"Content-Length: 0", b"Content-Length: %d" % len(body)))
        pieces = int(2 * LIMIT_S / PAUSE_S) + 2  # arriving over twice the body timeout
        step = len(body) // pieces + 1
        for i in range(0, len(body), step):
            time.sleep(PAUSE_S)
            sock.sendall(body[i:i + step])
        data = sock.recv(65536)
    assert data.startswith(b"HTTP/1.1 201"), data[:200]
    assert json.loads(data.partition(b"\r\n\r\n")[2])["name"] == "slow_body"


def test_many_slow_connections_are_all_released(server):
    socks = [connect(server) for _ in range(50)]
    try:
        for k, sock in enumerate(socks):
            if k % 2:
                sock.sendall(request()[:20])
        closed = [until_closed(sock) for sock in socks]
    finally:
        for sock in socks:
            sock.close()
    assert all(c == b"" or c.startswith(b"HTTP/1.1 408") for c in closed)
    with connect(server) as sock:  # and the server still serves
        sock.sendall(request())
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")


def test_the_limits_are_settings_and_serve_flags():
    from segfuse.cli import build_parser
    from segfuse.cli.serve_cmd import settings_from_args
    from segfuse.server.http_limits import server_options
    from segfuse.server.settings import Settings

    s = Settings()
    assert (s.max_header_bytes, s.header_timeout, s.body_timeout, s.keep_alive_timeout) == (65536, 10.0, 30.0, 5.0)
    env = {"SEGFUSE_MAX_HEADER_BYTES": "16K", "SEGFUSE_HEADER_TIMEOUT": "2.5", "SEGFUSE_BODY_TIMEOUT": "7",
           "SEGFUSE_KEEP_ALIVE_TIMEOUT": "0.5"}
    s = Settings.from_env(env)
    assert (s.max_header_bytes, s.header_timeout, s.body_timeout, s.keep_alive_timeout) == (16384, 2.5, 7.0, 0.5)
    args = build_parser().parse_args(["serve", "--max-header-bytes", "8K", "--header-timeout", "3",
                                      "--body-timeout", "4.5", "--keep-alive-timeout", "6"])
    s = settings_from_args(args)
    assert (s.max_header_bytes, s.header_timeout, s.body_timeout, s.keep_alive_timeout) == (8192, 3.0, 4.5, 6.0)
    options = server_options(s)
    assert options["timeout_keep_alive"] == 6.0
    assert (options["http"].max_header_bytes, options["http"].header_timeout, options["http"].body_timeout) == \
        (8192, 3.0, 4.5)
    with pytest.raises(ValueError, match="SEGFUSE_BODY_TIMEOUT"):
        Settings.from_env({"SEGFUSE_BODY_TIMEOUT": "soon"})
    with pytest.raises(ValueError, match="header_timeout"):
        Settings.from_env({}, header_timeout=0)


def test_serve_applies_the_limits():
    from helpers.processes import SEGFUSE, server_process

    with server_process([*SEGFUSE, "serve", "--max-header-bytes", "2K", "--header-timeout", "1"]) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=WAIT_S) as sock:
            sock.sendall(request(extra=b"X-Big: " + b"a" * 3000 + b"\r\n"))
            assert answer(until_closed(sock))[0] == 431
        with socket.create_connection((host, int(port)), timeout=WAIT_S) as sock:
            sock.sendall(request()[:-2])
            assert answer(until_closed(sock))[0] == 408
