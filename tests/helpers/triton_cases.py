"""The conformance cases of health, metadata, configuration and infer, accepted and rejected requests: the same
tritonclient.http calls, and raw requests for what the client cannot express, run against Triton and segfuse alike
(tests/test_triton_conformance.py; tools in helpers/triton_probe.py)."""

from __future__ import annotations

import gzip
import json

import numpy as np

from helpers.conformance import body_shape, shape
from helpers.triton_pair import EXPERTS, TOPK
from helpers.triton_probe import (
    answer,
    case_list,
    checked_infer,
    client,
    client_infer,
    counts_of,
    ids_input,
    ids_of,
    infer_body,
    infer_raw,
    protocol_shape,
    raw,
    rejection,
    system_region,
    tensors,
)

CASES, case = case_list()


# ---- health and metadata ------------------------------------------------------------------------------------
@case("health (client)")
def _(t):
    with client(t) as c:
        return {"live": c.is_server_live(), "ready": c.is_server_ready()}


@case("GET /v2/health/live")
def _(t):
    return answer(raw(t, "GET", "/v2/health/live"))


@case("GET /v2/health/ready")
def _(t):
    return answer(raw(t, "GET", "/v2/health/ready"))


@case("server metadata")
def _(t):
    with client(t) as c:
        meta = c.get_server_metadata()
    return {"body": shape(meta), "extensions": frozenset(meta["extensions"])}


@case("model metadata")
def _(t):
    with client(t) as c:
        meta, versioned = c.get_model_metadata(t.model), c.get_model_metadata(t.model, "1")
    assert meta == versioned, (meta, versioned)
    return {"body": shape(meta), "inputs": tensors(meta["inputs"]), "outputs": tensors(meta["outputs"]),
            "versions": tuple(meta["versions"])}


@case("model ready: no version, version 1, version 2")
def _(t):
    with client(t) as c:
        return {"ready": (c.is_model_ready(t.model), c.is_model_ready(t.model, "1"), c.is_model_ready(t.model, "2"))}


@case("model config")
def _(t):
    with client(t) as c:
        cfg = c.get_model_config(t.model)

    def io(entries):
        return tuple((x["name"], x["data_type"], len(x["dims"])) for x in entries)

    return {"name": type(cfg["name"]).__name__, "max_batch_size": cfg.get("max_batch_size"),
            "input": io(cfg["input"]), "output": io(cfg["output"]),
            "keys a client reads": frozenset(k for k in ("name", "platform", "backend", "max_batch_size", "input",
                                                         "output", "version_policy") if k in cfg)}


# ---- infer ----------------------------------------------------------------------------------------------------
@case("infer: JSON tensors")
def _(t):
    return checked_infer(t, False, False)


@case("infer: binary tensors")
def _(t):
    return checked_infer(t, True, True)


@case("infer: JSON in, binary out")
def _(t):
    return checked_infer(t, False, True)


@case("infer: gzip request and response")
def _(t):
    return checked_infer(t, True, True, request_compression_algorithm="gzip",
                         response_compression_algorithm="gzip")


@case("infer: deflate request and response")
def _(t):
    return checked_infer(t, False, False, request_compression_algorithm="deflate",
                         response_compression_algorithm="deflate")


@case("infer: response parameters")
def _(t):
    with client(t) as c:
        r = c.infer(t.model, [ids_input(ids_of())])
    parameters = r.get_response().get("parameters")
    return {"parameters": shape(parameters) if parameters else "none"}


@case("infer: version 1 with a request id")
def _(t):
    ids = ids_of(2)
    with client(t) as c:
        r = c.infer(t.model, [ids_input(ids)], model_version="1", request_id="r-7")
    np.testing.assert_array_equal(r.as_numpy("counts"), counts_of(ids))
    return {"id": r.get_response().get("id"), "model_version": r.get_response().get("model_version")}


