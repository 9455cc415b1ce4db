"""`inference.GRPCInferenceService`: each RPC translates its message to the call the HTTP route
makes (server/routers/*, whose functions it calls) and the answer back; the messages are
Triton's grpc_service.proto and model_config.proto (messages.py: tritonclient's definitions in a
descriptor pool of segfuse's own).

Where gRPC answers differently from HTTP, it is as Triton's gRPC does: ModelReady of an unknown
model or on a server that is not ready is `ready: false`, not an error; ModelStreamInfer answers
each request of the stream with its response or its error_message, in the order the runs finish.
"""

from __future__ import annotations

import asyncio
import base64

import pydantic
from fastapi.exceptions import RequestValidationError
from google.protobuf import json_format

from ..errors import ApiError
from ..logs import REQUEST_ID
from ..models import CudaRegionRegister, RawHandle, SystemRegionRegister
from ..names import check_name
from ..regions import CUDA, SYSTEM
from ..routers import health, infer, repository, shm, stats, tracelog, versions
from ..state import ServerState
from .calls import SERVICE, error_parts, streaming, unary
from .infer_messages import infer_request, infer_response, parameter_values
from .messages import model_config, pb

STREAM_ENDPOINT = f"/{SERVICE}/ModelStreamInfer"


def _validated(model: type[pydantic.BaseModel], **fields):
    try:
        return model(**fields)
    except pydantic.ValidationError as e:  # answered as a malformed HTTP body is
        raise RequestValidationError(e.errors()) from None


def _from_json(doc, message):
    """A JSON document of the HTTP API (protobuf's JSON mapping, as Triton's) as `message`."""
    return json_format.ParseDict(doc, message, ignore_unknown_fields=True)


