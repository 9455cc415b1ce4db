"""The conformance cases of the KServe v2 gRPC protocol (`inference.GRPCInferenceService`): the same
tritonclient.grpc calls, unchanged, against Triton's and segfuse's gRPC ports (tests/test_triton_conformance.py).
A case observes the gRPC status code of a refusal (`InferenceServerException.status()`), the shape of a response
message (the fields set and their types, through protobuf's JSON mapping: never values such as names or timings) and
results checked against NumPy."""

from __future__ import annotations

import contextlib
import queue
import uuid

import grpc
import numpy as np
import tritonclient.grpc as grpcclient
import tritonclient.utils.shared_memory as shm
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from helpers.conformance import shape
from helpers.triton_pair import EXPERTS, TOPK, Target
from helpers.triton_probe import TIMEOUT, Observation, case_list, counts_of, ids_of

CASES, _case = case_list()


def case(id: str):
    """A gRPC case: its id starts with "gRPC: " (its row in the table of differences too)."""
    return _case(f"gRPC: {id}", "grpc")


# ---- tools --------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def client(t: Target):
    c = grpcclient.InferenceServerClient(t.grpc_address)
    try:
        yield c
    finally:
        c.close()


def code(fn, *args, **kwargs) -> str:
    """What the call did: "OK", or the gRPC status code it raised (NOT_FOUND, INVALID_ARGUMENT...)."""
    try:
        fn(*args, client_timeout=TIMEOUT, **kwargs)
    except InferenceServerException as e:
        return str(e.status()).removeprefix("StatusCode.")
    return "OK"


def message(msg) -> frozenset[str]:
    """The fields a response message sets, with their JSON types (int64 shows as str, as protobuf maps it)."""
    return shape(json_format.MessageToDict(msg, preserving_proto_field_name=True))


def regions(status) -> frozenset[str]:
    """The shape of a shared-memory status: its regions as a list (the map's keys are the region names)."""
    return shape([json_format.MessageToDict(r, preserving_proto_field_name=True) for r in status.regions.values()])


def ids_input(ids: np.ndarray, datatype: str = "INT64") -> grpcclient.InferInput:
    i = grpcclient.InferInput("topk_ids", list(ids.shape), datatype)
    i.set_data_from_numpy(ids)
    return i


def infer_code(t: Target, inputs, **kw) -> str:
    """ModelInfer with `inputs` (the ids of ids_of(5), in whatever datatype or shape): "OK", its counts asserted
    equal to NumPy's, or the status code."""
    with client(t) as c:
        try:
            r = c.infer(t.model, inputs, client_timeout=TIMEOUT, **kw)
        except InferenceServerException as e:
            return str(e.status()).removeprefix("StatusCode.")
    np.testing.assert_array_equal(r.as_numpy("counts"), counts_of(ids_of(5)), err_msg=f"{t.kind}: counts")
    return "OK"


def stub_infer(t: Target, request: pb.ModelInferRequest) -> tuple[str, pb.ModelInferResponse | None]:
    """ModelInfer through grpc's own stub, for what tritonclient cannot express: (status code, response)."""
    with grpc.insecure_channel(t.grpc_address) as channel:
        try:
            return "OK", pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=TIMEOUT)
        except grpc.RpcError as e:
            return e.code().name, None


def ids_request(t: Target, ids: np.ndarray, typed: bool) -> pb.ModelInferRequest:
    tensor = pb.ModelInferRequest.InferInputTensor(name="topk_ids", datatype="INT64", shape=list(ids.shape))
    request = pb.ModelInferRequest(model_name=t.model, inputs=[tensor])
    if typed:
        request.inputs[0].contents.int64_contents.extend(ids.reshape(-1).tolist())
    else:
        request.raw_input_contents.append(ids.tobytes())
    return request


def stats(t: Target) -> dict:
    """The model's statistics, zero counts included (their shape does not depend on what ran before)."""
    with client(t) as c:
        response = c.get_inference_statistics(t.model, client_timeout=TIMEOUT)
    return json_format.MessageToDict(response.model_stats[0], preserving_proto_field_name=True,
                                     always_print_fields_with_no_presence=True)


# ---- health and metadata ------------------------------------------------------------------------------------
@case("ServerLive, ServerReady")
def _(t):
    with client(t) as c:
        return {"live": c.is_server_live(), "ready": c.is_server_ready()}


