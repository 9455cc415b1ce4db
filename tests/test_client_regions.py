"""Shared-memory regions from the client side, against a server in its own process (so the memory
really crosses processes): segfuse's Client and AsyncClient (`SystemRegion`, `Region`, the
register/status/unregister methods), `segfuse regions ls|rm`, and tritonclient's own shared-memory
utilities and HTTP client, unchanged."""

from __future__ import annotations

import asyncio
import uuid

import numpy as np
import pytest
from helpers.graphs import MOE, counts_of
from helpers.processes import segfuse, server_process
from segfuse.client import AsyncClient, Client, ClientError, Region, SystemRegion
from segfuse.client._regions import _device_array, cuda_region

CHAIN_INPUTS = "abc"


@pytest.fixture(scope="module")
def server():
    with server_process() as url:
        with Client(url) as c:
            c.register(MOE)
            c.register(str(MOE).replace("moe_problem_sizes", "elementwise_chain"))
        yield url


@pytest.fixture
def client(server):
    with Client(server) as c:
        yield c
        c.unregister_system_shared_memory()


def new_key() -> str:
    return f"/sf_client_{uuid.uuid4().hex[:12]}"


def chain_oracle(a, b, c):
    return np.where(a > 0, a * b + c, np.exp(c) * np.float32(0.5))


def test_system_regions_with_the_sync_client(client):
    ids = np.random.default_rng(5).integers(0, 16, (64, 4))
    with SystemRegion.create(new_key(), ids.nbytes + 128) as shm:
        shm.array(ids.dtype, ids.shape)[...] = ids
        out = shm.array(np.int64, (16,), offset=ids.nbytes)
        out[...] = -1
        region = client.register_system_shared_memory("ids_shm", shm.key, shm.nbytes)
        assert region == Region("ids_shm", 0, shm.nbytes)
        res = client.run("moe_problem_sizes", inputs={"topk_ids": region.tensor(ids.dtype, ids.shape)},
                         outputs={"counts": Region("ids_shm", offset=ids.nbytes, byte_size=128)})
        assert res.regions == {"counts": "ids_shm"} and res.outputs == {}
        assert (out == counts_of(ids)).all()
        with pytest.raises(KeyError, match="written to shared memory region 'ids_shm'"):
            res["counts"]
        # a region input with the output returned as usual
        assert (client.run("moe_problem_sizes", inputs={"topk_ids": region.tensor(ids.dtype, ids.shape)})["counts"]
                == counts_of(ids)).all()
        [st] = client.get_system_shared_memory_status("ids_shm")
        assert st == {"name": "ids_shm", "key": shm.key, "offset": 0, "byte_size": shm.nbytes, "ref_count": 0}
        assert client.regions() == [{"kind": "system", **st}]
        with pytest.raises(ClientError) as e:
            client.register_system_shared_memory("ids_shm", shm.key, 8)
        assert e.value.status == 400 and "already registered" in e.value.message
        with pytest.raises(ClientError) as e:
            client.run("moe_problem_sizes", inputs={"topk_ids": Region("ids_shm", byte_size=8, dtype="int64", shape=(2, 2))})
        assert e.value.status == 400 and e.value.details[0]["loc"] == ["inputs", 0, "parameters", "shared_memory_byte_size"]
        assert client.unregister_system_shared_memory("ids_shm") == ["ids_shm"]
        with pytest.raises(ClientError) as e:
            client.get_system_shared_memory_status("ids_shm")
        assert e.value.status == 404
        del out
    assert client.get_cuda_shared_memory_status() == []


