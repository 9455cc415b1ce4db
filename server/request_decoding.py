"""What the JSON codec process runs for a large infer or execute body (server/request_bodies.py).

The request is parsed and validated as in-process, and each input's inline `data` decoded into an
array of the input's datatype and shape (the only large part of a request). The answer is the
request without its data, with per input where its array lies in the result's memory or the error
decoding it raised; the arrays themselves travel in shared memory (server/codec_worker.py).
A refusal is returned, never raised, as codec_worker's functions do.
"""

from __future__ import annotations

import os

import numpy as np
from fastapi.exceptions import RequestValidationError

from .binary import split_body
from .errors import ApiError, bad_request, too_large
from .jsonio import validate_json
from .models import ExecuteRequest, InferRequest
from .segments import Segment
from .tensors import check_shape, from_json_data, parse_dtype

MODELS = {"InferRequest": InferRequest, "ExecuteRequest": ExecuteRequest}
ALIGN = 64  # arrays in the result start at multiples of this (any dtype's alignment)


def _refusal(e: ApiError) -> tuple:
    return ("error", e.status, e.message, e.details)


def _input_array(inp, loc: list, max_rank: int):
    """(dtype, array) of the input's data, of its datatype and shape; None where the server refuses
    the input before it would read the data (no or a bad datatype or shape)."""
    if inp.datatype is None or inp.shape is None:
        return None
    try:
        dt = parse_dtype(inp.datatype, loc + ["datatype"])
        shape = check_shape(inp.shape, loc + ["shape"], max_rank)
    except ApiError:
        return None
    return dt, from_json_data(inp.data, dt, shape, loc + ["data"])


def _decoded_input(inp, i: int, max_rank: int):
    """(what the server puts back as the input's data, the array or None)."""
    loc = ["inputs", i]
    try:
        got = _input_array(inp, loc, max_rank)
    except ApiError as e:
        return _refusal(e), None
    except MemoryError:
        return _refusal(too_large(f"inputs[{i}].data: not enough memory to decode it", loc + ["data"])), None
    if got is None:  # never read by the server (see _input_array), only seen to be there
        return _refusal(bad_request(f"inputs[{i}].data needs a valid datatype and shape", loc + ["data"])), None
    dt, a = got
    return ("array", 0, dt.value, list(a.shape)), a


def _write_arrays(out_fd: int, arrays: list, size: int) -> None:
    """out_fd's memory becomes `size` bytes holding each (offset, array) at its offset."""
    os.ftruncate(out_fd, max(size, 1))
    for offset, a in arrays:
        view = memoryview(np.ascontiguousarray(a).reshape(-1).view(np.uint8))
        done = 0
        while done < len(view):
            done += os.pwrite(out_fd, view[done:], offset + done)


def decode_request_json(body_fd: int, out_fd: int, size: int, header_length: str | None, model_name: str,
                        max_rank: int) -> tuple:
    """A request body (the first `size` bytes of body_fd's memory) -> ("ok", the request without
    its inline data, per input None | ("array", offset, dtype, shape) | ("error", status, message,
    details), the JSON part's size), the arrays in out_fd's memory; ("invalid", errors) where
    validation failed (RequestValidationError); ("error", status, message, details) otherwise."""
    seg = Segment(os.dup(body_fd))
    try:
        view = seg.buf[:size]
        head, tail = split_body(view, header_length)  # the checks (and errors) of the in-process path
        head = bytes(head)
        del tail, view
        req = validate_json(MODELS[model_name], head)
    except RequestValidationError as e:
        return ("invalid", [{"loc": tuple(err.get("loc", ())), "msg": err.get("msg", ""),
                             "type": err.get("type", "")} for err in e.errors()])
    except ApiError as e:
        return _refusal(e)
    finally:
        seg.close()
    head_size = len(head)
    del head
    decoded, arrays, end = [], [], 0
    for i, inp in enumerate(req.inputs):
        if inp.data is None:
            decoded.append(None)
            continue
        entry, a = _decoded_input(inp, i, max_rank)
        inp.data = None
        if a is not None:
            entry = ("array", end, *entry[2:])
            arrays.append((end, a))
            end += -(-a.nbytes // ALIGN) * ALIGN
        decoded.append(entry)
    _write_arrays(out_fd, arrays, end)
    return ("ok", req, decoded, head_size)
