"""Which GPU a server runs on, as `GET /v2` (`gpu`) and the `segfuse_gpu_info` metric say: read once
when the backend starts, through CuPy's runtime API (`getDeviceProperties`, `deviceGetPCIBusId`).

Inside a shard placed by Ray, Ray sets CUDA_VISIBLE_DEVICES to the replica's GPU, so its CUDA ordinal is
always 0: the UUID and the PCI bus id are what name the physical GPU. Each field is read on its own;
one this CuPy or driver does not report is None (null), never an error.
"""

from __future__ import annotations

import functools
import os

FIELDS = ("index", "visible_devices", "uuid", "pci_bus_id", "name", "total_memory_bytes")


def format_uuid(raw) -> str | None:
    """NVIDIA's form of a GPU UUID ("GPU-" and 8-4-4-4-12 hex digits, as nvidia-smi prints it) from
    the 16 bytes of cudaDeviceProp.uuid; a string already in that form is kept."""
    if isinstance(raw, str):
        return raw if raw.startswith(("GPU-", "MIG-")) else None
    if not isinstance(raw, (bytes, bytearray)) or len(raw) != 16:
        return None
    h = bytes(raw).hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


def _text(raw) -> str | None:
    if isinstance(raw, (bytes, bytearray)):
        raw = bytes(raw).split(b"\0", 1)[0].decode("utf-8", "replace")
    return (raw.strip() or None) if isinstance(raw, str) else None


def _int(raw) -> int | None:
    return raw if isinstance(raw, int) and not isinstance(raw, bool) else None


def _pci_bus_id(runtime, index: int, props: dict) -> str | None:
    """domain:bus:device.function, as cudaDeviceGetPCIBusId writes it; else made from the
    properties' PCI ids (function 0)."""
    try:
        return _text(runtime.deviceGetPCIBusId(index))
    except Exception:  # noqa: BLE001 - an older CuPy, or the driver refused: try the properties
        pass
    ids = [_int(props.get(k)) for k in ("pciDomainID", "pciBusID", "pciDeviceID")]
    if None in ids:
        return None
    return f"{ids[0]:04x}:{ids[1]:02x}:{ids[2]:02x}.0"


def describe(cp, index: int, environ=None) -> dict:
    """The `gpu` object of GPU `index` (the CUDA ordinal in this process) through CuPy module `cp`."""
    env = os.environ if environ is None else environ
    runtime = cp.cuda.runtime
    try:
        props = runtime.getDeviceProperties(index)
    except Exception:  # noqa: BLE001 - no properties: the fields that need them are null
        props = {}
    if not isinstance(props, dict):
        props = {}
    return {"index": index, "visible_devices": env.get("CUDA_VISIBLE_DEVICES"),
            "uuid": format_uuid(props.get("uuid")), "pci_bus_id": _pci_bus_id(runtime, index, props),
            "name": _text(props.get("name")), "total_memory_bytes": _int(props.get("totalGlobalMem"))}


def usage(gpu: dict) -> dict:
    """What Triton's GPU metrics report of the GPU `gpu` (`describe`'s), read now: `total_bytes` and
    `used_bytes` through NVML when nvidia-ml-py is installed, else CuPy's cudaMemGetInfo on that
    device (used = total - free, every process's allocations); `utilization` (0.0-1.0) only through
    NVML. A value that cannot be read is None (its sample is left out), never an error: a scrape
    must not fail because the driver refused one query."""
    out = {"uuid": gpu.get("uuid") or "", "utilization": None, "total_bytes": None, "used_bytes": None}
    nvml = _nvml_device(gpu.get("uuid"))
    if nvml is not None:
        lib, handle = nvml
        try:
            out["utilization"] = lib.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0
            mem = lib.nvmlDeviceGetMemoryInfo(handle)
            out["total_bytes"], out["used_bytes"] = int(mem.total), int(mem.used)
        except Exception:  # noqa: BLE001 - a query this driver does not answer
            pass
    if out["total_bytes"] is None:
        try:
            import cupy

            cupy.cuda.Device(gpu["index"]).use()  # (the scraping thread may be any thread)
            free, total = cupy.cuda.runtime.memGetInfo()
            out["total_bytes"], out["used_bytes"] = int(total), int(total) - int(free)
        except Exception:  # noqa: BLE001 - no CuPy, or the driver refused
            pass
    return out


def _nvml_device(uuid: str | None):
    """(pynvml, handle) of the GPU with this UUID, or None without nvidia-ml-py or NVML."""
    if not uuid:
        return None
    try:
        import pynvml

        _nvml_init(pynvml)
        return pynvml, pynvml.nvmlDeviceGetHandleByUUID(uuid)
    except Exception:  # noqa: BLE001 - not installed, no driver, unknown UUID
        return None


@functools.cache
def _nvml_init(pynvml) -> None:
    """nvmlInit once per process (NVML counts its initialisations; one that raised is tried again)."""
    pynvml.nvmlInit()
