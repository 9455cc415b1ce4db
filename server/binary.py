"""The binary tensor data extension (Triton's `binary_tensor_data`).

A body is a JSON header followed by raw little-endian row-major tensor bytes, in the order the
tensors appear in the header. `Inference-Header-Content-Length` gives the header's length; each
binary tensor carries `parameters.binary_data_size`.
"""

from __future__ import annotations

import json

from .errors import bad_request

HEADER = "inference-header-content-length"
CONTENT_TYPE = "application/octet-stream"


def split_body(body: bytes, header_length: str | None) -> tuple[dict, memoryview]:
    """(JSON header as a dict, the binary tail). Without the header, the whole body is JSON."""
    if header_length is None:
        n = len(body)
    else:
        try:
            n = int(header_length)
        except ValueError:
            raise bad_request(f"Inference-Header-Content-Length '{header_length}' is not an integer",
                              ["headers", "Inference-Header-Content-Length"]) from None
        if not 0 < n <= len(body):
            raise bad_request(f"Inference-Header-Content-Length {n} is outside the body's "
                              f"{len(body)} bytes", ["headers", "Inference-Header-Content-Length"])
    try:
        header = json.loads(body[:n])
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise bad_request(f"the request body is not valid JSON: {e}", ["body"]) from None
    if not isinstance(header, dict):
        raise bad_request("the request body must be a JSON object", ["body"])
    return header, memoryview(body)[n:]


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
    head = json.dumps(header, separators=(",", ":")).encode()
    return b"".join([head, *chunks]), len(head)
