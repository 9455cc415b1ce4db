"""Large JSON tensor bodies, decoded and encoded without blocking the event loop.

Parsing or writing tens of megabytes of JSON numbers holds the GIL for the whole call (json,
orjson and pydantic alike), so a thread does not help: every other request, health checks too,
waits for it (7.2 s for a 64 MiB buffer before this module). Bodies from `LARGE` bytes up are
therefore handled by a helper process (`codec_worker.py`), and nothing large is copied while
holding the GIL on this side either:

- a request body is streamed, chunk by chunk as the server receives it, into a POSIX shared-memory
  segment; the helper parses it and leaves the array in another segment, which becomes a NumPy
  view here (NumPy copies it to the buffer's device with the GIL released);
- a response: the array is copied into a segment (GIL released), the helper writes the JSON into
  another, and the response streams from there in 1 MiB chunks.

The helper process starts at the first large body (about a second, once) and serves bodies one at a
time; smaller bodies are parsed in-process as before. `timings_us` is not part of buffer responses,
so the codec's time shows in the request latency and in `segfuse_codec_seconds`.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
from collections.abc import AsyncIterator
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from contextlib import suppress
from multiprocessing import shared_memory

import numpy as np

from . import codec_worker
from .binary import fill_body
from .errors import ApiError

log = logging.getLogger("segfuse.server")

LARGE = 1 << 20  # bodies from this size up go through the helper process
# response chunks: reading a fresh segment maps its pages on the event loop, about 1 ms per MiB
# on the GPU host's VM, so a chunk is kept to a fraction of the health target (5 ms)
CHUNK = 256 << 10
SPARE_SEGMENTS, SPARE_MAX_BYTES = 2, 512 << 20  # request-body segments kept for reuse


def _segment(size: int) -> shared_memory.SharedMemory:
    return codec_worker._create(size)


def _attach(name: str) -> shared_memory.SharedMemory:
    return codec_worker._open(name)


def _drop(seg: shared_memory.SharedMemory) -> None:
    with suppress(Exception):
        seg.close()
    with suppress(Exception):
        seg.unlink()


async def drop_later(seg: shared_memory.SharedMemory) -> None:
    """`_drop` on a worker thread: unmapping and unlinking a segment of tens of MiB frees its pages,
    6-18 ms measured on this machine, which on the event loop is a stall of every request."""
    try:
        await asyncio.to_thread(_drop, seg)
    except BaseException:  # cancelled, or no loop to run the thread from (a generator's late close)
        _drop(seg)
        raise


class JsonCodec:
    def __init__(self):
        self._pool: ProcessPoolExecutor | None = None
        # request-body segments kept for the next large body: their pages are mapped already, so
        # filling one does not fault in fresh memory on the event loop
        self._spare: list[shared_memory.SharedMemory] = []

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        return self._pool

    def _body_segment(self, size: int) -> shared_memory.SharedMemory:
        for k, seg in enumerate(self._spare):
            if seg.size >= size:
                return self._spare.pop(k)
        return _segment(size)

    async def _recycle(self, seg: shared_memory.SharedMemory) -> None:
        if len(self._spare) < SPARE_SEGMENTS and seg.size <= SPARE_MAX_BYTES:
            self._spare.append(seg)
        else:
            await drop_later(seg)

    def shutdown(self) -> None:
        while self._spare:
            _drop(self._spare.pop())
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    async def _call(self, fn, *args) -> tuple:
        loop = asyncio.get_running_loop()
        try:
            result = await loop.run_in_executor(self._executor(), fn, *args)
        except BrokenProcessPool:  # the helper died (killed, out of memory): one more try in a new one
            log.warning("the JSON codec process died; starting another")
            self._pool = None
            try:
                result = await loop.run_in_executor(self._executor(), fn, *args)
            except BrokenProcessPool:
                self._pool = None
                raise ApiError(503, "the JSON codec process failed twice on this body; retry, or send the tensor "
                                    "as raw bytes (application/octet-stream)", [{"loc": ["body"], "msg": "codec failed"}],
                               {"Retry-After": "1"}) from None
        if result[0] == "error":
            _, status, message, details = result
            raise ApiError(status, message, details)
        return result

    async def stream_body(self, chunks: AsyncIterator[bytes], size: int) -> shared_memory.SharedMemory:
        """The request body (`size` bytes, its Content-Length) copied into a new segment as it arrives."""
        seg = self._body_segment(size)
        try:
            await fill_body(chunks, seg.buf, size)
        except BaseException:
            await self._recycle(seg)
            raise
        return seg

    async def decode_buffer(self, body: shared_memory.SharedMemory, size: int, max_rank: int,
                            max_bytes: int) -> tuple[str, list, np.ndarray, shared_memory.SharedMemory]:
        """(dtype name, shape, host array view, its segment: `release` it once copied)."""
        try:
            _, dtype, shape, name = await self._call(codec_worker.decode_buffer_json, body.name, size, max_rank,
                                                     max_bytes)
        finally:
            await self._recycle(body)
        from segfuse.compiler.dtypes import DType

        seg = _attach(name)
        dt = DType(dtype)
        return dtype, shape, np.ndarray(tuple(shape), dt.np, buffer=seg.buf), seg

    async def encode_buffer(self, name: str, dtype: str, host: np.ndarray) -> tuple[int, AsyncIterator[bytes]]:
        """A BufferJsonOut body of `host`: (its size, its chunks)."""
        seg = _segment(host.nbytes)
        try:
            await asyncio.to_thread(np.copyto, np.ndarray(host.shape, host.dtype, buffer=seg.buf), host)
            _, out_name, size = await self._call(codec_worker.encode_buffer_json, seg.name, name, dtype,
                                                 list(host.shape))
        finally:
            await drop_later(seg)
        out = _attach(out_name)

        async def chunks() -> AsyncIterator[bytes]:
            try:
                for pos in range(0, size, CHUNK):
                    yield bytes(out.buf[pos:min(pos + CHUNK, size)])
            finally:
                await drop_later(out)

        return size, chunks()


async def release(seg: shared_memory.SharedMemory) -> None:
    """Gives back a segment `decode_buffer` returned, once its array was copied."""
    await drop_later(seg)
