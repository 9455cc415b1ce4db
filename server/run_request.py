"""An infer/execute request as a `ParsedRun` (server/run_records.py): its inputs (stored buffers,
inline data, shared-memory regions) and requested outputs checked and located (`parse_request`),
and the response built from a finished run (`response`). Running it is server/runs.py."""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING

from segfuse.compiler import Fusion

from . import region_io
from .binary import BinaryReader
from .errors import bad_request
from .jsonio import json_array
from .models import InferRequest
from .names import check_name
from .run_records import NO_ALIASES, ParsedRun, RunInput, RunOutcome, RunOutput
from .tensors import (
    check_shape,
    from_json_data,
    from_raw,
    kserve_name,
    parse_dtype,
    to_raw,
)

if TYPE_CHECKING:
    from .state import ServerState


def parse_request(state: ServerState, fusion: Fusion, req: InferRequest, tail: BinaryReader | None,
                  deadline: float | None = None) -> ParsedRun:
    """The request checked against `fusion`; `deadline` is parameters.timeout's (protocol.check_request)."""
    inputs, seen = [], {}
    for i, inp in enumerate(req.inputs):
        loc = ("inputs", i)
        if inp.name in seen:
            raise bad_request(f"input '{inp.name}' is given twice (also inputs[{seen[inp.name]}])", (*loc, "name"))
        seen[inp.name] = i
        p = inp.parameters
        dtype = parse_dtype(inp.datatype, (*loc, "datatype")) if inp.datatype is not None else None
        shape = check_shape(inp.shape, (*loc, "shape"), state.settings.max_rank) if inp.shape is not None else None
        buffer = host = None
        region = region_io.input_slice(state, inp, loc, dtype, shape)  # [regions] parameters.shared_memory_*
        if region is not None:
            pass  # [regions] read from the region when the run executes
        elif p is not None and p.buffer is not None:
            if inp.data is not None or p.binary_data_size is not None:
                raise bad_request(f"input '{inp.name}' names a buffer and also carries data; give one",
                                  (*loc, "data"))
            buffer = check_name(p.buffer, (*loc, "parameters", "buffer"))
        else:
            if dtype is None or shape is None:
                raise bad_request(f"inline input '{inp.name}' needs 'datatype' and 'shape' "
                                  "(or parameters.buffer)", loc)
            if p is not None and p.binary_data_size is not None:
                if tail is None:
                    raise bad_request("binary_data_size given but the request has no "
                                      "Inference-Header-Content-Length header", (*loc, "parameters"))
                if inp.data is not None:
                    raise bad_request("give either data or binary_data_size, not both", (*loc, "data"))
                raw = tail.take(p.binary_data_size, (*loc, "parameters", "binary_data_size"))
                host = from_raw(raw, dtype, shape, (*loc, "parameters", "binary_data_size"))
            elif inp.data is not None:
                host = from_json_data(inp.data, dtype, shape, (*loc, "data"))
            else:
                raise bad_request(f"input '{inp.name}' has no data (give data, binary_data_size or "
                                  "parameters.buffer)", loc)
        inputs.append(RunInput(inp.name, loc, buffer, host, dtype, shape, region))
    if tail is not None:
        tail.finish()

    outputs = _outputs(state, fusion, req)
    alias_buffers = _alias_buffers(fusion, inputs)
    outputs = _written_once(outputs, alias_buffers)
    writes = frozenset([*(o.buffer for o in outputs if o.buffer), *alias_buffers.values()])
    reads = frozenset(i.buffer for i in inputs if i.buffer) - writes
    return ParsedRun(fusion, tuple(inputs), outputs, alias_buffers, reads, writes, deadline)


def _alias_buffers(fusion: Fusion, inputs: list[RunInput]):
    """Graph input -> the buffer its in-place update (an output's alias_of) lands in."""
    aliases = None
    given = {i.name: i for i in inputs}
    for o in fusion.outputs:
        if o.alias_of is None:
            continue
        src = given.get(o.alias_of)
        if src is None:
            continue  # bind reports the missing input
        if src.buffer is None:
            raise bad_request(f"input '{o.alias_of}' is updated in place by output '{o.name}' (alias_of), "
                                "so it must be given as a buffer (parameters.buffer), not inline data",
                                src.loc)
        if aliases is None:
            aliases = {}
        aliases[o.alias_of] = src.buffer
    return NO_ALIASES if aliases is None else MappingProxyType(aliases)


