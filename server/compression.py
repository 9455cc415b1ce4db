"""HTTP compression as a pure ASGI middleware, as Triton does it and tritonclient uses it.

Requests: a body with `Content-Encoding: gzip` or `deflate` (zlib, as tritonclient's
`request_compression_algorithm` sends it; raw deflate is accepted too) is decompressed before
anything parses it. The decompressed size is held to `Settings.max_body_bytes` while it inflates:
a small body that would inflate past the limit (a zip bomb) gets 413 after at most limit + 1 bytes
were produced. It inflates on a helper thread (zlib releases the GIL, so the event loop runs on)
and is passed on in chunks, never joined: a large one goes on where large bodies go (the JSON codec
process, server/request_bodies.py). Other encodings get 415.

Responses: the 200 answers of infer routes (`/v2/models/{m}[/versions/{v}]/infer`, `/v2/execute`)
are compressed when `Accept-Encoding` accepts gzip or deflate (tritonclient's
`response_compression_algorithm` sends `Accept-Encoding: gzip` or `deflate` and decodes by the
`Content-Encoding` it gets back) and the body has at least MIN_SIZE bytes. With the binary tensor
data extension the whole body is compressed; `Inference-Header-Content-Length` keeps giving the
length of the uncompressed JSON header, as in Triton. Other routes answer uncompressed (as
Triton's: tritonclient's aio client reads them without decoding whatever its session asked for).
"""

from __future__ import annotations

import asyncio
import re
import zlib

from .errors import error_body
from .middleware import _send_json

MIN_SIZE = 1024  # smaller responses are sent as they are (compression would not pay)
LEVEL = 1  # zlib's fastest: tensor data compresses little at any level, and runs are latency-bound
OFFLOAD_BYTES = 1 << 20  # compress responses at least this large on a helper thread
# Request bodies inflate on a helper thread unless they are this small: zlib releases the GIL while
# it inflates, so the event loop runs on (the size a body inflates to is only known at the end, and
# 256 bytes of gzip inflate to at most about 256 KiB).
INFLATE_ON_LOOP_BYTES = 256
IN_CHUNK, OUT_CHUNK = 64 << 10, 1 << 20  # inflated bodies are passed on in chunks of OUT_CHUNK bytes
YIELD_EVERY = 16  # chunks passed on between two turns of the event loop
COMPRESSED_PATHS = re.compile(r"^/v2/(models/[^/]+(/versions/[^/]+)?/infer|execute)$")
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


class InflateError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def _is_zlib(data: bytes) -> bool:
    return len(data) >= 2 and data[0] & 0x0F == 8 and (data[0] << 8 | data[1]) % 31 == 0


def inflate_chunks(data: bytes, encoding: str, limit: int) -> list[bytes]:
    """Decode one content coding into chunks of at most OUT_CHUNK bytes, producing at most
    `limit` + 1 bytes in all: InflateError 413 as soon as the output passes `limit`."""
    gzip = _WBITS[encoding] == _WBITS["gzip"]
    wbits = _WBITS[encoding]
    if not gzip and not _is_zlib(data):
        wbits = -zlib.MAX_WBITS  # raw deflate (RFC 1951), which some clients send as "deflate"
    out: list[bytes] = []
    produced, pos, view = 0, 0, memoryview(data)
    d = zlib.decompressobj(wbits)
    while True:
        # the input goes in IN_CHUNK pieces: zlib copies what it has not consumed on every call
        piece = view[pos:pos + IN_CHUNK]
        pos += len(piece)
        rest = piece
        while True:
            try:
                chunk = d.decompress(rest, min(OUT_CHUNK, limit + 1 - produced))  # >= 1: at most limit + 1
            except zlib.error as e:
                raise InflateError(400, f"the {encoding} request body is corrupt: {e}") from None
            produced += len(chunk)
            if produced > limit:
                raise InflateError(413, f"the {encoding} request body inflates past the limit of "
                                        f"{limit} bytes")
            if chunk:
                out.append(chunk)
            rest = d.unconsumed_tail
            if d.eof or (not rest and not chunk):
                break
        if d.eof:
            rest = d.unused_data + bytes(view[pos:])
            if not rest:
                return out
            if not gzip:
                raise InflateError(400, f"{len(rest)} bytes after the end of the {encoding} stream")
            d, view, pos = zlib.decompressobj(wbits), memoryview(rest), 0  # the next gzip member
        elif pos >= len(view):
            raise InflateError(400, f"the {encoding} request body is truncated")


def inflate(data: bytes, encoding: str, limit: int) -> bytes:
    """Decode one content coding, producing at most `limit` bytes (InflateError 413 beyond)."""
    return b"".join(inflate_chunks(data, encoding, limit))


def deflate(data: bytes, encoding: str) -> bytes:
    c = zlib.compressobj(LEVEL, zlib.DEFLATED, _WBITS[encoding])
    return c.compress(data) + c.flush()


def choose_encoding(accept: str) -> str | None:
    """gzip or deflate if Accept-Encoding accepts one (by q value, gzip on a tie), else None."""
    best, best_q = None, 0.0
    for part in accept.split(","):
        coding, *params = [p.strip() for p in part.split(";")]
        coding = coding.lower()
        q = 1.0
        for p in params:
            if p.lower().startswith("q="):
                try:
                    q = float(p[2:])
                except ValueError:
                    q = 0.0
        for name in (("gzip", "deflate") if coding == "*" else (coding,)):
            if name in ("gzip", "deflate") and q > best_q:
                best, best_q = name, q
    return best


