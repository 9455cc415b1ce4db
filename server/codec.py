"""Large JSON tensor bodies, decoded and encoded without blocking the event loop.

Parsing or writing tens of megabytes of JSON numbers holds the GIL for the whole call (json,
orjson and pydantic alike), so a thread does not help: every other request, health checks too,
waits for it (7.2 s for a 64 MiB buffer before this module). Bodies from `LARGE` bytes up are
therefore handled by a helper process (`codec_worker.py`), and nothing large is copied while
holding the GIL on this side either:

- a request body is streamed, chunk by chunk as the server receives it, into a shared-memory
  segment; the helper parses it and leaves the array in another segment, which becomes a NumPy
  view here (NumPy copies it to the buffer's device with the GIL released);
- a response: the array is copied into a segment (GIL released), the helper writes the JSON into
  another, and the response streams from there in `CHUNK`s.

Segments have no name (server/segments.py): their descriptors go to the helper with each call
over a socket pair, so no client can register one as a region and a SIGKILL leaves nothing in
/dev/shm. The helper process starts at the first large body (about a second, once) and serves
bodies one at a time, in the order one thread sends them; smaller bodies are parsed in-process
as before. `timings_us` is not part of buffer responses, so the codec's time shows in the request
latency and in `segfuse_codec_seconds`.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from multiprocessing.reduction import send_handle

import numpy as np

from . import codec_worker
from .binary import fill_body
from .errors import ApiError
from .segments import Segment, anonymous_fd

log = logging.getLogger("segfuse.server")

LARGE = 1 << 20  # bodies from this size up go through the helper process
# response chunks: reading a fresh segment maps its pages on the event loop, about 1 ms per MiB
# on the GPU host's VM, so a chunk is kept to a fraction of the health target (5 ms)
CHUNK = 256 << 10
SPARE_SEGMENTS, SPARE_MAX_BYTES = 2, 512 << 20  # request-body segments kept for reuse


def _drop(seg: Segment) -> None:
    with suppress(Exception):
        seg.close()


async def drop_later(seg: Segment) -> None:
    """`_drop` on a worker thread: unmapping a segment of tens of MiB frees its pages, 6-18 ms
    measured on this machine, which on the event loop is a stall of every request."""
    try:
        await asyncio.to_thread(_drop, seg)
    except BaseException:  # cancelled, or no loop to run the thread from (a generator's late close)
        _drop(seg)
        raise


class _Helper:
    """The codec process and the server's end of its socket pair. Used from one thread only."""

    def __init__(self):
        ctx = multiprocessing.get_context("spawn")
        self.conn, theirs = ctx.Pipe(duplex=True)  # a socket pair: descriptors can travel on it
        self.proc = ctx.Process(target=codec_worker.serve, args=(theirs,), name="segfuse-codec", daemon=True)
        self.proc.start()
        theirs.close()

    def call(self, name: str, fds: list[int], args: tuple) -> tuple:
        self.conn.send((name, args, len(fds)))
        for fd in fds:
            send_handle(self.conn, fd, self.proc.pid)
        return self.conn.recv()

    def stop(self) -> None:
        with suppress(OSError):
            self.conn.close()  # the helper reads the end of its input and returns
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)


class _Call:
    """Duplicates of a call's descriptors, made on the event loop before the call is queued: the caller
    may close its own (cancelled) while the call thread still sends them."""

    def __init__(self, fds: list[int]):
        self.fds = [os.dup(fd) for fd in fds]

    def close(self) -> None:
        fds, self.fds = self.fds, []
        for fd in fds:
            os.close(fd)