def _outputs(state: ServerState, fusion: Fusion, req: InferRequest) -> list[RunOutput]:
    by_name = {o.name: o for o in fusion.outputs}
    request_binary = bool(req.parameters and req.parameters.binary_data_output)
    outputs, seen = [], {}
    requested = req.outputs if req.outputs is not None else [None] * len(fusion.outputs)
    for k, out in enumerate(requested):
        loc = ("outputs", k)
        if out is None:  # no outputs listed: every graph output, inline (KServe)
            outputs.append(RunOutput(fusion.outputs[k].name, loc, binary=request_binary,
                                     alias_of=fusion.outputs[k].alias_of))
            continue
        if out.name not in by_name:
            raise bad_request(f"'{out.name}' is not an output of fusion '{fusion.name}' (its outputs: "
                                f"{', '.join(by_name)})", (*loc, "name"))
        if out.name in seen:
            raise bad_request(f"output '{out.name}' is listed twice (also outputs[{seen[out.name]}])",
                              (*loc, "name"))
        seen[out.name] = k
        p = out.parameters
        alias_of = by_name[out.name].alias_of
        buffer, overwrite, inline, binary = None, False, True, request_binary
        if p is not None:
            binary = p.binary_data if p.binary_data is not None else request_binary
            if p.buffer is not None:
                buffer = check_name(p.buffer, (*loc, "parameters", "buffer"))
                overwrite = p.overwrite
                inline = bool(p.return_data or p.binary_data)
        region = region_io.output_slice(state, out, loc, fusion)  # [regions] parameters.shared_memory_*
        if region is not None:
            inline = binary = False  # an output in shared memory comes back without data
        outputs.append(RunOutput(out.name, loc, buffer, overwrite, inline, binary, alias_of, region))
    return outputs


def _written_once(outputs: list[RunOutput], alias_buffers) -> tuple[RunOutput, ...]:
    """The outputs, each buffer written by one of them or one in-place update (400 otherwise); an
    output stored in the buffer its in-place update lands in already is stored there once."""
    targets: dict[str, str] = {b: f"input '{n}' (updated in place)" for n, b in alias_buffers.items()}
    for k, o in enumerate(outputs):
        if o.buffer is None:
            continue
        if o.alias_of is not None and alias_buffers.get(o.alias_of) == o.buffer:
            outputs[k] = o._replace(buffer=None)  # the in-place update already lands in that buffer
            continue
        if o.buffer in targets:
            raise bad_request(f"buffer '{o.buffer}' is written twice: by output '{o.name}' and by "
                              f"{targets[o.buffer]}", (*o.loc, "parameters", "buffer"))
        targets[o.buffer] = f"output '{o.name}'"
    return tuple(outputs)


def response(model_name: str, req_id: str | None, parsed: ParsedRun, outcome: RunOutcome):
    """(InferResponse dict, binary chunks for outputs that asked for binary data)."""
    outs, chunks = [], []
    types = parsed.fusion.types
    for o in parsed.outputs:
        entry: dict = {"name": o.name}
        p: dict = {}
        if o.buffer is not None:
            p["buffer"] = o.buffer
        elif o.alias_of is not None and o.alias_of in parsed.alias_buffers:
            p["buffer"] = parsed.alias_buffers[o.alias_of]
        entry["shape"] = outcome.shapes[o.name]
        entry["datatype"] = kserve_name(types[o.name].dtype)
        if o.region is not None:  # [regions] written to shared memory, no data
            p.update(region_io.response_params(o.region, entry["shape"], types[o.name].dtype))
        if o.name in outcome.host:
            a = outcome.host[o.name]
            if o.binary:
                raw = to_raw(a)
                p["binary_data_size"] = len(raw)
                chunks.append(raw)
            else:
                entry["data"] = json_array(a)
        if p:
            entry["parameters"] = p
        outs.append(entry)
    body = {"model_name": model_name, "outputs": outs, "parameters": outcome.params}
    if req_id is not None:
        body["id"] = req_id
    return body, chunks

