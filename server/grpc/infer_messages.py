"""ModelInferRequest -> the HTTP path's `InferRequest` (and a reader of its raw tensors), and the
HTTP path's response body -> ModelInferResponse. Nothing here checks a tensor against a fusion:
server/run_request.py does that for both protocols.

How the gRPC fields map (Triton's grpc_service.proto):
- an input's `contents` (the typed field of its datatype) become `data`; `raw_input_contents[k]`
  goes to the k-th input that has neither contents nor a shared-memory region nor a stored buffer
  (Triton's order), read as a binary tensor of `binary_data_size` bytes; contents with raw inputs
  in the same request are refused, as Triton does, and so are raw inputs nobody reads;
- every `parameters` map entry becomes the value of its oneof (bool, int64, uint64, double, string);
- outputs come back as `raw_output_contents` (one per output, empty for one stored in a buffer or
  a shared-memory region), never as JSON lists: the request asks for binary outputs throughout;
- the response's `parameters` are segfuse's run parameters; a nested one (timings_us) is flattened
  to `timings_us.<stage>`.
"""

from __future__ import annotations

import pydantic
from fastapi.exceptions import RequestValidationError

from ..errors import bad_request
from ..models import InferRequest
from ..tensors import kserve_name, parse_dtype
from .messages import pb

# The typed contents field of each datatype (BF16 and FP16 have none: raw_input_contents only).
CONTENTS_FIELD = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
                  "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
                  "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
                  "FP64": "fp64_contents", "BYTES": "bytes_contents"}
INT64_MAX = 2 ** 63 - 1
HTTP_ONLY_PARAMETERS = frozenset({"binary_data_size", "binary_data_output"})  # the binary extension's framing


def parameter_values(params) -> dict:
    """A protobuf map of InferParameter (or ModelRepositoryParameter) as plain values."""
    out = {}
    for key, p in params.items():
        which = p.WhichOneof("parameter_choice")
        out[key] = getattr(p, which) if which is not None else None
    return out


def set_parameters(target, values: dict, prefix: str = "") -> None:
    """Fill a protobuf map of InferParameter from plain values (a dict value is flattened)."""
    for key, v in values.items():
        name = f"{prefix}{key}"
        if isinstance(v, dict):
            set_parameters(target, v, f"{name}.")
        elif isinstance(v, bool):
            target[name].bool_param = v
        elif isinstance(v, int):
            if v > INT64_MAX:
                target[name].uint64_param = v
            else:
                target[name].int64_param = v
        elif isinstance(v, float):
            target[name].double_param = v
        elif v is not None:
            target[name].string_param = str(v)


class RawInputs:
    """raw_input_contents handed to parse_request in order, as the HTTP path's BinaryReader hands out
    slices of a body's binary tail (each input's binary_data_size is its raw tensor's length)."""

    def __init__(self, raws):
        self.raws, self.pos = raws, 0

    def take(self, size: int, loc) -> bytes:
        raw = self.raws[self.pos]
        self.pos += 1
        return raw

    def finish(self) -> None:
        if self.pos != len(self.raws):
            raise bad_request(f"the request has {len(self.raws)} raw_input_contents but {self.pos} input(s) read "
                              "raw data (one per input without contents, region or buffer, in order)",
                              ["raw_input_contents"])


def _contents(t, loc: tuple) -> list:
    """An input's typed contents as a flat list (the field of its datatype, no other)."""
    given = [field.name for field, _ in t.contents.ListFields()]
    expected = CONTENTS_FIELD.get(kserve_name(parse_dtype(t.datatype, (*loc, "datatype")))) if t.datatype else None
    wrong = [g for g in given if g != expected]
    if wrong:
        want = f"contents.{expected}" if expected else "raw_input_contents (it has no typed contents field)"
        raise bad_request(f"input '{t.name}' of datatype {t.datatype or '(none)'} gives contents.{wrong[0]}; "
                          f"send {want}", (*loc, "contents", wrong[0]))
    return list(getattr(t.contents, expected)) if given else []


def _input(t, loc: tuple, raws, k: int) -> tuple[dict, int]:
    """(an InferInput dict, the raw inputs read so far)."""
    params = {key: v for key, v in parameter_values(t.parameters).items() if key not in HTTP_ONLY_PARAMETERS}
    entry: dict = {"name": t.name}
    if t.datatype:
        entry["datatype"], entry["shape"] = t.datatype, list(t.shape)
    elif t.shape:
        entry["shape"] = list(t.shape)
    if t.HasField("contents"):
        if raws:
            raise bad_request(f"input '{t.name}' gives contents in a request with raw_input_contents; send every "
                              "input's data one way", (*loc, "contents"))
        entry["data"] = _contents(t, loc)
    elif "shared_memory_region" not in params and "buffer" not in params and k < len(raws):
        params["binary_data_size"] = len(raws[k])
        k += 1
    if params:
        entry["parameters"] = params
    return entry, k


def _output(o) -> dict:
    params = {key: v for key, v in parameter_values(o.parameters).items() if key not in HTTP_ONLY_PARAMETERS}
    if params.get("binary_data") is False:  # (HTTP's JSON outputs: here every output is raw)
        del params["binary_data"]
    return {"name": o.name, "parameters": params} if params else {"name": o.name}


def infer_request(msg: pb.ModelInferRequest) -> tuple[InferRequest, RawInputs | None]:
    """The request as the HTTP path's InferRequest and a reader of its raw inputs (None without any).
    The model and version are the caller's (server/routers/infer.py infer_target)."""
    raws = msg.raw_input_contents
    inputs, k = [], 0
    for i, t in enumerate(msg.inputs):
        entry, k = _input(t, ("inputs", i), raws, k)
        inputs.append(entry)
    params = {key: v for key, v in parameter_values(msg.parameters).items() if key not in HTTP_ONLY_PARAMETERS}
    doc = {"inputs": inputs, "parameters": {**params, "binary_data_output": True}}
    if msg.id:
        doc["id"] = msg.id
    if len(msg.outputs):
        doc["outputs"] = [_output(o) for o in msg.outputs]
    try:
        req = InferRequest.model_validate(doc)
    except pydantic.ValidationError as e:  # answered as the HTTP path answers a malformed body
        raise RequestValidationError(e.errors()) from None
    return req, (RawInputs(raws) if len(raws) else None)


def infer_response(body: dict, chunks: list[bytes]) -> pb.ModelInferResponse:
    """The HTTP path's response body and binary outputs (server/run_request.py response) as gRPC's."""
    resp = pb.ModelInferResponse(model_name=body["model_name"], model_version=body.get("model_version", ""),
                                 id=body.get("id") or "")
    chunk = iter(chunks)
    for entry in body["outputs"]:
        params = dict(entry.get("parameters") or {})
        binary = params.pop("binary_data_size", None) is not None
        out = resp.outputs.add(name=entry["name"], datatype=entry["datatype"], shape=entry["shape"])
        set_parameters(out.parameters, params)
        resp.raw_output_contents.append(next(chunk) if binary else b"")
    set_parameters(resp.parameters, body.get("parameters") or {})
    return resp
