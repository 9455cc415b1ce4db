"""Named buffers: arrays that stay where the backend computes, read and written by runs."""

from __future__ import annotations

import asyncio

import numpy as np
from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import StreamingResponse

from ..binary import fill_body
from ..codec import LARGE, release
from ..deps import ReadyState, errors
from ..errors import bad_request, not_found
from ..jsonio import validate_json
from ..models import BufferInfo, BufferJson, BufferJsonOut, BufferList, BufferPut, Deleted
from ..names import path_name
from ..state import ServerState
from ..tensors import (
    check_shape,
    dtype_of,
    from_json_data,
    from_npy,
    from_raw,
    kserve_name,
    nbytes_of,
    parse_dtype,
    parse_shape_param,
    raw_view,
    to_json_data,
    to_npy,
)
from .links import link

router = APIRouter(prefix="/v2/buffers", tags=["buffers"])

NPY = "application/x-npy"
RAW = "application/octet-stream"
JSON = "application/json"

BufferName = path_name("buffer")


def info(rt: ServerState, b) -> BufferInfo:
    return BufferInfo(name=b.name, dtype=b.dtype.value, datatype=kserve_name(b.dtype), shape=list(b.shape),
                      bytes=b.nbytes, device=rt.store.device)


@router.get("", response_model=BufferList, summary="List buffers", responses=errors(401, 503))
async def list_buffers(rt: ReadyState) -> BufferList:
    return BufferList(buffers=[info(rt, b) for b in rt.store.all()], total_bytes=rt.store.used_bytes,
                      limit_bytes=rt.store.max_total_bytes)


PUT_BODY = {
    "requestBody": {
        "required": True,
        "content": {  # JSON first: Swagger UI's "Try it out" starts from the first type's example
            JSON: {"schema": {"$ref": "#/components/schemas/BufferJson"},
                   "examples": {"int64_2x2": {"summary": "a 2x2 int64 array",
                                              "value": {"dtype": "int64", "shape": [2, 2], "data": [1, 2, 3, 4]}}}},
            RAW: {"schema": {"type": "string", "format": "binary",
                             "description": "raw little-endian row-major bytes; dtype and shape as query parameters"}},
            NPY: {"schema": {"type": "string", "format": "binary", "description": "a .npy file"}},
        },
    }
}


STORED = {"GetBuffer": link("/v2/buffers/{name}", "get", "read it back", name="$request.path.name"),
          "DeleteBuffer": link("/v2/buffers/{name}", "delete", "delete it", name="$request.path.name")}


@router.put("/{name}", response_model=BufferPut, summary="Create or replace a buffer", openapi_extra=PUT_BODY,
            responses={200: {"links": STORED}, 201: {"model": BufferPut, "description": "created", "links": STORED},
                       **errors(400, 401, 413, 503)})
async def put_buffer(rt: ReadyState, request: Request, response: Response, name: str = BufferName,
                     dtype: str | None = Query(None, description="with application/octet-stream: int64 or INT64"),
                     shape: str | None = Query(None, description="with application/octet-stream: e.g. 4096,8"),
                     ) -> BufferPut:
    ctype = request.headers.get("content-type", RAW).split(";")[0].strip().lower()
    declared = request.headers.get("content-length", "")
    if ctype == JSON and declared.isdigit() and int(declared) >= LARGE:
        return await _put_large_json(rt, request, response, name, int(declared))
    if declared.isdigit() and int(declared) >= LARGE:
        body = await _read_into(request, int(declared), rt.arrays.host_buffer)  # no join on the event loop
    else:
        body = await request.body()
    if ctype == JSON:
        doc = validate_json(BufferJson, body)
        dt = parse_dtype(doc.dtype, ["body", "dtype"])
        shp = check_shape(doc.shape, ["body", "shape"], rt.settings.max_rank)
        rt.store.check_sizes({name: nbytes_of(shp, dt)}, lambda n: ["body"])
        host = await asyncio.to_thread(from_json_data, doc.data, dt, shp, ["body", "data"])
    elif ctype in (NPY, "application/npy"):
        host = await asyncio.to_thread(from_npy, body, ["body"])
        check_shape(list(host.shape), ["body"], rt.settings.max_rank)
    elif ctype == RAW:
        if dtype is None or shape is None:
            raise bad_request("raw bytes need the dtype and shape query parameters, e.g. "
                              "?dtype=int64&shape=4096,8", ["query"])
        dt = parse_dtype(dtype, ["query", "dtype"])
        shp = check_shape(list(parse_shape_param(shape, ["query", "shape"])), ["query", "shape"],
                          rt.settings.max_rank)
        host = from_raw(body, dt, shp, ["body"])
    else:
        raise bad_request(f"unsupported Content-Type '{ctype}' (use {RAW}, {NPY} or {JSON})",
                          ["headers", "Content-Type"])
    return await _store(rt, response, name, host)


