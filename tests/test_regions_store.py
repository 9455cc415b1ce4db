"""`RegionStore`'s CUDA bookkeeping without a GPU, through a stand-in for the CuPy calls it makes
(cudaIpcOpenMemHandle and friends): a handle is opened once per process however many regions name
it, closed with the last of them, and every refusal leaves nothing open or registered. The real
thing runs in tests/gpu/test_cuda_regions_gpu.py."""

from __future__ import annotations

import base64
import types

import pytest
from segfuse.server import regions
from segfuse.server.errors import ApiError
from segfuse.server.regions import RegionStore


class FakeRuntime:
    def __init__(self):
        self.open: dict[int, bytes] = {}  # pointer -> handle
        self.device_of: dict[bytes, int] = {}
        self.calls: list[tuple] = []

    def ipcOpenMemHandle(self, handle: bytes) -> int:
        if handle.startswith(b"bad"):
            raise RuntimeError("cudaErrorInvalidResourceHandle: invalid resource handle")
        assert handle not in self.open.values(), "a handle opened twice in one process"
        ptr = 0x7000_0000 + 0x10_0000 * len(self.calls)
        self.open[ptr] = handle
        self.calls.append(("open", handle[:4]))
        return ptr

    def ipcCloseMemHandle(self, ptr: int) -> None:
        self.calls.append(("close", self.open.pop(ptr)[:4]))

    def pointerGetAttributes(self, ptr: int):
        return types.SimpleNamespace(device=self.device_of.get(self.open[ptr], 0))


@pytest.fixture
def gpu(monkeypatch):
    """(store, fake runtime, arrays): a store as on a cupy backend on GPU 0, allocations of 4096 bytes."""
    rt = FakeRuntime()
    arrays = types.SimpleNamespace(name="cupy", device_index=0, cp=types.SimpleNamespace(
        cuda=types.SimpleNamespace(runtime=rt)))
    monkeypatch.setattr(regions, "allocation_size", lambda ptr: 4096)
    monkeypatch.setattr(regions, "HANDLES", regions._OpenedHandles())
    return RegionStore(1 << 20), rt, arrays


def b64(tag: bytes) -> str:
    return base64.b64encode(tag.ljust(64, b"\0")).decode()


def refused(call, status: int, *words: str, loc: list | None = None) -> None:
    with pytest.raises(ApiError) as e:
        call()
    assert e.value.status == status and all(w in e.value.message for w in words), e.value.message
    if loc is not None:
        assert e.value.details[0]["loc"] == loc


def test_one_opening_per_handle(gpu):
    store, rt, arrays = gpu
    a = store.register_cuda("a", b64(b"h1"), 0, 1024, arrays)
    b = store.register_cuda("b", b64(b"h1"), 0, 4096, arrays)  # the same allocation, another name
    store.register_cuda("c", b64(b"h2"), 0, 64, arrays)
    assert a.mapping == b.mapping and rt.calls == [("open", b"h1\0\0"), ("open", b"h2\0\0")]
    assert [r.status() for r in store.all()] == [
        {"name": "a", "device_id": 0, "byte_size": 1024, "ref_count": 0},
        {"name": "b", "device_id": 0, "byte_size": 4096, "ref_count": 0},
        {"name": "c", "device_id": 0, "byte_size": 64, "ref_count": 0}]
    store.close(store.unregister("a", "cuda"), arrays)
    assert len(rt.open) == 2  # b still uses h1
    with store.pin(["b"]):
        refused(lambda: store.unregister("b", "cuda"), 400, "currently in use")
        idle, busy = store.unregister_all("cuda")
        assert [r.name for r in idle] == ["c"] and [r.name for r in busy] == ["b"]
        for r in idle:
            store.close(r, arrays)
        assert list(rt.open.values()) == [b"h1".ljust(64, b"\0")]
    store.close(store.unregister("b", "cuda"), arrays)
    assert rt.open == {} and store.all() == []


def test_refusals_leave_nothing_open(gpu):
    store, rt, arrays = gpu
    refused(lambda: store.register_cuda("x", b64(b"bad"), 0, 64, arrays), 400, "failed to open CUDA IPC handle",
            "invalid resource handle", loc=["body", "raw_handle", "b64"])
    refused(lambda: store.register_cuda("x", "not base64!", 0, 64, arrays), 400, "not valid base64")
    refused(lambda: store.register_cuda("x", base64.b64encode(b"short").decode(), 0, 64, arrays), 400, "5 bytes")
    refused(lambda: store.register_cuda("x", b64(b"h1"), 1, 64, arrays), 400, "not this server's GPU",
            loc=["body", "device_id"])
    refused(lambda: store.register_cuda("x", b64(b"h1"), 0, 4097, arrays), 400, "exceeds the 4096 bytes",
            loc=["body", "byte_size"])
    rt.device_of[b"h3".ljust(64, b"\0")] = 1  # the handle names memory on another GPU
    refused(lambda: store.register_cuda("x", b64(b"h3"), 0, 64, arrays), 400, "on GPU 1")
    refused(lambda: store.register_cuda("x", b64(b"h1"), 0, 2 << 20, arrays), 413, "limit of 1048576 bytes")
    store.register_cuda("x", b64(b"h1"), 0, 64, arrays)
    refused(lambda: store.register_cuda("x", b64(b"h4"), 0, 64, arrays), 400, "already registered")
    assert [r.name for r in store.all()] == ["x"] and list(rt.open.values()) == [b"h1".ljust(64, b"\0")]
    numpy_arrays = types.SimpleNamespace(name="numpy", device_index=0)
    refused(lambda: store.register_cuda("y", b64(b"h1"), 0, 64, numpy_arrays), 501, "no GPU")