@case("ModelReady: no version, version 1, version 2, unknown model")
def _(t):
    with client(t) as c:
        return {"ready": (c.is_model_ready(t.model), c.is_model_ready(t.model, "1"), c.is_model_ready(t.model, "2"),
                          c.is_model_ready("nope"))}


@case("ServerMetadata")
def _(t):
    with client(t) as c:
        meta = c.get_server_metadata()
    return {"message": message(meta), "extensions": frozenset(meta.extensions)}


@case("ModelMetadata")
def _(t):
    with client(t) as c:
        meta, versioned = c.get_model_metadata(t.model), c.get_model_metadata(t.model, "1")
    assert meta == versioned, (meta, versioned)
    return {"message": message(meta), "inputs": tuple((x.name, x.datatype, len(x.shape)) for x in meta.inputs),
            "outputs": tuple((x.name, x.datatype, len(x.shape)) for x in meta.outputs)}


@case("ModelMetadata, ModelConfig, ModelInfer: unknown model")
def _(t):
    with client(t) as c:
        return {"metadata": code(c.get_model_metadata, "nope"), "config": code(c.get_model_config, "nope"),
                "infer": code(c.infer, "nope", [ids_input(ids_of())])}


@case("ModelMetadata, ModelConfig, ModelStatistics: version 1, unknown version 3")
def _(t):
    with client(t) as c:
        return {"config": (code(c.get_model_config, t.model, "1"), code(c.get_model_config, t.model, "3")),
                "statistics": (code(c.get_inference_statistics, t.model, "1"),
                               code(c.get_inference_statistics, t.model, "3")),
                "metadata": code(c.get_model_metadata, t.model, "3")}


@case("ModelConfig")
def _(t):
    with client(t) as c:
        cfg = c.get_model_config(t.model).config
    fields = json_format.MessageToDict(cfg, preserving_proto_field_name=True)

    def io(entries):
        return tuple((x.name, model_config_pb2.DataType.Name(x.data_type), len(x.dims)) for x in entries)

    return {"max_batch_size": cfg.max_batch_size, "input": io(cfg.input), "output": io(cfg.output),
            "fields a client reads": frozenset(f for f in ("name", "platform", "backend", "max_batch_size", "input",
                                                           "output", "version_policy") if f in fields)}


# ---- infer ----------------------------------------------------------------------------------------------------
@case("ModelInfer: raw binary tensors")
def _(t):
    ids = ids_of(1)
    with client(t) as c:
        r = c.infer(t.model, [ids_input(ids)], outputs=[grpcclient.InferRequestedOutput("counts")],
                    request_id="r-7", client_timeout=TIMEOUT)
    np.testing.assert_array_equal(r.as_numpy("counts"), counts_of(ids), err_msg=f"{t.kind}: counts")
    response = r.get_response()
    return {"counts": "NumPy's", "id": response.id,
            "message": message(pb_without_parameters(response)),
            "raw_output_contents": len(response.raw_output_contents)}


def pb_without_parameters(response):
    """The response without its `parameters` (the HTTP case "infer: response parameters" compares those)."""
    copy = type(response)()
    copy.CopyFrom(response)
    copy.ClearField("parameters")
    copy.ClearField("raw_output_contents")  # (bytes: compared by count and by value)
    return copy


@case("ModelInfer: response parameters")
def _(t):
    with client(t) as c:
        r = c.infer(t.model, [ids_input(ids_of())], client_timeout=TIMEOUT)
    parameters = r.get_response(as_json=True).get("parameters")
    return {"parameters": shape(parameters) if parameters else "none"}


@case("ModelInfer: gzip and deflate compression")
def _(t):
    return {algorithm: infer_code(t, [ids_input(ids_of(5))], compression_algorithm=algorithm)
            for algorithm in ("gzip", "deflate")}


@case("ModelInfer: typed contents (int64_contents), through grpc's stub")
def _(t):
    ids = ids_of(8)
    status, response = stub_infer(t, ids_request(t, ids, typed=True))
    if response is not None:
        got = np.frombuffer(response.raw_output_contents[0], np.int64) if response.raw_output_contents else \
            np.array(response.outputs[0].contents.int64_contents)
        np.testing.assert_array_equal(got, counts_of(ids), err_msg=f"{t.kind}: counts")
        return {"call": status, "message": message(pb_without_parameters(response)),
                "raw_output_contents": len(response.raw_output_contents)}
    return {"call": status}