async def _store(rt: ServerState, response: Response, name: str, host) -> BufferPut:
    try:
        dt = dtype_of(host)
    except ValueError as e:
        raise bad_request(str(e), ["body"]) from None
    nbytes = nbytes_of(tuple(host.shape), dt)
    store = rt.store
    async with store.pin(writes=[name]):  # waits for runs and readers of the old contents
        async with store.reserve({name: nbytes}, lambda n: ["body"]):
            device_array = await rt.on_device(rt.arrays.from_host, host)
            created = store.commit(name, device_array, dt, tuple(host.shape), nbytes)
        b = store.get(name)
    response.status_code = 201 if created else 200
    return BufferPut(buffer=info(rt, b), created=created)


async def _read_into(request: Request, size: int, host_buffer) -> memoryview:
    """A body of `size` bytes (its Content-Length), written chunk by chunk into one buffer."""
    view = memoryview(host_buffer(size))
    await fill_body(request.stream(), view, size)
    return view


async def _put_large_json(rt: ServerState, request: Request, response: Response, name: str, size: int) -> BufferPut:
    """A large JSON body, parsed by the codec process (server/codec.py): the event loop stays free."""
    codec = rt.codec
    body = await codec.stream_body(request.stream(), size)
    dtype, shape, host, seg = await codec.decode_buffer(body, size, rt.settings.max_rank, rt.store.max_buffer_bytes)
    try:
        rt.store.check_sizes({name: host.nbytes}, lambda n: ["body"])
        return await _store(rt, response, name, host)
    finally:
        del host
        await release(seg)


GET_RESPONSES = {
    200: {"description": "the buffer: .npy by default; raw bytes or JSON when Accept asks",
          "content": {NPY: {"schema": {"type": "string", "format": "binary"}},
                      RAW: {"schema": {"type": "string", "format": "binary"}},
                      JSON: {"schema": {"$ref": "#/components/schemas/BufferJsonOut"}}}},
    **errors(401, 404, 503),
}


def _wants(accept: str) -> str:
    """The first of npy/raw/json the Accept header names (by q order); .npy by default."""
    choices = []
    for i, part in enumerate(accept.split(",")):
        media, *params = [p.strip() for p in part.split(";")]
        q = 1.0
        for p in params:
            if p.startswith("q="):
                try:
                    q = float(p[2:])
                except ValueError:
                    pass
        choices.append((-q, i, media.lower()))
    for _, _, media in sorted(choices):
        if media in (NPY, "application/npy"):
            return NPY
        if media == RAW:
            return RAW
        if media == JSON:
            return JSON
    return NPY


@router.get("/{name}", summary="Read a buffer", response_class=Response, responses=GET_RESPONSES)
async def get_buffer(rt: ReadyState, request: Request, name: str = BufferName) -> Response:
    store = rt.store
    fmt = _wants(request.headers.get("accept", ""))
    async with store.pin(reads=[name]):  # never a half-written buffer
        b = store.get(name)
        if b is None:
            raise not_found("buffer", name, ["path", "name"])
        host = await rt.on_device(rt.arrays.to_host, b.array)
    headers = {"X-Segfuse-Dtype": b.dtype.value, "X-Segfuse-Shape": ",".join(map(str, b.shape))}
    if fmt == JSON and host.nbytes >= LARGE // 4:  # (the JSON text is larger than the array)
        size, chunks = await rt.codec.encode_buffer(name, b.dtype.value, host)
        return StreamingResponse(chunks, media_type=JSON, headers={**headers, "content-length": str(size)})
    if fmt == JSON:
        doc = BufferJsonOut(name=name, dtype=b.dtype.value, shape=list(b.shape), data=to_json_data(host))
        return Response(doc.model_dump_json(), media_type=JSON, headers=headers)
    if fmt == RAW:  # the array's own bytes, not a copy made on the event loop
        return Response(memoryview(raw_view(host).reshape(-1).view(np.uint8)), media_type=RAW, headers=headers)
    return Response(to_npy(host), media_type=NPY, headers=headers)


@router.delete("/{name}", response_model=Deleted, summary="Delete a buffer (waits for runs using it)",
               responses=errors(401, 404, 503))
async def delete_buffer(rt: ReadyState, name: str = BufferName) -> Deleted:
    store = rt.store
    if name not in store:
        raise not_found("buffer", name, ["path", "name"])
    async with store.pin(writes=[name]):
        if store.remove(name) is None:  # deleted by someone else while we waited
            raise not_found("buffer", name, ["path", "name"])
    return Deleted(deleted=name)
