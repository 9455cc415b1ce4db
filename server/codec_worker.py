"""What the JSON codec process runs (server/codec.py): decoding and encoding large JSON tensor bodies.

Bodies and arrays travel in `Segment`s (server/segments.py: shared memory without a name), whose
descriptors the server hands to this process with each call (SCM_RIGHTS over the socket pair
`serve` reads). The server creates every segment, the result's too (empty; this process sizes
and fills it), so only small values travel in the messages: dtype names, shapes, sizes, error
descriptions. A failure is returned as ("error", status, message, details), never raised, so the
server answers exactly as it would have for the same body parsed in-process.
"""

from __future__ import annotations

import os
from multiprocessing.reduction import recv_handle

import numpy as np
import pydantic
from segfuse.compiler.dtypes import DType

from .errors import ApiError
from .jsonio import dumps, invalid_json, json_array
from .models import BufferJson
from .request_decoding import decode_request_json
from .segments import Segment, write_all
from .tensors import check_shape, from_json_data, nbytes_of, parse_dtype


def _error(e: Exception, body: bytes = b"") -> tuple:
    if isinstance(e, ApiError):
        return ("error", e.status, e.message, e.details)
    if isinstance(e, pydantic.ValidationError):
        errs = e.errors()
        first = errs[0] if errs else {}
        if first.get("type") == "json_invalid":
            msg = invalid_json(first.get("msg", ""), body)
            return ("error", 400, msg, [{"loc": ["body"], "msg": msg}])
        details = [{"loc": ["body", *err.get("loc", ())], "msg": err.get("msg", "")} for err in errs]
        where = ".".join(str(p) for p in details[0]["loc"]) if details else "body"
        return ("error", 400, f"invalid request: {where}: {details[0]['msg'] if details else 'invalid'}", details)
    return ("error", 400, f"the body could not be decoded: {type(e).__name__}: {e}", [{"loc": ["body"], "msg": str(e)}])


def decode_buffer_json(body_fd: int, out_fd: int, size: int, max_rank: int, max_bytes: int) -> tuple:
    """A BufferJson body (the first `size` bytes of body_fd's memory) -> ("ok", dtype name, shape),
    the array's bytes in out_fd's memory."""
    seg = Segment(os.dup(body_fd))
    body = b""
    try:
        body = bytes(seg.buf[:size])
        doc = BufferJson.model_validate_json(body)
    except Exception as e:
        return _error(e, body)
    finally:
        seg.close()
    try:
        dt = parse_dtype(doc.dtype, ["body", "dtype"])
        shape = check_shape(doc.shape, ["body", "shape"], max_rank)
        n = nbytes_of(shape, dt)
        if n > max_bytes:
            raise ApiError(413, f"buffer would hold {n} bytes, over the limit of {max_bytes} bytes per buffer",
                           [{"loc": ["body"], "msg": "over the limit"}])
        host = from_json_data(doc.data, dt, shape, ["body", "data"])
    except Exception as e:
        return _error(e)
    write_all(out_fd, np.ascontiguousarray(host).reshape(-1).view(np.uint8))
    return ("ok", dt.value, list(shape))


def encode_buffer_json(array_fd: int, out_fd: int, name: str, dtype: str, shape: list) -> tuple:
    """The array in array_fd's memory as a BufferJsonOut body, in out_fd's memory -> ("ok", its size)."""
    seg = Segment(os.dup(array_fd))
    try:
        # the buffer's own dtype: on the GPU a bfloat16 buffer comes to the host as its uint16 bits
        a = json_array(np.ndarray(tuple(shape), DType(dtype).np, buffer=seg.buf))
        raw = dumps({"name": name, "dtype": dtype, "shape": shape, "data": a})
        del a
    finally:
        seg.close()
    write_all(out_fd, raw)
    return ("ok", len(raw))


# "request": large infer and execute bodies (server/request_decoding.py, server/request_bodies.py)
CALLS = {"decode": decode_buffer_json, "encode": encode_buffer_json, "request": decode_request_json}


def serve(conn) -> None:
    """The process's loop: a call is (name, arguments, number of descriptors), then the descriptors;
    the answer is the function's result. Ends when the server closes its end (or dies)."""
    while True:
        try:
            name, args, count = conn.recv()
            fds = [recv_handle(conn) for _ in range(count)]
        except (EOFError, OSError):
            return
        try:
            result = CALLS[name](*fds, *args)
        except Exception as e:  # out of memory, say: the request fails, the process stays
            result = _error(e)
        finally:
            for fd in fds:
                os.close(fd)
        conn.send(result)