def test_region_arguments_are_checked_in_the_client(client):
    with pytest.raises(ClientError, match="needs a dtype and a shape"):
        client.run("moe_problem_sizes", inputs={"topk_ids": Region("r", byte_size=8)})
    with pytest.raises(ClientError, match="needs byte_size"):
        client.run("moe_problem_sizes", inputs={"topk_ids": np.zeros((1, 1), np.int64)}, outputs={"counts": Region("r")})
    with pytest.raises(ClientError, match="give byte_size"):
        client.register_system_shared_memory("r", "/k", None)
    with pytest.raises(ClientError, match="not a CUDA array"):
        cuda_region("r", np.zeros(4), None, None)
    with pytest.raises(ClientError, match="64 bytes"):
        cuda_region("r", b"\0" * 10, 0, 8)
    handle, device, region, nbytes = cuda_region("r", b"\1" * 64, None, 4096)
    assert device == 0 and region == Region("r", 0, 4096) and nbytes == 4096 and len(handle) == 88
    assert Region("r", 16).tensor("FP32", [2, 3]) == Region("r", 16, 24, np.dtype(np.float32), (2, 3))


class CudaLike:
    """What the client reads of a CUDA array: __cuda_array_interface__ (CuPy), or torch's attributes."""

    def __init__(self, host: np.ndarray, torch_like: bool = False):
        self.host = host
        if torch_like:
            self.is_cuda, self.shape = True, host.shape
            self.dtype = f"torch.{host.dtype}"
        else:
            self.__cuda_array_interface__ = {"shape": host.shape, "typestr": host.dtype.str, "version": 3,
                                             "data": (host.ctypes.data, False), "strides": None if
                                             host.flags.c_contiguous else host.strides}

    def data_ptr(self) -> int:
        return self.host.ctypes.data

    def is_contiguous(self) -> bool:
        return self.host.flags.c_contiguous


def test_device_arrays_are_read_by_protocol():
    import ml_dtypes

    a = np.zeros((4, 2), np.int64)
    assert _device_array("r", CudaLike(a)) == (a.ctypes.data, np.dtype(np.int64), (4, 2))
    b = np.zeros((3, 5), ml_dtypes.bfloat16)  # torch's bfloat16, which __cuda_array_interface__ cannot describe
    assert _device_array("r", CudaLike(b, torch_like=True))[1:] == (np.dtype(ml_dtypes.bfloat16), (3, 5))
    for torch_like in (False, True):
        with pytest.raises(ClientError, match="contiguous"):
            _device_array("r", CudaLike(a.T, torch_like))


def test_system_regions_with_the_async_client(server):
    rng = np.random.default_rng(7)
    a, b, c = rng.normal(size=(3, 256)).astype(np.float32)

    async def main():
        async with AsyncClient(server) as ac:
            with SystemRegion.create(new_key(), 4 * 256 * 4) as shm:
                for k, x in enumerate((a, b, c)):
                    shm.array(np.float32, (256,), offset=k * 1024)[...] = x
                region = await ac.register_system_shared_memory("abc_async", shm)  # byte_size from the object
                inputs = {n: region.tensor(np.float32, (256,), offset=k * 1024) for k, n in enumerate(CHAIN_INPUTS)}
                outs = [Region("abc_async", offset=3 * 1024, byte_size=1024)] * 4
                results = await asyncio.gather(*(ac.run("elementwise_chain", inputs=inputs, outputs={"out": o})
                                                 for o in outs))
                assert all(r.regions == {"out": "abc_async"} for r in results)
                np.testing.assert_allclose(shm.array(np.float32, (256,), offset=3 * 1024), chain_oracle(a, b, c),
                                           rtol=1e-6)
                assert [r["name"] for r in await ac.get_system_shared_memory_status()] == ["abc_async"]
                assert await ac.unregister_system_shared_memory() == ["abc_async"]
                assert await ac.regions() == []
                assert await ac.get_cuda_shared_memory_status() == []
                assert await ac.unregister_cuda_shared_memory() == []

    asyncio.run(main())


