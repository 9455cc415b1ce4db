"""The binary tensor data extension (Triton's `binary_tensor_data`).

A body is a JSON header followed by raw little-endian row-major tensor bytes, in the order the
tensors appear in the header. `Inference-Header-Content-Length` gives the header's length; each
binary tensor carries `parameters.binary_data_size`.
"""

from __future__ import annotations

import pydantic

from .errors import bad_request
from .jsonio import dumps, validate_json

HEADER = "inference-header-content-length"
CONTENT_TYPE = "application/octet-stream"


def split_body(body: bytes, header_length: str | None) -> tuple[bytes, memoryview]:
    """(the JSON header's bytes, the binary tail). Without the header, the whole body is JSON."""
    if header_length is None:
        n = len(body)
    else:
        if not (header_length.isascii() and header_length.isdigit()) or len(header_length) > 20:
            raise bad_request(f"Inference-Header-Content-Length {header_length[:40]!r} must be the JSON "
                              "header's length in bytes, digits only", ["headers", "Inference-Header-Content-Length"])
        n = int(header_length)
        if not 0 < n <= len(body):
            raise bad_request(f"Inference-Header-Content-Length {n} is outside the body's "
                              f"{len(body)} bytes", ["headers", "Inference-Header-Content-Length"])
    if n == len(body):
        return body, memoryview(b"")
    view = memoryview(body)
    return bytes(view[:n]), view[n:]


def decode_request(model: type[pydantic.BaseModel], body: bytes, header_length: str | None):
    """(the validated request model, a BinaryReader of the tail or None): parsed and validated in
    one pass (pydantic's own JSON parser), errors located under "body"."""
    head, tail = split_body(body, header_length)
    req = validate_json(model, head)
    return req, (BinaryReader(tail) if header_length is not None else None)


class BinaryReader:
    """Hands out consecutive slices of the binary tail."""

    def __init__(self, tail: memoryview):
        self.tail = tail
        self.pos = 0

    def take(self, size: int, loc: list) -> memoryview:
        if size < 0 or self.pos + size > len(self.tail):
            raise bad_request(f"binary_data_size {size} runs past the end of the body "
                              f"({len(self.tail) - self.pos} binary bytes left)", loc)
        out = self.tail[self.pos:self.pos + size]
        self.pos += size
        return out

    def finish(self) -> None:
        if self.pos != len(self.tail):
            raise bad_request(f"{len(self.tail) - self.pos} binary bytes after the last tensor",
                              ["body"])


def join_body(header: dict, chunks: list[bytes]) -> tuple[bytes, int]:
    """(body, header length) for a response with binary outputs."""
    head = dumps(header)
    return b"".join([head, *chunks]), len(head)


async def fill_body(chunks, view, size: int) -> None:
    """Copy a body of `size` bytes (its Content-Length) into `view` chunk by chunk as it arrives:
    no whole-body join on the event loop. 400 when it is longer or shorter than declared."""
    pos = 0
    async for chunk in chunks:
        end = pos + len(chunk)
        if end > size:
            raise bad_request(f"the body is longer than its Content-Length of {size} bytes", ["body"])
        view[pos:end] = chunk
        pos = end
    if pos != size:
        raise bad_request(f"the body ended after {pos} of its {size} bytes", ["body"])
