"""KServe v2 inference: POST /v2/models/{name or id}/infer, model metadata, and /v2/execute."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from segfuse.compiler.errors import GraphError, Issue

from ..binary import CONTENT_TYPE, HEADER, decode_request, join_body
from ..deps import AnyState, ReadyState, errors
from ..fusions import tensor_meta
from ..jsonio import dumps
from ..models import ExecuteRequest, InferRequest, InferResponse, ModelMetadata, ModelReady
from ..parsed_requests import ParsedRequests
from ..protocol import MODEL_VERSION, check_request, check_version, count_priority
from ..request_bodies import LargeBody, decode, read_body
from ..run_records import ParsedRun
from ..run_request import parse_request, response
from ..runs import run
from ..state import ServerState
from .fusions import MOE_EXAMPLE, register
from .links import link

router = APIRouter(tags=["inference"])


# Requests on fusions.MOE_EXAMPLE, the documented graph (schemathesis's stateful phase sends them too).
MOE_INPUTS = [{"name": "topk_ids", "datatype": "INT64", "shape": [2, 2], "data": [1, 3, 3, 15]}]
EXAMPLES = {"InferRequest": {"inputs": MOE_INPUTS},
            "ExecuteRequest": {"graph": MOE_EXAMPLE, "inputs": MOE_INPUTS}}


def _body_doc(schema: str) -> dict:
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"},
                             "examples": {"moe_problem_sizes": {"summary": "MoE problem sizes of 2 tokens, top-2",
                                                                "value": EXAMPLES[schema]}}},
        CONTENT_TYPE: {"schema": {"type": "string", "format": "binary",  # (a media type has no description)
                                  "description": "binary tensor data extension: the JSON header (its length in "
                                                 "the Inference-Header-Content-Length header), then raw tensor "
                                                 "bytes"}}}}}


INFER_RESPONSES = {200: {"content": {CONTENT_TYPE: {"schema": {"type": "string", "format": "binary"}}},
                         "description": "JSON, or with binary outputs the JSON header then raw bytes"},
                   **errors(400, 401, 404, 409, 413, 429, 503)}


async def run_infer(rt: ServerState, fusion, req, tail, model_name: str) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """One inference, from a validated request to the response's bytes and headers. The FastAPI
    routes below and the fast lane (server/fastlane.py) both answer through it."""
    return await _run_parsed(rt, req, _parsed(rt, fusion, req, tail), model_name)


def _parsed(rt: ServerState, fusion, req, tail) -> ParsedRun:
    try:
        deadline = check_request(fusion, req)  # KServe fields, Triton parameters (server/protocol.py)
        return parse_request(rt, fusion, req, tail, deadline)
    except Exception as e:
        rt.stats.record_rejected(fusion, e)  # refused before the run: not a failed run (server/stats.py)
        raise


def _decoded(rt: ServerState, fusion, body: bytes, header_length: str | None):
    """The infer body decoded; a malformed one is counted as refused (server/stats.py)."""
    try:
        return decode_request(InferRequest, body, header_length)
    except Exception as e:
        rt.stats.record_rejected(fusion, e)
        raise


async def _decoded_large(rt: ServerState, fusion, body: LargeBody, header_length: str | None):
    """A large infer body decoded off the event loop; a malformed one is counted as refused."""
    try:
        return await decode(rt, InferRequest, body, header_length)
    except Exception as e:
        rt.stats.record_rejected(fusion, e)
        raise


async def infer_parts(rt: ServerState, fusion, req, tail) -> tuple[dict, list[bytes]]:
    """One inference as (the response body, the binary outputs' bytes): the gRPC front door
    (server/grpc) answers through it."""
    return await _run_result(rt, req, _parsed(rt, fusion, req, tail), fusion.name)


async def _run_result(rt: ServerState, req, parsed: ParsedRun, model_name: str) -> tuple[dict, list[bytes]]:
    count_priority(rt.metrics, req)  # (here: a parsed run reused from a cache skips check_request)
    outcome = await run(rt, parsed)
    body, chunks = response(model_name, req.id, parsed, outcome)
    body["model_version"] = MODEL_VERSION
    return body, chunks


async def _run_parsed(rt: ServerState, req, parsed: ParsedRun, model_name: str) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    body, chunks = await _run_result(rt, req, parsed, model_name)
    if not chunks:
        return dumps(body), [(b"content-type", b"application/json")]
    raw, n = join_body(body, chunks)
    return raw, [(b"content-type", CONTENT_TYPE.encode()), (b"inference-header-content-length", str(n).encode())]


def infer_target(rt: ServerState, model: str, version: str | None = None):
    """The fusion a POST /v2/models/{model}[/versions/{version}]/infer runs, checked before its
    body is read (no body is read, let alone decoded, for a fusion that is not there)."""
    rt.require_ready()
    fusion = rt.fusions.resolve(model)
    if version is not None:
        check_version(fusion, version)
    return fusion


async def infer_body(rt: ServerState, fusion, model: str, body: bytes | LargeBody, header_length: str | None,
                     version: str | None = None):
    """The infer request on `fusion` (infer_target) with its body (server/request_bodies.py read_body).
    A small body seen before for the same fusion reuses its parsed run (server/parsed_requests.py);
    a large one is decoded off the event loop."""
    if isinstance(body, LargeBody):
        req, tail = await _decoded_large(rt, fusion, body, header_length)
        return await _run_parsed(rt, req, _parsed(rt, fusion, req, tail), fusion.name)
    key = ParsedRequests.key(model, version, body, header_length)
    hit = rt.parsed_requests.get(key, fusion, body) if key is not None else None
    if hit is not None:
        req, parsed = hit
    else:
        req, tail = _decoded(rt, fusion, body, header_length)
        parsed = _parsed(rt, fusion, req, tail)
        if key is not None:
            rt.parsed_requests.put(key, fusion, req, parsed)
    return await _run_parsed(rt, req, parsed, fusion.name)


async def infer_bytes(rt: ServerState, model: str, body: bytes, header_length: str | None, version: str | None = None):
    """POST /v2/models/{model}[/versions/{version}]/infer on a request body read already."""
    return await infer_body(rt, infer_target(rt, model, version), model, body, header_length, version)


async def _request_body(rt: ServerState, request: Request) -> bytes | LargeBody:
    declared = request.headers.get("content-length", "")
    size = int(declared) if declared.isascii() and declared.isdigit() and len(declared) <= 19 else None
    return await read_body(rt, request.stream(), size, request.headers.get(HEADER))


def _response(payload: bytes, headers: list[tuple[bytes, bytes]]) -> Response:
    media = dict(headers).pop(b"content-type").decode()
    return Response(payload, media_type=media, headers={k.decode(): v.decode() for k, v in headers
                                                        if k != b"content-type"})


@router.post("/v2/models/{model}/infer", summary="Run a registered fusion (KServe v2 infer)",
             response_model=InferResponse, responses=INFER_RESPONSES, openapi_extra=_body_doc("InferRequest"))
async def infer(rt: AnyState, model: str, request: Request) -> Response:
    # Served by the fast lane (server/fastlane.py); this route documents it and answers when the
    # fast lane is off (app.state.fast_lane = False).
    fusion = infer_target(rt, model)
    body = await _request_body(rt, request)
    return _response(*await infer_body(rt, fusion, model, body, request.headers.get(HEADER)))


@router.get("/v2/models/{model}", response_model=ModelMetadata, summary="KServe model metadata (-1: symbolic)",
            responses=errors(401, 404))
async def model_metadata(rt: AnyState, model: str) -> ModelMetadata:
    fusion = rt.fusions.resolve(model)
    ins, outs = tensor_meta(fusion)
    return ModelMetadata(name=fusion.name, id=fusion.id, inputs=ins, outputs=outs)


@router.get("/v2/models/{model}/ready", response_model=ModelReady, summary="KServe model readiness",
            responses=errors(401, 404, 503))
async def model_ready(rt: ReadyState, model: str) -> ModelReady:
    # The body KServe v2 defines (it was empty: not the JSON the document promised; found by the fuzz).
    return ModelReady(name=rt.fusions.resolve(model).name, ready=True)


EXECUTED = {"GetFusion": link("/v2/fusions/{key}", "get", "the graph it registered", key="$response.body#/model_name"),
            "Infer": link("/v2/models/{model}/infer", "post", "run it again", model="$response.body#/model_name")}


@router.post("/v2/execute", summary="Register an inline graph and run it in one call", response_model=InferResponse,
             responses={**INFER_RESPONSES, 200: {**INFER_RESPONSES[200], "links": EXECUTED}},
             openapi_extra=_body_doc("ExecuteRequest"))
async def execute(rt: ReadyState, request: Request) -> Response:
    req, tail = await decode(rt, ExecuteRequest, await _request_body(rt, request), request.headers.get(HEADER))
    try:
        fusion, _ = await register(rt, req.graph, req.replace)
    except GraphError as e:  # locations inside the request: under "graph"
        raise GraphError([Issue(("graph", *i.loc), i.msg) for i in e.issues]) from None
    return _response(*await run_infer(rt, fusion, req, tail, fusion.name))
