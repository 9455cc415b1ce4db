"""Tensor codecs: dtype names, JSON data lists, raw little-endian bytes and .npy files, all to and
from NumPy arrays on the host. Every failure is an ApiError naming where in the request it is."""

from __future__ import annotations

import io
import math

import numpy as np
from segfuse.compiler.dtypes import FROM_KSERVE, KSERVE_NAMES, DType, from_numpy

from .errors import bad_request
from .jsonio import SPECIAL_FLOATS, json_array


def parse_dtype(text: str, loc: tuple = ()) -> DType:
    """A segfuse name ('int64') or a KServe name ('INT64')."""
    if text in FROM_KSERVE:
        return FROM_KSERVE[text]
    try:
        return DType(text)
    except ValueError:
        names = ", ".join(KSERVE_NAMES.values())
        raise bad_request(f"unknown datatype '{text}' (use one of {names}, or "
                          f"{', '.join(d.value for d in DType)})", loc) from None


def kserve_name(dt: DType) -> str:
    return KSERVE_NAMES[dt]


def dtype_of(a) -> DType:
    return from_numpy(a.dtype)


def check_shape(shape, loc: tuple, max_rank: int | None = None) -> tuple[int, ...]:
    from .errors import too_large

    if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) and not isinstance(d, bool)
                                                       for d in shape):
        raise bad_request("shape must be a list of integers", loc)
    if any(d < 0 for d in shape):
        raise bad_request(f"shape {list(shape)} has a negative size", loc)
    if max_rank is not None and len(shape) > max_rank:
        raise too_large(f"rank {len(shape)} exceeds the limit of {max_rank}", loc)
    return tuple(shape)


def nbytes_of(shape: tuple[int, ...], dt: DType) -> int:
    return math.prod(shape) * dt.itemsize


MAX_SIZE_DIGITS = 19  # a size in ?shape= (int64 has 19 digits)
MAX_SIZE = 2 ** 63 - 1  # the largest size a query parameter may give (int64's)


def size_from_digits(digits: str, label: str, loc) -> int:
    """A size written in decimal digits, at most MAX_SIZE; beyond, a 400 that shows it after
    `label` (Python's int() refuses more than 4,300 digits with a ValueError of its own)."""
    if len(digits.lstrip("0")) > MAX_SIZE_DIGITS or int(digits) > MAX_SIZE:
        shown = digits if len(digits) <= 40 else f"{digits[:20]}...({len(digits)} digits)"
        raise bad_request(f"{label}{shown} is over the largest size, {MAX_SIZE}", loc)
    return int(digits)


def parse_shape_param(text: str, loc: tuple) -> tuple[int, ...]:
    """'2,3' or '[2,3]' -> (2, 3); '' or '[]' -> () (a scalar)."""
    t = text.strip().strip("[]()").strip()
    if not t:
        return ()
    parts = [p.strip() for p in t.split(",") if p.strip() != ""]
    if any(len(p.lstrip("+-")) > MAX_SIZE_DIGITS for p in parts):
        raise bad_request(f"shape '{text[:60]}...' has a size of more than {MAX_SIZE_DIGITS} digits", loc)
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        raise bad_request(f"shape '{text}' must be comma-separated integers, e.g. 4096,8", loc) from None


def _shown(v: int) -> str:
    text = str(v)
    return text if len(text) <= 40 else f"{text[:20]}...({len(text)} digits)"


def _first_unfit(values: np.ndarray, dt: DType) -> int | None:
    """The first integer of `values` (an object array: JSON integers are unbounded) that `dt`
    cannot hold, or None."""
    if dt.is_float:
        for v in values.reshape(-1):
            if isinstance(v, int) and not isinstance(v, bool):
                try:
                    float(v)
                except OverflowError:
                    return v
        return None
    lo, hi = int(np.iinfo(dt.np).min), int(np.iinfo(dt.np).max)
    for v in values.reshape(-1):
        if isinstance(v, int) and not isinstance(v, bool) and not lo <= v <= hi:
            return v
    return None


def _out_of_range(v: int, dt: DType, loc: tuple):
    what = kserve_name(dt)
    if not dt.is_float:
        info = np.iinfo(dt.np)
        what += f" ({int(info.min)} to {int(info.max)})"
    return bad_request(f"data value {_shown(v)} is out of range for {what}", loc)


class Decoded:
    """Inline `data` the JSON codec process decoded already (server/request_bodies.py): the array (of
    the input's datatype and shape) or the error decoding it raised. `from_json_data` returns the
    one or raises the other, where it would have decoded the list."""

    __slots__ = ("array", "error")

    def __init__(self, array: np.ndarray | None = None, error: Exception | None = None):
        self.array, self.error = array, error


