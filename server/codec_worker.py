"""What the JSON codec process runs (server/codec.py): decoding and encoding large JSON tensor bodies.

Every function here takes and returns only small values (names of shared-memory segments, dtype
names, shapes, error descriptions), so nothing large is pickled; the bodies and the arrays travel
through POSIX shared memory. A failure is returned as ("error", status, message, details), never
raised, so the server answers exactly as it would have for the same body parsed in-process.
"""

from __future__ import annotations

from multiprocessing import shared_memory

import numpy as np
import pydantic
from segfuse.compiler.dtypes import DType

from .errors import ApiError
from .jsonio import dumps, invalid_json, json_array
from .models import BufferJson
from .tensors import check_shape, from_json_data, nbytes_of, parse_dtype


def _open(name: str) -> shared_memory.SharedMemory:
    # Segments are created and unlinked by the server process; this process only maps them.
    return shared_memory.SharedMemory(name=name, create=False, track=False) if _TRACK_ARG else \
        shared_memory.SharedMemory(name=name, create=False)


def _create(size: int) -> shared_memory.SharedMemory:
    """A segment the server process unlinks once it has read it."""
    return shared_memory.SharedMemory(create=True, size=max(size, 1), track=False) if _TRACK_ARG else \
        shared_memory.SharedMemory(create=True, size=max(size, 1))


try:  # Python 3.13+: keep segments away from the resource tracker (the server owns them)
    shared_memory.SharedMemory.__init__.__code__.co_varnames.index("track")
    _TRACK_ARG = True
except ValueError:
    _TRACK_ARG = False


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


def decode_buffer_json(body_name: str, size: int, max_rank: int, max_bytes: int) -> tuple:
    """A BufferJson body in segment `body_name` -> ("ok", dtype name, shape, result segment name)."""
    seg = _open(body_name)
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
    out = _create(host.nbytes)
    try:
        np.ndarray(host.shape, host.dtype, buffer=out.buf)[...] = host
    finally:
        out.close()
    return ("ok", dt.value, list(shape), out.name)


def encode_buffer_json(array_name: str, name: str, dtype: str, shape: list) -> tuple:
    """The array in segment `array_name` as a BufferJsonOut body -> ("ok", segment name, size)."""
    seg = _open(array_name)
    try:
        # the buffer's own dtype: on the GPU a bfloat16 buffer comes to the host as its uint16 bits
        a = json_array(np.ndarray(tuple(shape), DType(dtype).np, buffer=seg.buf))
        raw = dumps({"name": name, "dtype": dtype, "shape": shape, "data": a})
        del a
    finally:
        seg.close()
    out = _create(len(raw))
    try:
        out.buf[:len(raw)] = raw
    finally:
        out.close()
    return ("ok", out.name, len(raw))
