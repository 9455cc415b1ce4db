"""`GET /v2`'s `gpu` and `segfuse_gpu_info` on a real GPU (issue 19): the UUID, PCI bus id, name and
memory the server reports for its device are what torch.cuda reports for that device (an
independent reader of the driver), and the PCI bus id is CuPy's `Device.pci_bus_id`; a run on a
server pinned to the last visible GPU leaves its result on that GPU."""

from __future__ import annotations

import os

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

cp = pytest.importorskip("cupy")
pytestmark = [pytest.mark.gpu, pytest.mark.anyio]
COUNT = cp.cuda.runtime.getDeviceCount() if cp.cuda.is_available() else 0
DEVICES = list(range(min(COUNT, 2)))


def _torch_props(i: int):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    return torch.cuda.get_device_properties(i)


def _pci(text: str) -> tuple[int, int, int]:
    """(domain, bus, device) of 'dddd:bb:dd.f' (hex, any case)."""
    domain, bus, rest = text.split(":")
    return int(domain, 16), int(bus, 16), int(rest.split(".")[0], 16)


@pytest.mark.parametrize("device", DEVICES)
async def test_v2_names_the_gpu_torch_sees(asgi_server, device):
    async with asgi_server(backend="cupy", device=device) as c:
        meta = (await c.get("/v2")).json()
        metrics = (await c.get("/metrics")).text
    gpu = meta["gpu"]
    assert meta["device"] == f"cuda:{device}" and gpu["index"] == device and meta["shard"] is None
    assert gpu["visible_devices"] == os.environ.get("CUDA_VISIBLE_DEVICES")
    assert _pci(gpu["pci_bus_id"]) == _pci(cp.cuda.Device(device).pci_bus_id)
    props = _torch_props(device)
    assert gpu["uuid"].lower() == "gpu-" + str(props.uuid).lower().removeprefix("gpu-")
    assert gpu["name"] == props.name and gpu["total_memory_bytes"] == props.total_memory
    if hasattr(props, "pci_bus_id"):  # torch >= 2.3
        assert _pci(gpu["pci_bus_id"]) == (props.pci_domain_id, props.pci_bus_id, props.pci_device_id)
    [s] = [s for f in text_string_to_metric_families(metrics) for s in f.samples if s.name == "segfuse_gpu_info"]
    assert s.value == 1 and (s.labels["gpu_uuid"], s.labels["pci_bus_id"]) == (gpu["uuid"], gpu["pci_bus_id"])


async def test_a_server_on_the_last_gpu_keeps_its_buffers_there(asgi_server, moe_graph):
    """A server on the last visible GPU: an uploaded buffer and a run's stored output are on that
    device (CuPy's memory pool of that device allocated them), and the counts are np.bincount's."""
    device = COUNT - 1
    ids = np.random.default_rng(19).integers(0, 16, (64, 4))
    async with asgi_server(backend="cupy", device=device) as c:
        assert (await c.post("/v2/fusions", json=moe_graph)).status_code == 201
        r = await c.put("/v2/buffers/ids", json={"dtype": "int64", "shape": list(ids.shape), "data": ids.tolist()})
        assert r.status_code == 201, r.text
        body = {"inputs": [{"name": "topk_ids", "parameters": {"buffer": "ids"}}],
                "outputs": [{"name": "counts", "parameters": {"buffer": "counts"}}]}
        r = await c.post("/v2/models/moe_problem_sizes/infer", json=body)
        assert r.status_code == 200, r.text
        store = c.app.state.server_state.store
        for name in ("ids", "counts"):
            assert store.get(name).array.device.id == device, name
        got = (await c.get("/v2/buffers/counts", headers={"Accept": "application/json"})).json()
    assert got["data"] == np.bincount(ids.ravel(), minlength=16).tolist()