def from_json_data(data, dt: DType, shape: tuple[int, ...], loc: tuple) -> np.ndarray:
    """A KServe JSON `data` (flat or nested, row-major) as an array of `shape`. An integer that
    `dt` cannot hold is a 400 naming it, never a wrapped value."""
    if isinstance(data, Decoded):
        if data.error is not None:
            raise data.error
        return data.array
    n = math.prod(shape)
    try:
        flat = np.asarray(data)
        if dt.is_float and flat.dtype.kind in "UOS":  # strings among the numbers: "NaN" and the like
            flat = _with_special_floats(data, loc)
    except OverflowError:  # an integer too large for a float64
        flat = np.asarray(data, dtype=object)
    except (ValueError, TypeError) as e:
        raise bad_request(f"data is not a (nested) list of numbers: {e}", loc) from None
    # NumPy holds integers past int64 as uint64 (to 2^64-1), as float64 (mixed with negatives) or
    # as Python ints (object): find the one that does not fit, before any cast can wrap it
    if not dt.is_bool and flat.size and (flat.dtype == object or (not dt.is_float and flat.dtype.kind in "uf")):
        bad = _first_unfit(flat if flat.dtype == object else np.asarray(data, dtype=object), dt)
        if bad is not None:
            raise _out_of_range(bad, dt, loc)
        if flat.dtype == object and dt.is_float:
            try:
                flat = flat.astype(np.float64)
            except (ValueError, TypeError):
                pass  # None or another non-number: refused below
    if flat.dtype == object:
        raise bad_request("data is not a rectangular (nested) list of numbers", loc)
    if flat.size != n:
        raise bad_request(f"data has {flat.size} elements but shape {list(shape)} needs {n}", loc)
    if flat.size and flat.dtype.kind not in "biuf":
        raise bad_request(f"data holds {flat.dtype.kind!r} values, not numbers", loc)
    if dt.is_bool and flat.size and flat.dtype.kind != "b":
        raise bad_request("BOOL data must be true/false", loc)
    if not dt.is_float and flat.size and flat.dtype.kind == "f":
        raise bad_request(f"{kserve_name(dt)} data holds non-integer numbers", loc)
    if not dt.is_float and not dt.is_bool and flat.size and flat.dtype.kind in "iu":
        info = np.iinfo(dt.np)
        low, high = int(flat.min()), int(flat.max())
        if low < info.min or high > info.max:
            raise _out_of_range(low if low < info.min else high, dt, loc)
    try:
        with np.errstate(over="raise", invalid="raise"):
            out = flat.astype(dt.np, copy=False) if flat.size else np.zeros(n, dt.np)
    except (OverflowError, FloatingPointError, ValueError) as e:
        raise bad_request(f"data does not fit {kserve_name(dt)}: {e}", loc) from None
    return out.reshape(shape)


def _with_special_floats(data, loc: tuple) -> np.ndarray:
    """Float data with "NaN", "Infinity", "-Infinity" strings (jsonio.SPECIAL_FLOATS) among the numbers."""
    obj = np.asarray(data, dtype=object)
    if obj.size and isinstance(obj.reshape(-1)[0], list):  # ragged: NumPy kept the inner lists
        raise bad_request("data is not a rectangular (nested) list of numbers", loc)

    def number(v):
        if isinstance(v, str):
            if v not in SPECIAL_FLOATS:
                raise bad_request(f"data holds the string {v[:40]!r}; of strings only "
                                  f"{', '.join(map(repr, SPECIAL_FLOATS))} stand for numbers", loc)
            return SPECIAL_FLOATS[v]
        return v

    mapped = np.frompyfunc(number, 1, 1)(obj) if obj.size else obj
    try:
        return np.asarray(mapped, dtype=np.float64)
    except (ValueError, TypeError) as e:
        raise bad_request(f"data is not a (nested) list of numbers: {e}", loc) from None


def to_json_data(a: np.ndarray) -> list:
    """Flat row-major list (KServe's flattened form); NaN and infinities as jsonio.SPECIAL_FLOATS."""
    out = json_array(a)
    return out if isinstance(out, list) else out.tolist()


def from_raw(raw: bytes | memoryview, dt: DType, shape: tuple[int, ...], loc: tuple) -> np.ndarray:
    need = nbytes_of(shape, dt)
    if len(raw) != need:
        raise bad_request(f"{len(raw)} bytes given but {kserve_name(dt)}{list(shape)} needs {need}", loc)
    a = np.frombuffer(raw, dtype=dt.np.newbyteorder("<") if dt.itemsize > 1 else dt.np)
    return a.reshape(shape)


def raw_view(a: np.ndarray) -> np.ndarray:
    """`a` as contiguous little-endian memory (no copy when it already is)."""
    a = c_order(a)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    return a


def to_raw(a: np.ndarray) -> bytes:
    return raw_view(a).tobytes()


def from_npy(raw: bytes, loc: tuple) -> np.ndarray:
    try:
        a = np.load(io.BytesIO(raw), allow_pickle=False)
    except Exception as e:  # np.load raises several types for a bad file
        raise bad_request(f"not a valid .npy file: {e}", loc) from None
    if not isinstance(a, np.ndarray):
        raise bad_request("an .npz archive was sent; send a single .npy array", loc)
    if a.dtype.byteorder == ">":  # big-endian: the same values in native order
        a = a.astype(a.dtype.newbyteorder("="))
    try:
        from_numpy(a.dtype)
    except ValueError as e:
        hint = ("; bfloat16 has no .npy description: send raw bytes with ?dtype=bfloat16"
                if a.dtype.kind == "V" and a.dtype.itemsize == 2 else "")
        raise bad_request(f"{e}{hint}", loc) from None
    return a


def c_order(a: np.ndarray) -> np.ndarray:
    """`a` in C order, copied only when it is not already; a 0-d array stays 0-d (not
    np.ascontiguousarray, which makes every 0-d array 1-d)."""
    return np.require(a, requirements="C")


def to_npy(a: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, c_order(a), allow_pickle=False)
    return buf.getvalue()