class JsonCodec:
    def __init__(self):
        self._helper: _Helper | None = None
        self._thread: ThreadPoolExecutor | None = None  # one thread: calls reach the helper in order
        # request-body segments kept for the next large body: their pages are mapped already, so
        # filling one does not fault in fresh memory on the event loop
        self._spare: list[Segment] = []

    def _body_segment(self, size: int) -> Segment:
        for k, seg in enumerate(self._spare):
            if seg.size >= size:
                return self._spare.pop(k)
        return Segment.new(size)

    async def recycle(self, seg: Segment) -> None:
        if len(self._spare) < SPARE_SEGMENTS and seg.size <= SPARE_MAX_BYTES:
            self._spare.append(seg)
        else:
            await drop_later(seg)

    def shutdown(self) -> None:
        while self._spare:
            _drop(self._spare.pop())
        if self._thread is not None:
            self._thread.shutdown(wait=True, cancel_futures=True)
            self._thread = None
        if self._helper is not None:
            self._helper.stop()
            self._helper = None

    def _roundtrip(self, name: str, call: _Call, args: tuple) -> tuple:
        """On the call thread: the helper's answer, in a new helper if the first one died (killed, out of
        memory) during the call; None if that one died too."""
        try:
            for attempt in range(2):
                try:
                    if self._helper is None:
                        self._helper = _Helper()
                    return self._helper.call(name, call.fds, args)
                except (EOFError, OSError) as e:
                    if self._helper is not None:
                        self._helper.stop()
                        self._helper = None
                    log.warning("the JSON codec process failed (%s: %s)%s", type(e).__name__, e,
                                "; starting another" if attempt == 0 else "")
            return None
        finally:
            call.close()

    async def call(self, name: str, fds: list[int], *args) -> tuple:
        if self._thread is None:
            self._thread = ThreadPoolExecutor(1, thread_name_prefix="segfuse-codec")
        call = _Call(fds)
        future = self._thread.submit(self._roundtrip, name, call, args)
        try:
            result = await asyncio.wrap_future(future)
        except asyncio.CancelledError:
            if future.cancel():  # never started: nobody else closes the duplicates
                call.close()
            raise
        if result is None:
            raise ApiError(503, "the JSON codec process failed twice on this body; retry, or send the tensor "
                                "as raw bytes (application/octet-stream)", [{"loc": ["body"], "msg": "codec failed"}],
                           {"Retry-After": "1"})
        if result[0] == "error":
            _, status, message, details = result
            raise ApiError(status, message, details)
        return result

    async def stream_body(self, chunks: AsyncIterator[bytes], size: int) -> Segment:
        """The request body (`size` bytes, its Content-Length) copied into a new segment as it arrives."""
        seg = self._body_segment(size)
        try:
            await fill_body(chunks, seg.buf, size)
        except BaseException:
            await self.recycle(seg)
            raise
        return seg

    async def decode_buffer(self, body: Segment, size: int, max_rank: int,
                            max_bytes: int) -> tuple[str, list, np.ndarray, Segment]:
        """(dtype name, shape, host array view, its segment: `release` it once copied)."""
        out = anonymous_fd()
        try:
            _, dtype, shape = await self.call("decode", [body.fd, out], size, max_rank, max_bytes)
        except BaseException:
            os.close(out)
            raise
        finally:
            await self.recycle(body)
        from segfuse.compiler.dtypes import DType

        seg = Segment(out)
        dt = DType(dtype)
        return dtype, shape, np.ndarray(tuple(shape), dt.np, buffer=seg.buf), seg

    async def encode_buffer(self, name: str, dtype: str, host: np.ndarray) -> tuple[int, AsyncIterator[bytes]]:
        """A BufferJsonOut body of `host`: (its size, its chunks)."""
        seg = Segment.new(host.nbytes)
        out = anonymous_fd()
        try:
            await asyncio.to_thread(np.copyto, np.ndarray(host.shape, host.dtype, buffer=seg.buf), host)
            _, size = await self.call("encode", [seg.fd, out], name, dtype, list(host.shape))
        except BaseException:
            os.close(out)
            raise
        finally:
            await drop_later(seg)
        out_seg = Segment(out)

        async def chunks() -> AsyncIterator[bytes]:
            try:
                for pos in range(0, size, CHUNK):
                    yield bytes(out_seg.buf[pos:min(pos + CHUNK, size)])
            finally:
                await drop_later(out_seg)

        return size, chunks()


async def release(seg: Segment) -> None:
    """Gives back a segment `decode_buffer` returned, once its array was copied."""
    await drop_later(seg)
