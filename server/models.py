"""Pydantic models of every request and response body (they make the OpenAPI schema at /docs)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_core import PydanticCustomError

from .names import KEY_PATTERN

TensorData = list[Any]  # flat or nested row-major list of numbers (KServe)

# Request bodies are validated strictly, as their schema says: "true" or 1 is not a boolean, "4",
# 4.0 or true is not an integer (a lax parser read "overwrite": "true" as true and replaced a stored
# buffer). A JSON integer stays a valid float. Response models keep the default: the server makes them.
STRICT = ConfigDict(strict=True, extra="forbid")


class ErrorDetail(BaseModel):
    loc: list[str | int] = Field(description="where in the request, e.g. ['inputs', 0, 'shape']")
    msg: str


class ErrorBody(BaseModel):
    error: str
    details: list[ErrorDetail] = Field(default_factory=list)


# ---- health and metadata ---------------------------------------------------------------
class GpuInfo(BaseModel):
    """The GPU a server runs on, read once at start (server/gpu_info.py); a field the CUDA driver
    or CuPy does not report is null."""

    index: int = Field(description="the CUDA ordinal inside the server's process (0 in a Ray shard)")
    visible_devices: str | None = Field(description="CUDA_VISIBLE_DEVICES as the process saw it, or null when unset")
    uuid: str | None = Field(description="the GPU's UUID, as nvidia-smi prints it: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx")
    pci_bus_id: str | None = Field(description="domain:bus:device.function, e.g. 0000:19:00.0")
    name: str | None = Field(description="the device name, e.g. NVIDIA H200")
    total_memory_bytes: int | None = Field(description="the device's global memory")


class ServerMetadata(BaseModel):
    name: str
    version: str
    extensions: list[str]
    backend: str = Field(description="cupy or numpy")
    device: str = Field(description="cuda:N or cpu")
    shard: str | None = Field(description="the shard id (shard-<i>) when the server runs as a segfuse serve-ray shard, "
                                          "else null")
    gpu: GpuInfo | None = Field(description="the GPU that serves this server's requests; null on the NumPy "
                                            "backend (and while the backend starts)")


# ---- buffers ----------------------------------------------------------------------------
class BufferInfo(BaseModel):
    name: str
    dtype: str = Field(description="segfuse dtype name, e.g. int64")
    datatype: str = Field(description="KServe datatype, e.g. INT64")
    shape: list[int]
    bytes: int
    device: str


class BufferList(BaseModel):
    buffers: list[BufferInfo]
    total_bytes: int
    limit_bytes: int


class BufferJson(BaseModel):
    """A buffer as JSON (PUT with Content-Type application/json, GET with Accept application/json)."""

    model_config = STRICT
    dtype: str = Field(description="int64 or INT64 style")
    shape: list[int]
    data: TensorData


class BufferJsonOut(BufferJson):
    model_config = ConfigDict(strict=False)
    name: str


class BufferPut(BaseModel):
    buffer: BufferInfo
    created: bool = Field(description="false when an existing buffer was replaced")


class Deleted(BaseModel):
    deleted: str


# ---- fusions ----------------------------------------------------------------------------
class TensorMetadata(BaseModel):
    name: str
    datatype: str
    shape: list[int] = Field(description="-1 for a symbolic (run-time) size")


class FusionInfo(BaseModel):
    id: str = Field(description="content hash of the canonical graph")
    name: str
    ops: int
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]
    symbols: list[str]


class FusionRegistered(FusionInfo):
    created: bool = Field(description="false when the same graph was already registered")
    replaced: str | None = Field(None, description="id of the fusion this one replaced under the name")


class FusionDetail(FusionInfo):
    graph: dict[str, Any]


class FusionList(BaseModel):
    fusions: list[FusionInfo]


class KernelSource(BaseModel):
    segment: int
    kind: str | None = None
    kernels: list[str] = Field(default_factory=list, description="kernel names launched by this segment")
    source: str | None = Field(None, description="the generated CUDA C++ module")
    unavailable: str | None = Field(None, description="why there is no source (no kernel, or not generated)")


class PlanResponse(BaseModel):
    fusion_id: str
    symbols: dict[str, int]
    shapes: dict[str, list[int]] = Field(description="input shapes the plan was made for")
    plan: dict[str, Any] = Field(description="segments with kinds, nodes, reasons and launch hints")
    kernels: list[KernelSource] = Field(default_factory=list,
                                        description="per segment, the CUDA modules a run of contiguous inputs compiles")


# ---- inference (KServe v2) --------------------------------------------------------------
class SharedMemoryParameters(BaseModel):
    """Triton's shared-memory parameters of an input or a requested output (server/region_io.py)."""

    model_config = ConfigDict(strict=True)

    shared_memory_region: str | None = Field(None, description="a registered system or CUDA shared-memory region")
    shared_memory_byte_size: int | None = Field(None, ge=0, description="bytes of the tensor in the region "
                                                "(required with shared_memory_region)")
    shared_memory_offset: int | None = Field(None, ge=0, description="where the tensor starts in the region (0)")


class InputParameters(SharedMemoryParameters):
    model_config = ConfigDict(strict=True, extra="allow")
    buffer: str | None = Field(None, description="read this stored buffer instead of inline data")
    binary_data_size: int | None = Field(None, ge=0, description="bytes of this tensor in the binary tail")


class InferInput(BaseModel):
    model_config = STRICT
    name: str
    shape: list[int] | None = None
    datatype: str | None = None
    parameters: InputParameters | None = None
    data: TensorData | None = None


