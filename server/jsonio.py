"""JSON for request and response bodies.

Responses are written with orjson: several times faster than the standard library and pydantic's
dump for the bodies the hot path sends, and it writes NumPy arrays itself (no `tolist()` of every
element). NaN and infinities are written as the strings "NaN", "Infinity" and "-Infinity" (as
protobuf's JSON mapping does), and read back from them (server/tensors.py `from_json_data`).

Requests are parsed by one parser, pydantic's (jiter), whether into a model (`validate_json`) or
into plain values (`loads`), so every body has the same limits (docs/http-api.md, "Limits"): JSON
nested at most `MAX_DEPTH` levels, integer literals of at most `MAX_DIGITS` digits, UTF-8 only.
Breaking one is a 400 located at the body, never a RecursionError.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pydantic
import pydantic_core
from fastapi.exceptions import RequestValidationError

from .errors import bad_request

_OPTIONS = orjson.OPT_SERIALIZE_NUMPY
MAX_DEPTH = 200  # jiter's recursion limit
MAX_DIGITS = 4300  # jiter's (and Python's int()) limit on an integer literal


def dumps(obj) -> bytes:
    return orjson.dumps(obj, option=_OPTIONS)


# Floats JSON has no number for, written and read as protobuf's JSON mapping does (and KServe's
# gRPC-to-JSON with it): the strings "NaN", "Infinity", "-Infinity".
SPECIAL_FLOATS = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


def json_array(a: np.ndarray):
    """A host array as orjson writes it: flat row-major (KServe's flattened form), contiguous, and
    2-byte floats (float16, bfloat16) widened to float32 (orjson has no 2-byte floats)."""
    flat = np.ascontiguousarray(a).reshape(-1)
    if flat.dtype.itemsize == 2 and flat.dtype.kind not in "iub":
        flat = flat.astype(np.float32)
    elif flat.dtype.byteorder == ">":
        flat = flat.astype(flat.dtype.newbyteorder("="))
    if flat.dtype.kind == "f" and flat.size and not np.isfinite(flat).all():
        return special_floats_list(flat)
    return flat


def special_floats_list(flat: np.ndarray) -> list:
    """A float array with NaN or infinities as a list whose non-finite entries are the strings of
    SPECIAL_FLOATS (orjson and pydantic would write null, which reads back as no number at all)."""
    out = flat.tolist()
    for i in np.flatnonzero(~np.isfinite(flat)).tolist():
        v = out[i]
        out[i] = "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")
    return out


def invalid_json(parser_msg: str, body: bytes | str, what: str = "the request body") -> str:
    """The message for a body the parser refused, with the limit it broke when it broke one."""
    if isinstance(body, (bytes, bytearray, memoryview)):
        try:
            bytes(body).decode("utf-8")
        except UnicodeDecodeError as e:
            return f"{what} is not UTF-8 (byte {e.start} is not valid UTF-8; JSON must be UTF-8)"
    msg = parser_msg.removeprefix("Invalid JSON: ")
    if "recursion limit" in msg:
        msg += f" (JSON may nest at most {MAX_DEPTH} levels deep)"
    elif "number out of range" in msg:
        msg += f" (an integer literal may have at most {MAX_DIGITS} digits)"
    return f"{what} is not valid JSON: {msg}"


def loads(body: bytes | str, loc: tuple | list = ("body",), what: str = "the request body") -> Any:
    """`body` as plain Python values, or a 400 at `loc`."""
    try:
        return pydantic_core.from_json(body)
    except ValueError as e:
        raise bad_request(invalid_json(str(e), body, what), loc) from None


def validate_json(model: type[pydantic.BaseModel], body: bytes):
    """`body` as a `model`, parsed and validated in one pass; errors located under "body" (a
    malformed body: 400; fields: RequestValidationError, which errors.py answers with 400)."""
    try:
        return model.model_validate_json(body)
    except pydantic.ValidationError as e:
        errors = e.errors()
        first = errors[0] if errors else {}
        if first.get("type") == "json_invalid":
            raise bad_request(invalid_json(first.get("msg", ""), body), ["body"]) from None
        if first.get("type") == "model_type" and not first.get("loc"):
            raise bad_request("the request body must be a JSON object", ["body"]) from None
        raise RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in errors]) from None
