"""Triton's shared-memory extensions: register, status and unregister of system regions
(/v2/systemsharedmemory) and CUDA regions (/v2/cudasharedmemory), one namespace for both."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.routing import APIRoute

from ..deps import ReadyState, errors
from ..errors import ApiError
from ..models import (
    CudaRegionRegister,
    CudaRegionStatus,
    RegionsUnregistered,
    SystemRegionRegister,
    SystemRegionStatus,
)
from ..names import path_name
from ..regions import CUDA, SYSTEM, TITLE, Region, RegionStore
from ..state import ServerState
from .links import link


class JsonBodyRoute(APIRoute):
    """Bodies are JSON whatever their Content-Type says, as for infer: tritonclient posts them with
    none, `curl -d` with a form type."""

    def get_route_handler(self):
        handler = super().get_route_handler()

        async def handle(request: Request):
            headers = [(k, v) for k, v in request.scope["headers"] if k != b"content-type"]
            scope = {**request.scope, "headers": [*headers, (b"content-type", b"application/json")]}
            return await handler(Request(scope, request.receive))

        return handle


router = APIRouter(tags=["shared memory"], route_class=JsonBodyRoute)

RegionName = path_name("shared memory region", "; one namespace for system and CUDA regions")
SYSTEM_PREFIX, CUDA_PREFIX = "/v2/systemsharedmemory", "/v2/cudasharedmemory"

# The object a client made with shm_open("/input_data") and ftruncate to 64 bytes or more.
SYSTEM_EXAMPLE = {"requestBody": {"content": {"application/json": {"examples": {"input_data": {
    "summary": "64 bytes of /input_data",
    "description": "the object must exist: e.g. `truncate -s 64 /dev/shm/input_data` on Linux",
    "value": {"key": "/input_data", "offset": 0, "byte_size": 64}}}}}}}


def _registered(prefix: str) -> dict:
    """A registered region leads to its status and its unregistering."""
    name = "$request.path.name"
    return {200: {"links": {
        "RegionStatus": link(f"{prefix}/region/{{name}}/status", "get", "its status", name=name),
        "Unregister": link(f"{prefix}/region/{{name}}/unregister", "post", "unregister it", name=name)}}}


@router.post(f"{SYSTEM_PREFIX}/region/{{name}}/register", response_model=SystemRegionStatus,
             summary="Register a POSIX shared-memory object (or a slice of it) as a region",
             responses={**_registered(SYSTEM_PREFIX), **errors(400, 401, 413, 503)}, openapi_extra=SYSTEM_EXAMPLE)
async def register_system(rt: ReadyState, body: SystemRegionRegister, name: str = RegionName) -> dict:
    region = await asyncio.to_thread(rt.regions.register_system, name, body.key, body.offset, body.byte_size)
    return region.status()


@router.post(f"{CUDA_PREFIX}/region/{{name}}/register", response_model=CudaRegionStatus,
             summary="Register another process's GPU allocation (a cudaIpcMemHandle_t) as a region",
             responses={**_registered(CUDA_PREFIX), **errors(400, 401, 413, 501, 503)})
async def register_cuda(rt: ReadyState, body: CudaRegionRegister, name: str = RegionName) -> dict:
    region = await rt.on_device(rt.regions.register_cuda, name, body.raw_handle.b64, body.device_id,
                                body.byte_size, rt.arrays)
    return region.status()


async def _close(rt: ServerState, regions: list[Region]) -> None:
    for r in regions:
        if r.kind == CUDA:
            await rt.on_device(RegionStore.close, r, rt.arrays)
        else:
            RegionStore.close(r)


def region_statuses(rt: ServerState, kind: str, name: str | None = None) -> list[dict]:
    """The status of every region of `kind`, or of the one named (404 if none); HTTP and gRPC answer with it."""
    if name is None:
        return [r.status() for r in rt.regions.all(kind)]
    return [rt.regions.find(name, kind, ["path", "name"]).status()]


async def unregister_regions(rt: ServerState, kind: str, name: str | None = None) -> list[str]:
    """Unregister the region named (404 if none; 400 while a run uses it), or every idle region of
    `kind` (400 naming those in use, which stay); the names unregistered. HTTP and gRPC call it."""
    if name is not None:
        region = rt.regions.unregister(name, kind)
        await _close(rt, [region])
        return [name]
    idle, busy = rt.regions.unregister_all(kind)
    await _close(rt, idle)
    if busy:
        names = ", ".join(f"'{r.name}'" for r in busy)
        done = ", ".join(f"'{r.name}'" for r in idle) or "none"
        raise ApiError(400, f"Failed to unregister the following {TITLE[kind]} regions, currently in use by runs: "
                            f"{names} (unregistered: {done}); retry when the runs have finished",
                       [{"loc": ["regions", r.name], "msg": f"in use by {r.pins} run(s)"} for r in busy])
    return [r.name for r in idle]


def _add_routes(kind: str, prefix: str, status_model) -> None:
    """Status and unregister, the same for both kinds."""
    title = TITLE[kind]

    @router.get(f"{prefix}/status", response_model=list[status_model], summary=f"Status of every {title} region",
                responses=errors(401, 503))
    async def status_all(rt: ReadyState) -> list[dict]:
        return region_statuses(rt, kind)

    @router.get(f"{prefix}/region/{{name}}/status", response_model=list[status_model],
                summary=f"Status of one {title} region", responses=errors(401, 404, 503))
    async def status_one(rt: ReadyState, name: str = RegionName) -> list[dict]:
        return region_statuses(rt, kind, name)

    @router.post(f"{prefix}/region/{{name}}/unregister", response_model=RegionsUnregistered,
                 summary=f"Unregister one {title} region (refused while a run uses it)",
                 responses=errors(400, 401, 404, 503))
    async def unregister_one(rt: ReadyState, name: str = RegionName) -> RegionsUnregistered:
        return RegionsUnregistered(unregistered=await unregister_regions(rt, kind, name))

    @router.post(f"{prefix}/unregister", response_model=RegionsUnregistered,
                 summary=f"Unregister every idle {title} region (those in use stay, and are named in a 400)",
                 responses=errors(400, 401, 503))
    async def unregister_all(rt: ReadyState) -> RegionsUnregistered:
        return RegionsUnregistered(unregistered=await unregister_regions(rt, kind))


_add_routes(SYSTEM, SYSTEM_PREFIX, SystemRegionStatus)
_add_routes(CUDA, CUDA_PREFIX, CudaRegionStatus)
