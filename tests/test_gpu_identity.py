"""Which shard and GPU serve a request (issue 19), without a GPU: `GET /v2`'s `shard` and `gpu`, the
`segfuse_gpu_info` metric, and the device a server pins on every thread it works on.

The GPU is the CuPy stand-in's (tests/cupy_standin.py `Devices`: fake device properties, PCI bus
ids and each thread's current device). Oracles: Python's uuid module for NVIDIA's UUID form, the
fake properties themselves, prometheus_client's parser, and the NumPy interpreter (`run_graph`)
for a run on the CUDA runtime's stand-in."""

from __future__ import annotations

import json
import sys
import threading
import uuid

import numpy as np
import pytest
from cupy_standin import Array, Devices, cupy_module
from helpers.graphs import ELEMENTWISE_CHAIN
from prometheus_client.parser import text_string_to_metric_families
from segfuse.compiler import Engine, Fusion, run_graph
from segfuse.compiler.cuda import arrays as cuda_arrays
from segfuse.scaleout import metrics as scaleout_metrics
from segfuse.server import array_backends as backend_mod
from segfuse.server import gpu_info
from segfuse.server import state as state_mod
from standin_kernels import StandinGPU

UUIDS = [bytes(range(16)), bytes(range(0xF0, 0x100))]
PROPS = [{"name": b"NVIDIA H200", "uuid": UUIDS[0], "totalGlobalMem": 150_011_101_184,
          "pciDomainID": 0, "pciBusID": 0x19, "pciDeviceID": 0},
         {"name": b"NVIDIA H200 NVL\0\0\0", "uuid": UUIDS[1], "totalGlobalMem": 143_771_000_832,
          "pciDomainID": 0, "pciBusID": 0x3B, "pciDeviceID": 0}]
BUS_IDS = ["0000:19:00.0", "0000:3B:00.0"]


def nvidia_uuid(raw: bytes) -> str:
    return "GPU-" + str(uuid.UUID(bytes=raw))


def _expected(i: int, visible) -> dict:
    return {"index": i, "visible_devices": visible, "uuid": nvidia_uuid(UUIDS[i]), "pci_bus_id": BUS_IDS[i],
            "name": PROPS[i]["name"].rstrip(b"\0").decode(), "total_memory_bytes": PROPS[i]["totalGlobalMem"]}


def test_describe_reads_every_field_from_the_properties():
    cp = cupy_module(Devices(PROPS, BUS_IDS))
    for i in (0, 1):
        assert gpu_info.describe(cp, i, {"CUDA_VISIBLE_DEVICES": "4,5"}) == _expected(i, "4,5")
    assert gpu_info.describe(cp, 1, {})["visible_devices"] is None
    assert set(gpu_info.describe(cp, 0, {})) == set(gpu_info.FIELDS)


def test_a_field_the_driver_does_not_report_is_null_never_an_error():
    # no uuid, no name, a memory size of the wrong type; no PCI bus id call: made from the PCI ids
    cp = cupy_module(Devices([{"totalGlobalMem": "?", "pciDomainID": 1, "pciBusID": 0xAB, "pciDeviceID": 3}], [None]))
    assert gpu_info.describe(cp, 0, {}) == {"index": 0, "visible_devices": None, "uuid": None,
                                            "pci_bus_id": "0001:ab:03.0", "name": None, "total_memory_bytes": None}
    cp = cupy_module(Devices([{}], [None]))  # nothing at all
    assert gpu_info.describe(cp, 0, {})["pci_bus_id"] is None

    def refuse(i):
        raise RuntimeError("cudaErrorInvalidDevice")

    cp.cuda.runtime.getDeviceProperties = refuse
    assert gpu_info.describe(cp, 0, {}) == {"index": 0, **{k: None for k in gpu_info.FIELDS[1:]}}
    assert gpu_info.format_uuid(b"short") is None and gpu_info.format_uuid(7) is None
    assert gpu_info.format_uuid(nvidia_uuid(UUIDS[0])) == nvidia_uuid(UUIDS[0])


def _gpu_info_samples(text: str) -> list:
    return [s for f in text_string_to_metric_families(text) for s in f.samples if s.name == "segfuse_gpu_info"]


@pytest.mark.anyio
async def test_numpy_backend_has_no_shard_and_no_gpu(asgi_server):
    async with asgi_server() as c:
        meta = (await c.get("/v2")).json()
        assert meta["backend"] == "numpy" and meta["shard"] is None and meta["gpu"] is None
        text = (await c.get("/metrics")).text
        assert "# TYPE segfuse_gpu_info gauge" in text and _gpu_info_samples(text) == []


@pytest.fixture
def standin_gpus(monkeypatch):
    """The server's CuPy backend on the stand-in's two GPUs (the engine is NumPy's: nothing runs on
    them here); CUDA_VISIBLE_DEVICES as a Ray replica's would be."""
    devices = Devices(PROPS, BUS_IDS)
    monkeypatch.setitem(sys.modules, "cupy", cupy_module(devices))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "6,7")

    def resolve(backend, device, cache_dir):
        return backend_mod.make_engine("numpy"), backend_mod.CupyArrayBackend(device)

    monkeypatch.setattr(state_mod, "resolve", resolve)
    return devices