def test_cli_regions_ls_and_rm(server, client):
    with SystemRegion.create(new_key(), 64) as a, SystemRegion.create(new_key(), 32) as b:
        client.register_system_shared_memory("cli_a", a.key, 64)
        client.register_system_shared_memory("cli_b", b.key, 16, offset=16)
        out = segfuse("regions", "ls", server=server).stdout.splitlines()
        assert out[0].split()[:3] == ["cli_a", "system", "64"] and f"key {a.key} offset 0" in out[0]
        assert "in use by 0" in out[1] and f"key {b.key} offset 16" in out[1]
        import json

        assert [r["name"] for r in json.loads(segfuse("regions", "ls", "--json", server=server).stdout)] == ["cli_a", "cli_b"]
        assert segfuse("regions", "rm", "cli_a", server=server).stdout == "unregistered cli_a\n"
        r = segfuse("regions", "rm", "cli_a", server=server, check=2)
        assert "404" in r.stderr and "'cli_a' not found" in r.stderr
        assert "give region names or --all" in segfuse("regions", "rm", server=server, check=2).stderr
        assert segfuse("regions", "rm", "--all", server=server).stdout == "unregistered cli_b\n"
        assert segfuse("regions", "ls", server=server).stdout == "no regions\n"
    assert "example" in segfuse("regions", "--help").stdout and "example" in segfuse("regions", "rm", "--help").stdout


def test_tritonclient_system_shared_memory_unchanged(server):
    """tritonclient's own shm utilities and HTTP client, as its examples use them."""
    httpclient = pytest.importorskip("tritonclient.http")
    shm = pytest.importorskip("tritonclient.utils.shared_memory")
    from tritonclient.utils import InferenceServerException

    c = httpclient.InferenceServerClient(server.removeprefix("http://"))
    c.unregister_system_shared_memory()
    c.unregister_cuda_shared_memory()
    ids = np.random.default_rng(11).integers(0, 16, (128, 8)).astype(np.int64)
    ikey, okey = new_key(), new_key()
    h_in = shm.create_shared_memory_region("input_data", ikey, ids.nbytes)
    h_out = shm.create_shared_memory_region("output_data", okey, 256)
    try:
        shm.set_shared_memory_region(h_in, [ids])
        c.register_system_shared_memory("input_data", ikey, ids.nbytes)
        c.register_system_shared_memory("output_data", okey, 256)
        status = c.get_system_shared_memory_status()
        assert [(s["name"], s["key"], int(s["byte_size"])) for s in status] == [
            ("input_data", ikey, ids.nbytes), ("output_data", okey, 256)]
        assert c.get_system_shared_memory_status("output_data")[0]["name"] == "output_data"
        inp = httpclient.InferInput("topk_ids", list(ids.shape), "INT64")
        inp.set_shared_memory("input_data", ids.nbytes)
        out = httpclient.InferRequestedOutput("counts", binary_data=True)
        out.set_shared_memory("output_data", 128, offset=128)
        result = c.infer("moe_problem_sizes", [inp], outputs=[out])
        entry = result.get_output("counts")
        assert entry["parameters"]["shared_memory_region"] == "output_data" and "data" not in entry
        assert (shm.get_contents_as_numpy(h_out, np.int64, [16], offset=128) == counts_of(ids)).all()
        with pytest.raises(InferenceServerException) as e:  # a mismatched size, as Triton refuses it
            bad = httpclient.InferInput("topk_ids", [1, 8], "INT64")
            bad.set_shared_memory("input_data", ids.nbytes)
            c.infer("moe_problem_sizes", [bad])
        assert e.value.status() == "400" or e.value.status() == 400
        with pytest.raises(InferenceServerException):
            c.get_system_shared_memory_status("nope")
        with pytest.raises(InferenceServerException):
            c.register_cuda_shared_memory("gpu", "A" * 88, 0, 64)  # this server has no GPU
        c.unregister_system_shared_memory("input_data")
        assert [s["name"] for s in c.get_system_shared_memory_status()] == ["output_data"]
        c.unregister_system_shared_memory()
        assert c.get_system_shared_memory_status() == []
    finally:
        shm.destroy_shared_memory_region(h_in)
        shm.destroy_shared_memory_region(h_out)
        c.close()
