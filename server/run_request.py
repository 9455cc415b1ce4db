"""An infer/execute request as a run plan: its inputs (stored buffers, inline data, shared-memory
regions) and requested outputs checked and located (`parse_request`), and the response built from
a finished run (`response`). Running the plan is server/runs.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from segfuse.compiler import Fusion
from segfuse.compiler.dtypes import DType

from . import region_io
from .binary import BinaryReader
from .errors import bad_request, unprocessable
from .jsonio import json_array
from .models import InferRequest
from .names import check_name
from .tensors import (
    check_shape,
    from_json_data,
    from_raw,
    kserve_name,
    parse_dtype,
    to_raw,
)

if TYPE_CHECKING:
    from .runs import RunOutcome
    from .runtime import Runtime


@dataclass
class InputSpec:
    name: str
    loc: list
    buffer: str | None = None
    host: np.ndarray | None = None  # decoded inline data
    dtype: DType | None = None  # declared (buffers) or decoded (inline)
    shape: tuple | None = None
    region: region_io.RegionSlice | None = None  # [regions] read from shared memory (server/region_io.py)


@dataclass
class OutputSpec:
    name: str
    loc: list
    buffer: str | None = None
    overwrite: bool = False
    inline: bool = True
    binary: bool = False
    alias_of: str | None = None  # graph input this output updates in place
    region: region_io.RegionSlice | None = None  # [regions] written to shared memory (server/region_io.py)


@dataclass
class RunPlan:
    fusion: Fusion
    inputs: list[InputSpec]
    outputs: list[OutputSpec]  # the outputs the response mentions
    alias_buffers: dict[str, str] = field(default_factory=dict)  # graph input -> buffer updated in place
    deadline: float | None = None  # parameters.timeout: perf_counter time by which the run must start

    @property
    def reads(self) -> set[str]:
        return {i.buffer for i in self.inputs if i.buffer}

    @property
    def writes(self) -> set[str]:
        return {o.buffer for o in self.outputs if o.buffer} | set(self.alias_buffers.values())


def parse_request(rt: Runtime, fusion: Fusion, req: InferRequest, tail: BinaryReader | None) -> RunPlan:
    inputs, seen = [], {}
    for i, inp in enumerate(req.inputs):
        loc = ["inputs", i]
        if inp.name in seen:
            raise bad_request(f"input '{inp.name}' is given twice (also inputs[{seen[inp.name]}])", loc + ["name"])
        seen[inp.name] = i
        p = inp.parameters
        spec = InputSpec(inp.name, loc)
        if inp.datatype is not None:
            spec.dtype = parse_dtype(inp.datatype, loc + ["datatype"])
        if inp.shape is not None:
            spec.shape = check_shape(inp.shape, loc + ["shape"], rt.settings.max_rank)
        spec.region = region_io.input_slice(rt, inp, spec)  # [regions] parameters.shared_memory_*
        if spec.region is not None:
            pass  # [regions] read from the region when the run executes
        elif p is not None and p.buffer is not None:
            if inp.data is not None or p.binary_data_size is not None:
                raise bad_request(f"input '{inp.name}' names a buffer and also carries data; give one",
                                  loc + ["data"])
            spec.buffer = check_name(p.buffer, loc + ["parameters", "buffer"])
        else:
            if spec.dtype is None or spec.shape is None:
                raise bad_request(f"inline input '{inp.name}' needs 'datatype' and 'shape' "
                                  "(or parameters.buffer)", loc)
            if p is not None and p.binary_data_size is not None:
                if tail is None:
                    raise bad_request("binary_data_size given but the request has no "
                                      "Inference-Header-Content-Length header", loc + ["parameters"])
                if inp.data is not None:
                    raise bad_request("give either data or binary_data_size, not both", loc + ["data"])
                raw = tail.take(p.binary_data_size, loc + ["parameters", "binary_data_size"])
                spec.host = from_raw(raw, spec.dtype, spec.shape, loc + ["parameters", "binary_data_size"])
            elif inp.data is not None:
                spec.host = from_json_data(inp.data, spec.dtype, spec.shape, loc + ["data"])
            else:
                raise bad_request(f"input '{inp.name}' has no data (give data, binary_data_size or "
                                  "parameters.buffer)", loc)
        inputs.append(spec)
    if tail is not None:
        tail.finish()

    by_name = {o.name: o for o in fusion.outputs}
    request_binary = bool(req.parameters and req.parameters.binary_data_output)
    outputs, seen = [], {}
    requested = req.outputs if req.outputs is not None else [None] * len(fusion.outputs)
    for k, out in enumerate(requested):
        loc = ["outputs", k]
        if out is None:  # no outputs listed: every graph output, inline (KServe)
            outputs.append(OutputSpec(fusion.outputs[k].name, loc, binary=request_binary,
                                      alias_of=fusion.outputs[k].alias_of))
            continue
        if out.name not in by_name:
            raise unprocessable(f"'{out.name}' is not an output of fusion '{fusion.name}' (its outputs: "
                                f"{', '.join(by_name)})", loc + ["name"])
        if out.name in seen:
            raise bad_request(f"output '{out.name}' is listed twice (also outputs[{seen[out.name]}])",
                              loc + ["name"])
        seen[out.name] = k
        p = out.parameters
        spec = OutputSpec(out.name, loc, alias_of=by_name[out.name].alias_of)
        if p is not None:
            spec.binary = p.binary_data if p.binary_data is not None else request_binary
            if p.buffer is not None:
                spec.buffer = check_name(p.buffer, loc + ["parameters", "buffer"])
                spec.overwrite = p.overwrite
                spec.inline = bool(p.return_data or p.binary_data)
        else:
            spec.binary = request_binary
        spec.region = region_io.output_slice(rt, out, spec, fusion)  # [regions] parameters.shared_memory_*
        outputs.append(spec)

    plan = RunPlan(fusion, inputs, outputs)
    given = {i.name: i for i in inputs}
    for o in fusion.outputs:
        if o.alias_of is None:
            continue
        src = given.get(o.alias_of)
        if src is None:
            continue  # bind reports the missing input
        if src.buffer is None:
            raise unprocessable(f"input '{o.alias_of}' is updated in place by output '{o.name}' (alias_of), "
                                "so it must be given as a buffer (parameters.buffer), not inline data",
                                src.loc)
        plan.alias_buffers[o.alias_of] = src.buffer
    targets: dict[str, str] = {b: f"input '{n}' (updated in place)" for n, b in plan.alias_buffers.items()}
    for o in outputs:
        if o.buffer is None:
            continue
        if o.alias_of is not None and plan.alias_buffers.get(o.alias_of) == o.buffer:
            o.buffer = None  # the in-place update already lands in that buffer
            continue
        if o.buffer in targets:
            raise bad_request(f"buffer '{o.buffer}' is written twice: by output '{o.name}' and by "
                              f"{targets[o.buffer]}", o.loc + ["parameters", "buffer"])
        targets[o.buffer] = f"output '{o.name}'"
    return plan



def response(model_name: str, req_id: str | None, plan: RunPlan, outcome: RunOutcome):
    """(InferResponse dict, binary chunks for outputs that asked for binary data)."""
    outs, chunks = [], []
    types = plan.fusion.types
    for o in plan.outputs:
        entry: dict = {"name": o.name}
        p: dict = {}
        if o.buffer is not None:
            p["buffer"] = o.buffer
        elif o.alias_of is not None and o.alias_of in plan.alias_buffers:
            p["buffer"] = plan.alias_buffers[o.alias_of]
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

