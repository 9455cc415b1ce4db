"""Infer and execute request bodies, read and decoded without blocking the event loop.

A small body is read whole and parsed in-process, as before. A body from `codec.LARGE` bytes up
never is: parsing tens of MiB of JSON numbers holds the GIL for seconds (a thread would block every
other request just the same), so it is copied chunk by chunk into a shared-memory segment as it
arrives and the JSON codec process (server/codec.py) parses it. That process also decodes each
input's inline `data` into an array (the only large part of a request), and hands back the request
without its data plus the arrays in another segment. Here the arrays are copied out on a worker
thread (NumPy releases the GIL) and put back as `tensors.Decoded` values, which `from_json_data`
returns where it would have decoded the list: a large request is checked exactly as a small one,
in the same order, with the same errors.

A binary-extension body whose JSON header is small keeps its raw tail in host memory (pinned on the
GPU) as buffer PUTs do; only its header is parsed here.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np
import pydantic
from fastapi.exceptions import RequestValidationError

from .binary import BinaryReader, decode_request, fill_body
from .codec import LARGE, release
from .errors import ApiError
from .segments import Segment, anonymous_fd
from .tensors import Decoded

YIELD_EVERY = 16  # chunks copied between two turns of the event loop (replayed chunks never wait)


@dataclass
class LargeBody:
    """A body of `size` bytes read into host memory: a codec segment (`seg`) when its JSON is large,
    else a host buffer (`host`) whose JSON header is small."""

    size: int
    seg: Segment | None = None
    host: np.ndarray | None = None


def _header_length(header_length: str | None) -> int | None:
    """The binary header's length when it is well formed (split_body reports it otherwise)."""
    if header_length is None or not (header_length.isascii() and header_length.isdigit()) or len(header_length) > 20:
        return None
    return int(header_length)


async def _yielding(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """`chunks`, with a turn of the event loop every few: a body replayed from memory (decompressed,
    or collected before its size was known) arrives without ever waiting."""
    k = 0
    async for chunk in chunks:
        yield chunk
        k += 1
        if k % YIELD_EVERY == 0:
            await asyncio.sleep(0)


async def _replay(parts: list[bytes]) -> AsyncIterator[bytes]:
    for p in parts:
        yield p


async def read_body(rt, chunks: AsyncIterator[bytes], declared: int | None,
                    header_length: str | None) -> bytes | LargeBody:
    """The body: its bytes when small, else a LargeBody (never joined on the event loop).
    `declared`: its Content-Length, when it has one."""
    if declared is None or declared < LARGE:
        parts, total = [], 0
        async for chunk in chunks:
            parts.append(chunk)
            total += len(chunk)
        if total < LARGE:
            return parts[0] if len(parts) == 1 else b"".join(parts)
        chunks, declared = _replay(parts), total  # chunked (no Content-Length): copied on below
    chunks = _yielding(chunks)
    n = _header_length(header_length)
    if n is not None and n < LARGE:  # a small JSON header and a raw tail: no parsing to offload
        host = rt.arrays.host_buffer(declared)
        await fill_body(chunks, memoryview(host), declared)
        return LargeBody(declared, host=host)
    return LargeBody(declared, seg=await rt.codec.stream_body(chunks, declared))


async def decode(rt, model: type[pydantic.BaseModel], body: bytes | LargeBody, header_length: str | None):
    """(the validated request, a BinaryReader of the tail or None), as `binary.decode_request`."""
    if isinstance(body, (bytes, bytearray, memoryview)):
        return decode_request(model, body, header_length)
    if body.host is not None:
        return decode_request(model, memoryview(body.host), header_length)
    codec, out, tail = rt.codec, anonymous_fd(), None
    try:
        try:
            result = await codec.call("request", [body.seg.fd, out], body.size, header_length, model.__name__,
                                       rt.settings.max_rank)
            if result[0] == "invalid":
                raise RequestValidationError(result[1])
            _, req, decoded, head_size = result
            if header_length is not None:  # the raw tail, copied before the segment is reused
                tail = np.empty(body.size - head_size, np.uint8)
                src = np.frombuffer(body.seg.buf, np.uint8, tail.size, head_size)
                await asyncio.to_thread(np.copyto, tail, src)
                del src
        finally:
            await codec.recycle(body.seg)
    except BaseException:
        os.close(out)
        raise
    arrays = Segment(out)
    try:
        await _take_arrays(req, decoded, arrays)
    finally:
        await release(arrays)
    return req, (BinaryReader(memoryview(tail)) if tail is not None else None)


async def _take_arrays(req, decoded: list, arrays: Segment) -> None:
    """Each input's `data` as the codec process left it: a Decoded array (copied out of `arrays`
    on a worker thread) or the error decoding it raised."""
    from segfuse.compiler.dtypes import DType

    for inp, entry in zip(req.inputs, decoded):
        if entry is None:
            continue
        if entry[0] == "error":
            _, status, message, details = entry
            inp.data = Decoded(error=ApiError(status, message, details))
            continue
        _, offset, dtype, shape = entry
        dt = np.dtype(DType(dtype).np)
        src = np.ndarray(tuple(shape), dt, buffer=arrays.buf, offset=offset)
        a = np.empty(src.shape, dt)
        await asyncio.to_thread(np.copyto, a, src)
        del src
        inp.data = Decoded(array=a)
