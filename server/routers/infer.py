"""KServe v2 inference: POST /v2/models/{name or id}/infer, model metadata, and /v2/execute."""

from __future__ import annotations

import pydantic
from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from segfuse.compiler.errors import GraphError, Issue

from ..binary import CONTENT_TYPE, HEADER, BinaryReader, join_body, split_body
from ..deps import AnyRuntime, ReadyRuntime, errors
from ..fusions import tensor_meta
from ..models import ExecuteRequest, InferRequest, InferResponse, ModelMetadata
from ..protocol import MODEL_VERSION, check_request
from ..runs import parse_request, response, run
from ..runtime import Runtime
from .fusions import register

router = APIRouter(tags=["inference"])


def _body_doc(schema: str) -> dict:
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}},
        CONTENT_TYPE: {"schema": {"type": "string", "format": "binary"},
                       "description": "binary tensor data extension: the JSON header (its length in the "
                                      "Inference-Header-Content-Length header), then raw tensor bytes"}}}}


INFER_RESPONSES = {200: {"content": {CONTENT_TYPE: {"schema": {"type": "string", "format": "binary"}}},
                         "description": "JSON, or with binary outputs the JSON header then raw bytes"},
                   **errors(400, 401, 404, 409, 413, 422, 429, 503)}


async def _read(request: Request, model):
    body = await request.body()
    header, tail = split_body(body, request.headers.get(HEADER))
    try:
        req = model.model_validate(header)
    except pydantic.ValidationError as e:
        raise RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in e.errors()]) from None
    return req, (BinaryReader(tail) if request.headers.get(HEADER) is not None else None)


async def _infer(rt: Runtime, fusion, req, tail, model_name: str) -> Response:
    deadline = check_request(fusion, req)  # KServe fields, Triton parameters (server/protocol.py)
    plan = parse_request(rt, fusion, req, tail)
    plan.deadline = deadline
    outcome = await run(rt, plan)
    body, chunks = response(model_name, req.id, plan, outcome)
    body["model_version"] = MODEL_VERSION
    if not chunks:
        return Response(InferResponse.model_validate(body).model_dump_json(exclude_none=True),
                        media_type="application/json")
    raw, n = join_body(body, chunks)
    return Response(raw, media_type=CONTENT_TYPE, headers={"Inference-Header-Content-Length": str(n)})


@router.post("/v2/models/{model}/infer", summary="Run a registered fusion (KServe v2 infer)",
             response_model=InferResponse, responses=INFER_RESPONSES, openapi_extra=_body_doc("InferRequest"))
async def infer(rt: ReadyRuntime, model: str, request: Request) -> Response:
    fusion = rt.fusions.resolve(model)
    req, tail = await _read(request, InferRequest)
    return await _infer(rt, fusion, req, tail, fusion.name)


@router.get("/v2/models/{model}", response_model=ModelMetadata, summary="KServe model metadata (-1: symbolic)",
            responses=errors(401, 404))
async def model_metadata(rt: AnyRuntime, model: str) -> ModelMetadata:
    fusion = rt.fusions.resolve(model)
    ins, outs = tensor_meta(fusion)
    return ModelMetadata(name=fusion.name, id=fusion.id, inputs=ins, outputs=outs)


@router.get("/v2/models/{model}/ready", summary="KServe model readiness", responses=errors(401, 404, 503))
async def model_ready(rt: ReadyRuntime, model: str) -> Response:
    rt.fusions.resolve(model)
    return Response(status_code=200)


@router.post("/v2/execute", summary="Register an inline graph and run it in one call",
             response_model=InferResponse, responses=INFER_RESPONSES, openapi_extra=_body_doc("ExecuteRequest"))
async def execute(rt: ReadyRuntime, request: Request) -> Response:
    req, tail = await _read(request, ExecuteRequest)
    try:
        fusion, _ = await register(rt, req.graph, req.replace)
    except GraphError as e:  # locations inside the request: under "graph"
        raise GraphError([Issue(("graph", *i.loc), i.msg) for i in e.issues]) from None
    return await _infer(rt, fusion, req, tail, fusion.name)