@pytest.mark.anyio
async def test_cupy_backend_says_which_gpu_and_pins_it_on_every_thread(asgi_server, standin_gpus):
    devices = standin_gpus
    async with asgi_server(device=1, run_workers=2) as c:
        meta = (await c.get("/v2")).json()
        assert (meta["backend"], meta["device"], meta["shard"]) == ("cupy", "cuda:1", None)
        assert meta["gpu"] == _expected(1, "6,7")
        [s] = _gpu_info_samples((await c.get("/metrics")).text)
        assert s.value == 1 and s.labels == {"shard": "", "gpu_uuid": nvidia_uuid(UUIDS[1]), "pci_bus_id": BUS_IDS[1],
                                             "name": "NVIDIA H200 NVL", "visible_devices": "6,7"}
        rt = c.app.state.server_state
        # device 1 current on the run workers, the event loop's thread, the planning helpers and
        # the transfer helpers (each asked on the thread itself)
        assert devices.selected["segfuse-run-0"] == devices.selected["segfuse-run-1"] == 1
        assert devices.current() == 1
        assert await rt.executor.call(devices.current) == 1
        assert {await rt.on_device(devices.current) for _ in range(4)} == {1}


@pytest.fixture
async def gpu_shard(standin_gpus):
    """Shard shard-3 (scaleout/shard.py, without Ray) on the stand-in GPUs."""
    from segfuse.scaleout.shard import ShardApp

    shard = ShardApp("shard-3", {"backend": "numpy"})
    await shard.start()
    yield shard
    await shard.stop()


@pytest.mark.anyio
async def test_a_shard_names_itself_in_v2_and_its_gpu_metric(gpu_shard):
    status, _, body = await gpu_shard.answer(("GET", b"/v2", b"", [(b"segfuse-namespace", b"team-a")], b""))
    meta = json.loads(body)
    assert status == 200 and meta["shard"] == "shard-3" and meta["gpu"] == _expected(0, "6,7")
    status, _, text = await gpu_shard.answer(("GET", b"/metrics", b"", [], b""))
    samples = _gpu_info_samples(text.decode())
    # one per namespace's runtime, the shard label once (the shard's own), the namespace added
    assert sorted(s.labels["namespace"] for s in samples) == ["default", "team-a"]
    assert all(s.labels["shard"] == "shard-3" and s.labels["gpu_uuid"] == nvidia_uuid(UUIDS[0]) for s in samples)
    assert all(ln.count(b"shard=") == 1 for ln in text.splitlines() if ln.startswith(b"segfuse_gpu_info{"))


def test_merge_adds_only_labels_a_sample_lacks():
    text = (b'# TYPE segfuse_gpu_info gauge\nsegfuse_gpu_info{shard="shard-1",name="a,b=\\"c\\""} 1.0\n'
            b'# TYPE segfuse_buffers gauge\nsegfuse_buffers 2.0\n')
    merged = scaleout_metrics.merge([({"shard": "shard-1", "namespace": "n"}, text)]).decode()
    got = {s.name: s.labels for f in text_string_to_metric_families(merged) for s in f.samples}
    assert got == {"segfuse_gpu_info": {"namespace": "n", "shard": "shard-1", "name": 'a,b="c"'},
                   "segfuse_buffers": {"shard": "shard-1", "namespace": "n"}}
    assert merged.count('shard="shard-1"') == 2


def test_the_cuda_runtime_selects_its_device_on_a_new_thread(monkeypatch):
    """A run on a thread that never selected a device (CUDA's default: 0) makes the runtime's
    device (1) current before its stream and buffers are made: every stream and allocation of the
    run is on device 1, and the results are the NumPy interpreter's."""
    gpu = StandinGPU()
    gpu.record_generate(monkeypatch)
    monkeypatch.setattr(cuda_arrays, "_ND", [Array])
    devices = Devices(PROPS, BUS_IDS)
    devices.install(gpu.cp)
    made: list = []  # (thread, device current) of every stream and allocation
    cuda, empty, zeros = gpu.cp.cuda, gpu.cp.empty, gpu.cp.zeros

    def noted(make):
        def call(*a, **k):
            made.append((threading.current_thread().name, devices.current()))
            return make(*a, **k)
        return call

    stream = cuda.Stream
    cuda.Stream, gpu.cp.empty, gpu.cp.zeros = noted(stream), noted(empty), noted(zeros)
    rt = gpu.runtime()
    rt.device_index = 1
    f = Fusion.from_json(ELEMENTWISE_CHAIN)
    rng = np.random.default_rng(19)
    ins = {n: rng.standard_normal(64).astype(np.float32) for n in "abc"}
    plan = Engine("numpy").plan(f, {k: v.shape for k, v in ins.items()})
    out = {}
    t = threading.Thread(target=lambda: out.update(rt.run(f, {k: v.view(Array) for k, v in ins.items()}, plan)[0]),
                         name="not-main")
    t.start()
    t.join()
    np.testing.assert_allclose(np.array(out["out"]), run_graph(f, ins)["out"], rtol=1e-6)
    on_thread = [d for name, d in made if name == "not-main"]
    assert on_thread and set(on_thread) == {1}
    assert devices.selected == {"not-main": 1}