class InferenceService:
    """One method per RPC of `inference.GRPCInferenceService` (server.py serves them by name)."""

    def __init__(self, state: ServerState):
        self.state = state

    # ---- health and metadata -------------------------------------------------------------
    @unary
    async def ServerLive(self, request, context):
        return pb.ServerLiveResponse(live=health.live_status()[0] == 200)

    @unary
    async def ServerReady(self, request, context):
        return pb.ServerReadyResponse(ready=health.ready_status(self.state)[0] == 200)

    @unary
    async def ModelReady(self, request, context):
        rt = self.state
        try:
            rt.require_ready()  # (the HTTP route's ReadyState)
            if request.version:
                await versions.model_ready(rt, request.name, request.version)
            else:
                await infer.model_ready(rt, request.name)
        except ApiError as e:
            if e.status in (404, 503):  # Triton: an unknown model, or a server not ready, is not ready
                return pb.ModelReadyResponse(ready=False)
            raise
        return pb.ModelReadyResponse(ready=True)

    @unary
    async def ServerMetadata(self, request, context):
        m = await health.server_metadata(self.state)
        return pb.ServerMetadataResponse(name=m.name, version=m.version, extensions=m.extensions)

    @unary
    async def ModelMetadata(self, request, context):
        rt = self.state
        if request.version:
            m = await versions.model_metadata(rt, request.name, request.version)
        else:
            m = await infer.model_metadata(rt, request.name)
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=m.name, versions=m.versions, platform=m.platform,
            inputs=[tensor(name=t.name, datatype=t.datatype, shape=t.shape) for t in m.inputs],
            outputs=[tensor(name=t.name, datatype=t.datatype, shape=t.shape) for t in m.outputs])

    @unary
    async def ModelConfig(self, request, context):
        rt = self.state
        if request.version:
            doc = await repository.get_version_config(rt, request.name, request.version)
        else:
            doc = await repository.get_config(rt, request.name)
        return pb.ModelConfigResponse(config=_from_json(doc, model_config.ModelConfig()))

    @unary
    async def ModelStatistics(self, request, context):
        rt = self.state
        if not request.name:
            doc = await stats.all_stats(rt)
        elif request.version:
            doc = await stats.version_stats(rt, request.name, request.version)
        else:
            doc = await stats.model_stats(rt, request.name)
        return _from_json(doc, pb.ModelStatisticsResponse())

    # ---- inference -------------------------------------------------------------------------
    async def _infer(self, request: pb.ModelInferRequest) -> pb.ModelInferResponse:
        rt = self.state
        fusion = infer.infer_target(rt, request.model_name, request.model_version or None)
        try:
            req, raws = infer_request(request)
        except Exception as e:
            rt.stats.record_rejected(fusion, e)  # as the HTTP path counts a body it cannot decode
            raise
        body, chunks = await infer.infer_parts(rt, fusion, req, raws)
        return infer_response(body, chunks)

    @unary
    async def ModelInfer(self, request, context):
        return await self._infer(request)

    @streaming
    async def ModelStreamInfer(self, requests, context, rid: str):
        responses: asyncio.Queue = asyncio.Queue()
        running: set[asyncio.Task] = set()
        metrics = self.state.metrics

        async def answer(request) -> None:
            REQUEST_ID.set(rid)  # (this task's own context)
            status = 200
            try:
                response = pb.ModelStreamInferResponse(infer_response=await self._infer(request))
            except Exception as e:
                status, body, _ = error_parts(e, "ModelStreamInfer", rid)
                response = pb.ModelStreamInferResponse(error_message=body["error"], infer_response=pb.ModelInferResponse(
                    model_name=request.model_name, model_version=request.model_version, id=request.id))
            metrics.request_done(STREAM_ENDPOINT, "POST", status)
            responses.put_nowait(response)

        async def read() -> None:
            try:
                async for request in requests:
                    task = asyncio.create_task(answer(request))
                    running.add(task)
                    task.add_done_callback(running.discard)
                while running:
                    await asyncio.wait(set(running))
            finally:
                responses.put_nowait(None)

        reader = asyncio.create_task(read())
        try:
            while (response := await responses.get()) is not None:
                yield response
            await reader  # (a failed read of the stream ends the call with its error)
        finally:
            for task in (reader, *running):
                task.cancel()

    # ---- model repository --------------------------------------------------------------------
    @unary
    async def RepositoryIndex(self, request, context):
        index = pb.RepositoryIndexResponse.ModelIndex
        entries = repository.repository_entries(self.state, request.ready)
        return pb.RepositoryIndexResponse(models=[index(**e) for e in entries])

    @unary
    async def RepositoryModelLoad(self, request, context):
        await repository.load(self.state, request.model_name, parameter_values(request.parameters))
        return pb.RepositoryModelLoadResponse()

    @unary
    async def RepositoryModelUnload(self, request, context):
        await repository.unload(self.state, request.model_name, parameter_values(request.parameters))
        return pb.RepositoryModelUnloadResponse()

    # ---- shared memory ---------------------------------------------------------------------
    def _statuses(self, kind: str, name: str) -> list[dict]:
        self.state.require_ready()  # (the HTTP routes' ReadyState)
        return shm.region_statuses(self.state, kind, name or None)

    async def _unregister(self, kind: str, name: str) -> None:
        self.state.require_ready()
        await shm.unregister_regions(self.state, kind, name or None)

    def _region_name(self, name: str) -> str:
        self.state.require_ready()
        return check_name(name, ["name"], "shared memory region")

    @unary
    async def SystemSharedMemoryStatus(self, request, context):
        response = pb.SystemSharedMemoryStatusResponse()
        for s in self._statuses(SYSTEM, request.name):
            response.regions[s["name"]].CopyFrom(response.RegionStatus(
                name=s["name"], key=s["key"], offset=s["offset"], byte_size=s["byte_size"]))
        return response

    @unary
    async def SystemSharedMemoryRegister(self, request, context):
        name = self._region_name(request.name)
        body = _validated(SystemRegionRegister, key=request.key, offset=request.offset, byte_size=request.byte_size)
        await shm.register_system(self.state, body, name)
        return pb.SystemSharedMemoryRegisterResponse()

    @unary
    async def SystemSharedMemoryUnregister(self, request, context):
        await self._unregister(SYSTEM, request.name)
        return pb.SystemSharedMemoryUnregisterResponse()

    @unary
    async def CudaSharedMemoryStatus(self, request, context):
        response = pb.CudaSharedMemoryStatusResponse()
        for s in self._statuses(CUDA, request.name):
            response.regions[s["name"]].CopyFrom(response.RegionStatus(
                name=s["name"], device_id=s["device_id"], byte_size=s["byte_size"]))
        return response

    @unary
    async def CudaSharedMemoryRegister(self, request, context):
        name = self._region_name(request.name)
        handle = RawHandle(b64=base64.b64encode(request.raw_handle).decode())  # (gRPC carries the raw bytes)
        body = _validated(CudaRegionRegister, raw_handle=handle, device_id=request.device_id,
                          byte_size=request.byte_size)
        await shm.register_cuda(self.state, body, name)
        return pb.CudaSharedMemoryRegisterResponse()

    @unary
    async def CudaSharedMemoryUnregister(self, request, context):
        await self._unregister(CUDA, request.name)
        return pb.CudaSharedMemoryUnregisterResponse()

    # ---- trace and log settings --------------------------------------------------------------
    @unary
    async def TraceSetting(self, request, context):
        if request.model_name:
            self.state.fusions.resolve(request.model_name)  # (404 as HTTP's /v2/models/{m}/trace/setting)
        doc = {}
        for key, setting in request.settings.items():
            values = list(setting.value)  # none: clear the setting (HTTP's null)
            doc[key] = values if key == "trace_level" or len(values) > 1 else (values[0] if values else None)
        response = pb.TraceSettingResponse()
        for key, value in tracelog.apply_trace(doc).items():
            response.settings[key].value.extend(value if isinstance(value, list) else [str(value)])
        return response

    @unary
    async def LogSettings(self, request, context):
        doc = {}
        for key, setting in request.settings.items():
            which = setting.WhichOneof("parameter_choice")
            doc[key] = getattr(setting, which) if which is not None else None
        settings = tracelog.update_log_settings(self.state, doc) if doc else tracelog.log_settings()
        response = pb.LogSettingsResponse()
        for key, value in settings.items():
            if isinstance(value, bool):
                response.settings[key].bool_param = value
            elif isinstance(value, int):
                response.settings[key].uint32_param = value
            else:
                response.settings[key].string_param = str(value)
        return response
