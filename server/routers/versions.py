"""KServe v2 versioned model routes: /v2/models/{m}/versions/{v}[/ready|/infer]. A fusion has one
version, "1" (server/protocol.py); any other version is 404 naming it."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from ..deps import AnyState, ReadyState, errors
from ..models import InferResponse, ModelMetadata, ModelReady
from ..protocol import check_version
from . import infer as unversioned

router = APIRouter(tags=["inference"])

PREFIX = "/v2/models/{model}/versions/{version}"


@router.get(PREFIX, response_model=ModelMetadata, summary="Model metadata of a version",
            responses=errors(401, 404))
async def model_metadata(rt: AnyState, model: str, version: str) -> ModelMetadata:
    check_version(rt.fusions.resolve(model), version)
    return await unversioned.model_metadata(rt, model)


@router.get(PREFIX + "/ready", response_model=ModelReady, summary="Readiness of a version",
            responses=errors(401, 404, 503))
async def model_ready(rt: ReadyState, model: str, version: str) -> ModelReady:
    check_version(rt.fusions.resolve(model), version)
    return await unversioned.model_ready(rt, model)


@router.post(PREFIX + "/infer", summary="Run a version of a fusion (KServe v2 infer)",
             response_model=InferResponse, responses=unversioned.INFER_RESPONSES,
             openapi_extra=unversioned._body_doc("InferRequest"))
async def infer(rt: ReadyState, model: str, version: str, request: Request) -> Response:
    check_version(rt.fusions.resolve(model), version)
    return await unversioned.infer(rt, model, request)