@case("ModelInfer: a raw input content no input reads, through grpc's stub")
def _(t):
    request = ids_request(t, ids_of(8), typed=False)
    request.raw_input_contents.append(b"\0" * 16)
    return {"call": stub_infer(t, request)[0]}


@case("ModelInfer: no requested outputs")
def _(t):
    return {"call": infer_code(t, [ids_input(ids_of(5))])}


@case("ModelInfer: wrong datatype")
def _(t):
    return {"call": infer_code(t, [ids_input(ids_of(5).astype(np.int32), "INT32")])}


@case("ModelInfer: wrong shape")
def _(t):
    return {"call": infer_code(t, [ids_input(ids_of(5).reshape(-1))])}


@case("ModelInfer: missing input")
def _(t):
    return {"call": infer_code(t, [])}


@case("ModelInfer: unknown output name")
def _(t):
    return {"call": infer_code(t, [ids_input(ids_of(5))], outputs=[grpcclient.InferRequestedOutput("nope")])}


@case("ModelInfer: unknown version")
def _(t):
    return {"call": infer_code(t, [ids_input(ids_of(5))], model_version="3")}


@case("ModelInfer: priority, custom parameters, sequence_id")
def _(t):
    ids = [ids_input(ids_of(5))]
    return {"priority": infer_code(t, ids, priority=1),
            "parameters": infer_code(t, ids, parameters={"my_setting": "x", "my_flag": True}),
            "sequence_id": infer_code(t, ids, sequence_id=7, sequence_start=True, sequence_end=True)}


@case("ModelStreamInfer: a good and a bad request")
def _(t):
    answers: queue.Queue = queue.Queue()
    ids = ids_of(5)
    with client(t) as c:
        c.start_stream(lambda result, error: answers.put((result, error)))
        try:
            c.async_stream_infer(t.model, [ids_input(ids)], request_id="good")
            c.async_stream_infer(t.model, [ids_input(ids.astype(np.int32), "INT32")], request_id="bad")
            got = [answers.get(timeout=TIMEOUT) for _ in range(2)]
        finally:
            c.stop_stream()
    seen = []
    for result, error in got:
        if error is not None:
            seen.append(f"error, status {error.status()}")
        else:
            np.testing.assert_array_equal(result.as_numpy("counts"), counts_of(ids), err_msg=f"{t.kind}: counts")
            seen.append(f"result {result.get_response().id}")
    return {"answers": tuple(sorted(seen))}


# ---- statistics -----------------------------------------------------------------------------------------------
@case("ModelStatistics after good and rejected requests")
def _(t):
    before = stats(t)
    bad = [ids_input(ids_of(5).astype(np.int32), "INT32")]
    rejected = {infer_code(t, bad) for _ in range(3)}
    ran = infer_code(t, [ids_input(ids_of(5))])
    after = stats(t)

    def delta(*path):
        a, b = after, before
        for p in path:
            a, b = a.get(p, {}), b.get(p, {})
        return int(a or 0) - int(b or 0)

    return {"rejected": tuple(sorted(rejected)), "ran": ran, "message": shape(after),
            "success count": delta("inference_stats", "success", "count"),
            "fail count": delta("inference_stats", "fail", "count"), "inference_count": delta("inference_count"),
            "execution_count": delta("execution_count")}


@case("ModelStatistics after a model error (an id out of range)")
def _(t):
    before = stats(t)
    ids = np.full((2, TOPK), EXPERTS, np.int64)
    refused = infer_code(t, [ids_input(ids)])
    after = stats(t)
    return {"infer": refused, **{f"{k} count": int(after["inference_stats"][k]["count"])
                                 - int(before["inference_stats"][k]["count"]) for k in ("success", "fail")}}


@case("ModelStatistics: every model, unknown model")
def _(t):
    with client(t) as c:
        every = c.get_inference_statistics(client_timeout=TIMEOUT)
        return {"models": len(every.model_stats), "unknown": code(c.get_inference_statistics, "nope")}


# ---- model repository ---------------------------------------------------------------------------------------
@case("RepositoryIndex")
def _(t):
    with client(t) as c:
        index = c.get_model_repository_index()
    return {"message": message(index), "models": tuple((m.name == t.model, m.state) for m in index.models)}