class OutputParameters(SharedMemoryParameters):
    model_config = ConfigDict(strict=True, extra="allow")
    buffer: str | None = Field(None, description="store the output under this buffer name (stays on the device)")
    overwrite: bool = Field(False, description="allow replacing an existing buffer of that name")
    binary_data: bool | None = Field(None, description="return the data in the binary tail")
    return_data: bool | None = Field(None, description="also return the data when stored in a buffer")


class InferRequestedOutput(BaseModel):
    model_config = STRICT
    name: str
    parameters: OutputParameters | None = None


UINT64_MAX = 2 ** 64 - 1  # Triton's priority, timeout and numeric sequence_id are uint64


class RequestParameters(BaseModel):
    # Parameters segfuse does not read are custom ones, which Triton passes on to its backends:
    # accepted and ignored when their value is a string, a number or a boolean (server/protocol.py).
    model_config = ConfigDict(strict=True, extra="allow")
    binary_data_output: bool | None = Field(None, description="binary data for every returned output")
    timeout: int | None = Field(None, ge=0, description="Triton: microseconds; the run fails with 429 "
                                "unless it starts within it (0: no timeout)")
    priority: int | None = Field(None, ge=0, le=UINT64_MAX, description="Triton's priority level: accepted, "
                                 "with no effect while runs wait in one queue in arrival order (requests that "
                                 "carry one are counted in segfuse_infer_priority_requests_total)")
    sequence_id: int | str | None = Field(None, description="Triton sequences (an unsigned 64-bit integer or a "
                                          "string): accepted and ignored, as Triton does for a model without a "
                                          "sequence batcher (a fusion keeps no state between runs)")
    sequence_start: bool | None = Field(None, description="Triton sequences: accepted and ignored")
    sequence_end: bool | None = Field(None, description="Triton sequences: accepted and ignored")

    @field_validator("sequence_id", mode="wrap")
    @classmethod
    def _sequence_id(cls, value, handler):
        """One error located at the field (a union's would name each member), as Triton's rule says it."""
        error = PydanticCustomError("sequence_id", "a sequence id is an unsigned 64-bit integer or a string")
        try:
            v = handler(value)
        except ValidationError:
            raise error from None
        if isinstance(v, int) and not 0 <= v <= UINT64_MAX:
            raise error
        return v


class InferRequest(BaseModel):
    # Fields KServe v2 does not define are ignored, as Triton does (a client may send its own);
    # inside inputs and outputs, and in /v2/execute's body (segfuse's own), they are refused.
    model_config = ConfigDict(strict=True, extra="ignore")
    id: str | None = None
    model_name: str | None = Field(None, description="KServe: if given, the fusion's name (or id) of the URL")
    model_version: str | None = Field(None, description="KServe: if given, \"1\" (a fusion's only version)")
    parameters: RequestParameters | None = None
    inputs: list[InferInput] = Field(default_factory=list)
    outputs: list[InferRequestedOutput] | None = Field(
        None, description="omitted: every graph output is returned inline")


class ExecuteRequest(InferRequest):
    model_config = STRICT
    graph: dict[str, Any] = Field(description="a segfuse.fusion/1 graph, registered and run in one call")
    replace: bool = False


class OutputResultParameters(SharedMemoryParameters):
    model_config = ConfigDict(strict=False, extra="allow")
    buffer: str | None = None
    binary_data_size: int | None = None


class InferOutput(BaseModel):
    name: str
    shape: list[int]
    datatype: str
    parameters: OutputResultParameters | None = None
    data: TensorData | None = None


class RunParameters(BaseModel):
    fusion_id: str
    timings_us: dict[str, float] = Field(description="plan, compile, run (and queue, batch, total) in microseconds")
    cache_hits: int = Field(description="the engine's cache (plan and kernels of this shape class) hits")
    cache_misses: int
    kernels_compiled: int = Field(0, description="CUDA kernels compiled for this run (0 on a warm cache)")
    batch_size: int = Field(1, description="runs launched together with this one (one wait for the device)")


class InferResponse(BaseModel):
    model_name: str
    model_version: str | None = None
    id: str | None = None
    outputs: list[InferOutput]
    parameters: RunParameters


class ModelReady(BaseModel):
    """KServe v2's model ready response (Triton's clients read only the status)."""
    name: str
    ready: bool


class ModelMetadata(BaseModel):
    name: str
    id: str
    versions: list[str] = Field(default_factory=lambda: ["1"])
    platform: str = "segfuse"
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


# ---- shared-memory regions (Triton's extensions) -----------------------------------------
class SystemRegionRegister(BaseModel):
    model_config = STRICT
    key: str = Field(description="POSIX shared-memory object, a plain name such as /input_data (no paths)",
                     json_schema_extra={"pattern": KEY_PATTERN})
    offset: int = Field(0, ge=0, description="where the region starts in the object")
    byte_size: int = Field(ge=1, description="bytes of the region")


class RawHandle(BaseModel):
    model_config = STRICT
    b64: str = Field(description="base64 of the 64-byte cudaIpcMemHandle_t")


class CudaRegionRegister(BaseModel):
    model_config = STRICT
    raw_handle: RawHandle
    device_id: int = Field(ge=0, description="the GPU the allocation lives on (must be the server's)")
    byte_size: int = Field(ge=1, description="bytes of the region, from the start of the allocation")


class SystemRegionStatus(BaseModel):
    name: str
    key: str
    offset: int
    byte_size: int
    ref_count: int = Field(description="runs using the region now")


class CudaRegionStatus(BaseModel):
    name: str
    device_id: int
    byte_size: int
    ref_count: int = Field(description="runs using the region now")


class RegionsUnregistered(BaseModel):
    unregistered: list[str]