async def _off_loop(fn, data: bytes, *args):
    if len(data) >= OFFLOAD_BYTES:
        return await asyncio.to_thread(fn, data, *args)
    return fn(data, *args)


class CompressionMiddleware:
    def __init__(self, app, settings):
        self.app, self.limit = app, settings.max_body_bytes

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            return await self._http(scope, receive, send)
        return await self.app(scope, receive, send)

    async def _http(self, scope, receive, send):
        headers = scope.get("headers") or []
        coding = next((v.decode("latin-1") for k, v in headers if k == b"content-encoding"), "")
        codings = [c.strip().lower() for c in coding.split(",") if c.strip() and c.strip().lower() != "identity"]
        if codings:
            bad = [c for c in codings if c not in _WBITS]
            if bad:
                msg = f"unsupported Content-Encoding '{bad[0]}' (use gzip or deflate)"
                return await _send_json(send, 415, error_body(msg, [{"loc": ["headers", "Content-Encoding"],
                                                                    "msg": msg}]))
            result = await self._decoded(scope, receive, send, codings)
            if result is None:
                return
            scope, receive = result
        accept = next((v.decode("latin-1") for k, v in headers if k == b"accept-encoding"), "")
        wanted = choose_encoding(accept) if accept and COMPRESSED_PATHS.match(scope["path"]) else None
        if wanted is not None:
            send = _CompressingSend(send, wanted)
        await self.app(scope, receive, send)
        if wanted is not None:
            await send.finish()

    async def _decoded(self, scope, receive, send, codings):
        """(scope, receive) with the body decoded, or None once an error was answered."""
        from .middleware import BodyTooLarge

        parts, more, size = [], True, 0
        try:
            while more:
                message = await receive()
                if message["type"] != "http.request":
                    return None  # the client went away
                parts.append(message.get("body", b""))
                size += len(parts[-1])
                more = message.get("more_body", False)
        except BodyTooLarge as e:
            return await _send_json(send, 413, error_body(e.detail, e.details))
        try:
            if size <= INFLATE_ON_LOOP_BYTES and len(codings) == 1:
                chunks = _inflate_all(parts, codings, self.limit)
            else:
                chunks = await asyncio.to_thread(_inflate_all, parts, codings, self.limit)
        except InflateError as e:
            return await _send_json(send, e.status, error_body(e.message, [{"loc": ["body"], "msg": e.message}]))
        del parts
        new_headers = [(k, v) for k, v in scope["headers"] if k not in (b"content-encoding", b"content-length")]
        new_headers.append((b"content-length", str(sum(map(len, chunks))).encode()))
        chunks = chunks or [b""]
        sent = 0

        async def replay():
            nonlocal sent
            if sent < len(chunks):
                body, chunks[sent] = chunks[sent], b""  # handed on: the reader frees it
                sent += 1
                if sent % YIELD_EVERY == 0:  # a turn of the event loop: these messages never wait
                    await asyncio.sleep(0)
                return {"type": "http.request", "body": body, "more_body": sent < len(chunks)}
            return await receive()

        return {**scope, "headers": new_headers}, replay


def _inflate_all(parts: list[bytes], codings: list[str], limit: int) -> list[bytes]:
    """The body's chunks, every coding undone (the last applied first)."""
    data = parts[0] if len(parts) == 1 else b"".join(parts)
    chunks = [data]
    for k, coding in enumerate(reversed(codings)):
        if k:
            data = b"".join(chunks)
        chunks = inflate_chunks(data, coding, limit) if data else []
    return chunks


class _CompressingSend:
    """Buffers a 200 response and sends it compressed; anything else passes through."""

    def __init__(self, send, encoding: str):
        self.send = send
        self.encoding = encoding
        self.start: dict | None = None
        self.parts: list[bytes] = []
        self.passthrough = False

    async def __call__(self, message):
        if self.passthrough:
            return await self.send(message)
        if message["type"] == "http.response.start":
            names = {k.lower() for k, _ in message.get("headers", [])}
            if message["status"] != 200 or b"content-encoding" in names:
                self.passthrough = True
                return await self.send(message)
            self.start = message
            return None
        if message["type"] == "http.response.body" and self.start is not None:
            self.parts.append(message.get("body", b""))
            if not message.get("more_body", False):
                await self._flush()
            return None
        return await self.send(message)

    async def _flush(self) -> None:
        body = b"".join(self.parts)
        start, self.start, self.parts = self.start, None, []
        self.passthrough = True
        headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
        if len(body) >= MIN_SIZE:
            body = await _off_loop(deflate, body, self.encoding)
            headers.append((b"content-encoding", self.encoding.encode()))
        headers += [(b"content-length", str(len(body)).encode()), (b"vary", b"Accept-Encoding")]
        await self.send({**start, "headers": headers})
        await self.send({"type": "http.response.body", "body": body})

    async def finish(self) -> None:
        if self.start is not None:  # the app ended without a final body message
            await self._flush()