@case("infer: raw JSON body")
def _(t):
    ids = ids_of(3)
    r = raw(t, "POST", f"/v2/models/{t.model}/infer", json=infer_body(ids))
    np.testing.assert_array_equal(r.json()["outputs"][0]["data"], counts_of(ids))
    return {"status": r.status_code, "body": protocol_shape(r.json())}


@case("infer: raw gzip body")
def _(t):
    ids = ids_of(4)
    r = raw(t, "POST", f"/v2/models/{t.model}/infer", content=gzip.compress(json.dumps(infer_body(ids)).encode()),
            headers={"content-type": "application/json", "content-encoding": "gzip"})
    np.testing.assert_array_equal(r.json()["outputs"][0]["data"], counts_of(ids))
    return {"status": r.status_code, "body": protocol_shape(r.json())}


@case("infer: an id out of range")
def _(t):
    return rejection(raw(t, "POST", f"/v2/models/{t.model}/infer", json=infer_body(np.full((2, TOPK), EXPERTS))))


# ---- what Triton accepts or rejects (the difference table) ---------------------------------------------
@case("infer: wrong datatype")
def _(t):
    body = infer_body(ids_of())
    body["inputs"][0]["datatype"] = "INT32"
    return rejection(infer_raw(t, body))


@case("infer: wrong shape")
def _(t):
    ids = ids_of()
    return rejection(infer_raw(t, {"inputs": [{"name": "topk_ids", "shape": [ids.size], "datatype": "INT64",
                                                 "data": ids.reshape(-1).tolist()}]}))


@case("infer: missing input")
def _(t):
    return rejection(infer_raw(t, {"inputs": []}))


@case("infer: unknown output name")
def _(t):
    return rejection(infer_raw(t, infer_body(ids_of(), outputs=[{"name": "nope"}])))


@case("infer: bad JSON")
def _(t):
    return rejection(infer_raw(t, b'{"inputs": ['))


@case("infer: data not filling the shape")
def _(t):
    body = infer_body(ids_of())
    body["inputs"][0]["data"] = body["inputs"][0]["data"][:-3]
    return rejection(infer_raw(t, body))
@case("infer: shared-memory input without its byte size")
def _(t):
    ids = ids_of()
    with system_region(t, ids.nbytes, ids) as (name, _):
        return rejection(infer_raw(t, {"inputs": [{"name": "topk_ids", "shape": list(ids.shape),
                                                     "datatype": "INT64",
                                                     "parameters": {"shared_memory_region": name}}]}))


@case("infer: shared-memory offset not an integer")
def _(t):
    ids = ids_of()
    with system_region(t, ids.nbytes, ids) as (name, _):
        return rejection(infer_raw(t, {"inputs": [{"name": "topk_ids", "shape": list(ids.shape),
                                                     "datatype": "INT64",
                                                     "parameters": {"shared_memory_region": name,
                                                                    "shared_memory_byte_size": ids.nbytes,
                                                                    "shared_memory_offset": "x"}}]}))


@case("bad JSON: repository index, trace and log settings")
def _(t):
    return {"status": tuple(raw(t, "POST", path, content=b"{bad").status_code
                            for path in ("/v2/repository/index", "/v2/trace/setting", "/v2/logging"))}


@case("error body")
def _(t):
    body = infer_body(ids_of())
    body["inputs"][0]["datatype"] = "INT32"
    return {"body": body_shape(infer_raw(t, body).content)}
@case("infer: priority")
def _(t):
    return client_infer(t, priority=1)


@case("infer: custom request parameters")
def _(t):
    return client_infer(t, parameters={"my_setting": "x", "my_flag": True})


@case("infer: sequence_id on a non-sequence model")
def _(t):
    return client_infer(t, sequence_id=7, sequence_start=True, sequence_end=True)


@case("infer: unknown top-level field")
def _(t):
    return rejection(infer_raw(t, infer_body(ids_of(), my_field=1)))
