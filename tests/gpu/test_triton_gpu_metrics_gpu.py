"""Triton's GPU metric families on a real GPU: `nv_gpu_memory_total_bytes` of the server's GPU (by its
UUID, as `GET /v2` names it) is what torch.cuda reports for that device (an independent reader of the
driver; NVML's own total where nvidia-ml-py is installed, which counts memory CUDA reserves), the used
bytes grow by at least a buffer stored on it, and `nv_gpu_utilization`, with nvidia-ml-py, is a rate
in [0, 1]."""

from __future__ import annotations

import numpy as np
import pytest
from helpers.service import put_raw
from prometheus_client.parser import text_string_to_metric_families

cp = pytest.importorskip("cupy")
pytestmark = [pytest.mark.gpu, pytest.mark.anyio]


def _gpu_samples(text: str) -> dict:
    return {f.name: {s.labels["gpu_uuid"]: s.value for s in f.samples}
            for f in text_string_to_metric_families(text) if f.name.startswith("nv_gpu_")}


async def test_gpu_families_report_the_servers_gpu(asgi_server):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA GPU")
    async with asgi_server(backend="cupy", device=0) as c:
        uuid = (await c.get("/v2")).json()["gpu"]["uuid"]
        before = _gpu_samples((await c.get("/metrics")).text)
        data = np.zeros(1 << 26, np.uint8)  # 64 MiB held by the server's buffer store on the GPU
        assert (await put_raw(c, "big", data)).status_code == 201
        after = _gpu_samples((await c.get("/metrics")).text)
    try:
        import pynvml
    except ImportError:
        pynvml = None
    if pynvml is None:
        want = torch.cuda.get_device_properties(0).total_memory
        assert "nv_gpu_utilization" not in after
    else:
        pynvml.nvmlInit()
        want = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByUUID(uuid)).total
        assert 0.0 <= after["nv_gpu_utilization"][uuid] <= 1.0
    assert after["nv_gpu_memory_total_bytes"] == {uuid: float(want)}
    total, used = after["nv_gpu_memory_total_bytes"][uuid], after["nv_gpu_memory_used_bytes"][uuid]
    assert 0 < used <= total
    assert used - before["nv_gpu_memory_used_bytes"][uuid] >= data.nbytes * 0.9  # (other processes may free)
