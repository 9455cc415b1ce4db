"""Which GPU a server runs on, as `GET /v2` (`gpu`) and the `segfuse_gpu_info` metric say: read once
when the backend starts, through CuPy's runtime API (`getDeviceProperties`, `deviceGetPCIBusId`).

Inside a shard placed by Ray, Ray sets CUDA_VISIBLE_DEVICES to the replica's GPU, so its CUDA ordinal is
always 0: the UUID and the PCI bus id are what name the physical GPU. Each field is read on its own;
one this CuPy or driver does not report is None (null), never an error.
"""

from __future__ import annotations

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