@case("RepositoryModelUnload, then RepositoryModelLoad")
def _(t):
    ids = ids_of(6)
    with client(t) as c:
        steps = {"unload": code(c.unload_model, t.model)}
        steps["load"] = code(c.load_model, t.model)
        steps["ready after load"] = c.is_model_ready(t.model)
        r = c.infer(t.model, [ids_input(ids)], client_timeout=TIMEOUT)
    np.testing.assert_array_equal(r.as_numpy("counts"), counts_of(ids))
    return steps


@case("RepositoryModelUnload, RepositoryModelLoad: unknown model")
def _(t):
    with client(t) as c:
        return {"unload": code(c.unload_model, "nope"), "load": code(c.load_model, "nope")}


# ---- shared memory ------------------------------------------------------------------------------------------
@case("SystemSharedMemory: register, status, infer, unregister")
def _(t):
    ids = ids_of(7)
    tag = uuid.uuid4().hex[:10]
    ins, outs = f"gin_{tag}", f"gout_{tag}"
    in_region = shm.create_shared_memory_region(ins, f"/sf_{ins}", ids.nbytes)
    out_region = shm.create_shared_memory_region(outs, f"/sf_{outs}", EXPERTS * 8)
    seen: Observation = {}
    try:
        shm.set_shared_memory_region(in_region, [ids])
        with client(t) as c:
            seen["register"] = (code(c.register_system_shared_memory, ins, f"/sf_{ins}", ids.nbytes),
                                code(c.register_system_shared_memory, outs, f"/sf_{outs}", EXPERTS * 8))
            seen["status"] = regions(c.get_system_shared_memory_status(ins))
            i = grpcclient.InferInput("topk_ids", list(ids.shape), "INT64")
            i.set_shared_memory(ins, ids.nbytes)
            o = grpcclient.InferRequestedOutput("counts")
            o.set_shared_memory(outs, EXPERTS * 8)
            r = c.infer(t.model, [i], outputs=[o], client_timeout=TIMEOUT)
            seen["output"] = message(r.get_output("counts"))
            seen["raw contents"] = len(r.get_response().raw_output_contents)
            got = shm.get_contents_as_numpy(out_region, np.int64, [EXPERTS])
            np.testing.assert_array_equal(got, counts_of(ids), err_msg=f"{t.kind}: counts in shared memory")
            seen["counts"] = "NumPy's"
            seen["unregister"] = (code(c.unregister_system_shared_memory, ins),
                                  code(c.unregister_system_shared_memory, outs))
            seen["regions after"] = len(c.get_system_shared_memory_status().regions)
    finally:
        shm.destroy_shared_memory_region(in_region)
        shm.destroy_shared_memory_region(out_region)
    return seen


@case("SystemSharedMemory: register a key that does not exist or none, unregister and status of an unknown name")
def _(t):
    with client(t) as c:
        return {"register": code(c.register_system_shared_memory, "gnokey", f"/sf_{uuid.uuid4().hex[:12]}", 64),
                "register without a key": code(c.register_system_shared_memory, "gnokey", "", 64),
                "unregister": code(c.unregister_system_shared_memory, "nope"),
                "status": code(c.get_system_shared_memory_status, "nope")}


@case("CudaSharedMemoryStatus")
def _(t):
    with client(t) as c:
        try:
            return {"status": message(c.get_cuda_shared_memory_status(client_timeout=TIMEOUT))}
        except InferenceServerException as e:
            return {"status": str(e.status()).removeprefix("StatusCode.")}


# ---- trace and log settings ---------------------------------------------------------------------------------
@case("TraceSetting")
def _(t):
    with client(t) as c:
        return {"server": message(c.get_trace_settings()), "model": message(c.get_trace_settings(t.model)),
                "update": code(c.update_trace_settings, settings={"trace_level": ["OFF"]}),
                "unknown model": code(c.get_trace_settings, "nope"),
                "unknown key": code(c.update_trace_settings, settings={"nope": "1"})}


@case("LogSettings")
def _(t):
    with client(t) as c:
        before = c.get_log_settings()
        level = before.settings["log_verbose_level"].uint32_param
        return {"message": message(before),
                "update": code(c.update_log_settings, {"log_verbose_level": level}),
                "unknown key": code(c.update_log_settings, {"nope": True})}
