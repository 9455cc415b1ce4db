"""The client process of tests/gpu/test_cuda_regions_gpu.py (CUDA IPC needs two processes: a handle
cannot be opened by the process that made it).

    python cuda_regions_child.py URL SCENARIO

It allocates CuPy arrays and torch CUDA tensors (torch only where torch sees the GPU), registers
them as CUDA regions with the segfuse server at URL, and checks what the server wrote in its own
memory against NumPy. It prints one JSON object per line; any failed check raises (exit status 1,
traceback on stderr). Scenarios:

- `moe`: the four MoE fusions of examples/ chained through regions (ids in, counts out, counts in
  again, offsets and permutations out), at two sizes;
- `bad`: a garbage handle, a wrong device id, a size beyond the allocation (each a 400), then a
  good registration and run;
- `hold`: registers ids and counts, says so, and waits for "check" on stdin (the test runs a
  gated run meanwhile), checks the counts, then waits for "exit";
- `grpc ADDRESS`: the same regions through Triton's own gRPC client (tritonclient.grpc) at the
  server's gRPC ADDRESS: registration, status, runs with inputs and outputs in regions (one at an
  offset into its allocation), unregistration.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import cupy as cp
import numpy as np
from segfuse.client import Client, ClientError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
E, K = 16, 4


def say(**kw) -> None:
    print(json.dumps(kw), flush=True)


def torch_cuda():
    """torch, when it is installed and sees the GPU, else None (the CuPy half still runs)."""
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def sync(torch) -> None:
    cp.cuda.Device().synchronize()
    if torch is not None:
        torch.cuda.synchronize()


def host(a) -> np.ndarray:
    return a.cpu().numpy() if hasattr(a, "cpu") else cp.asnumpy(a)


def oracle(ids: np.ndarray) -> dict[str, np.ndarray]:
    """The four fusions in NumPy, written independently of the graphs."""
    counts = np.bincount(ids.reshape(-1), minlength=E)
    order = np.argsort(-ids.reshape(-1), kind="stable")
    out_perm = np.empty_like(order)
    out_perm[order] = np.arange(order.size)
    return {"counts": counts, "expert_offsets": np.concatenate([[0], np.cumsum(counts)]),
            "blockscale_offsets": np.concatenate([[0], np.cumsum((counts + 127) // 128 * 128)]),
            "input_permutation": order // K, "output_permutation": out_perm}


def register_examples(c: Client) -> None:
    for name in ("moe_problem_sizes", "moe_expert_offsets", "moe_blockscale_offsets", "moe_argsort"):
        c.register(str(EXAMPLES / f"{name}.json"))


def scenario_moe(c: Client) -> None:
    torch = torch_cuda()
    register_examples(c)
    for T in (7, 4096):
        ids_host = np.random.default_rng(T).integers(0, E, (T, K)).astype(np.int64)
        # ids and one permutation in torch tensors (when torch sees the GPU), the rest in CuPy
        ids = torch.tensor(ids_host, device="cuda") if torch else cp.asarray(ids_host)
        perm_in = torch.full((T * K,), -1, dtype=torch.int64, device="cuda") if torch else cp.full(T * K, -1, cp.int64)
        perm_out = cp.full(T * K, -1, cp.int64)
        # small outputs as slices of one CuPy array: one allocation, one handle, four regions at offsets
        arena = cp.full(256, -1, cp.int64)
        counts, eo, bs_eo, bs = arena[0:E], arena[32:32 + E + 1], arena[64:64 + E + 1], arena[128:128 + E + 1]
        sync(torch)
        r = {name: c.register_cuda_shared_memory(f"{name}_{T}", t) for name, t in (
            ("ids", ids), ("counts", counts), ("eo", eo), ("bs_eo", bs_eo), ("bs", bs), ("perm_in", perm_in),
            ("perm_out", perm_out))}
        assert r["eo"].offset == r["counts"].offset + 32 * 8, r  # the same allocation, addressed by offset
        status = {s["name"]: s for s in c.get_cuda_shared_memory_status()}
        assert status[f"counts_{T}"]["byte_size"] == r["counts"].offset + E * 8, status
        c.run("moe_problem_sizes", inputs={"topk_ids": r["ids"]}, outputs={"counts": r["counts"]})
        c.run("moe_expert_offsets", inputs={"tokens_per_expert": r["counts"]}, outputs={"expert_offsets": r["eo"]})
        res = c.run("moe_blockscale_offsets", inputs={"tokens_per_expert": r["counts"]},
                    outputs={"expert_offsets": r["bs_eo"], "blockscale_offsets": r["bs"]})
        assert res.regions == {"expert_offsets": f"bs_eo_{T}", "blockscale_offsets": f"bs_{T}"}, res.regions
        c.run("moe_argsort", inputs={"topk_ids": r["ids"]},
              outputs={"input_permutation": r["perm_in"], "output_permutation": r["perm_out"]})
        sync(torch)
        want = oracle(ids_host)
        for name, got in (("counts", counts), ("expert_offsets", eo), ("expert_offsets", bs_eo),
                          ("blockscale_offsets", bs), ("input_permutation", perm_in),
                          ("output_permutation", perm_out)):
            assert (host(got) == want[name]).all(), (T, name, host(got), want[name])
        rest = host(arena)
        assert (rest[E:32] == -1).all() and (rest[32 + E + 1:64] == -1).all() and (rest[128 + E + 1:] == -1).all()
        assert (host(ids) == ids_host).all()  # inputs are read, never written
        assert sorted(c.unregister_cuda_shared_memory()) == sorted(f"{n}_{T}" for n in r)
        say(T=T, ok=True, torch=torch is not None)


def expect_400(call, *words) -> None:
    try:
        call()
    except ClientError as e:
        assert e.status == 400 and all(w in e.message for w in words), (e.status, e.message)
        return
    raise AssertionError(f"no error; expected 400 with {words}")


def scenario_bad(c: Client) -> None:
    register_examples(c)
    device = cp.cuda.Device().id
    expect_400(lambda: c.register_cuda_shared_memory("garbage", os.urandom(64), device_id=device, byte_size=64),
               "failed to open CUDA IPC handle")
    mem = cp.cuda.Memory(1 << 20)  # a plain cudaMalloc of 1 MiB
    handle = bytes(cp.cuda.runtime.ipcGetMemHandle(mem.ptr))
    expect_400(lambda: c.register_cuda_shared_memory("wrong_gpu", handle, device_id=device + 1, byte_size=64),
               "not this server's GPU")
    expect_400(lambda: c.register_cuda_shared_memory("too_big", handle, device_id=device, byte_size=64 << 20),
               "exceeds the", "allocation")
    assert c.get_cuda_shared_memory_status() == []
    # the server's context is still good: a real registration of that memory, and a run on it
    ids_host = np.random.default_rng(1).integers(0, E, (64, K)).astype(np.int64)
    ids = cp.ndarray(ids_host.shape, cp.int64, memptr=cp.cuda.MemoryPointer(mem, 0))
    ids.set(ids_host)
    counts = cp.full(E, -1, cp.int64)
    sync(None)
    region = c.register_cuda_shared_memory("good_ids", ids)
    assert region.offset == 0 and region.byte_size == ids_host.nbytes
    c.run("moe_problem_sizes", inputs={"topk_ids": region},
          outputs={"counts": c.register_cuda_shared_memory("good_counts", counts)})
    sync(None)
    assert (cp.asnumpy(counts) == oracle(ids_host)["counts"]).all()
    expect_400(lambda: c.run("moe_problem_sizes", inputs={"topk_ids": region.tensor(np.int64, (63, K), offset=4)}),
               "item size")
    assert sorted(c.unregister_cuda_shared_memory()) == ["good_counts", "good_ids"]
    say(ok=True)


def scenario_hold(c: Client) -> None:
    torch = torch_cuda()
    register_examples(c)
    ids_host = np.random.default_rng(2).integers(0, E, (512, K)).astype(np.int64)
    ids = cp.asarray(ids_host)
    counts = torch.full((E,), -1, dtype=torch.int64, device="cuda") if torch else cp.full(E, -1, cp.int64)
    sync(torch)
    r_ids = c.register_cuda_shared_memory("hold_ids", ids)
    r_counts = c.register_cuda_shared_memory("hold_counts", counts)
    say(ready=True, ids={"offset": r_ids.offset, "byte_size": r_ids.byte_size, "shape": list(ids_host.shape)},
        counts={"offset": r_counts.offset, "byte_size": r_counts.byte_size})
    assert sys.stdin.readline().strip() == "check"
    sync(torch)
    assert (host(counts) == oracle(ids_host)["counts"]).all(), host(counts)
    say(ok=True)
    assert sys.stdin.readline().strip() == "exit"


def grpc_infer(g, model: str, ids_host: np.ndarray, outputs: list[tuple[str, int, int]]) -> None:
    """A run over gRPC with topk_ids in region g_ids (at offset 256) and each output (name, offset,
    byte size) in region g_out."""
    import tritonclient.grpc as grpcclient

    x = grpcclient.InferInput("topk_ids", list(ids_host.shape), "INT64")
    x.set_shared_memory("g_ids", ids_host.nbytes, offset=256)
    wanted = []
    for name, offset, size in outputs:
        o = grpcclient.InferRequestedOutput(name)
        o.set_shared_memory("g_out", size, offset=offset)
        wanted.append(o)
    result = g.infer(model, [x], outputs=wanted)
    # the data is in the region: an empty raw content per output (as Triton answers)
    assert [len(b) for b in result.get_response().raw_output_contents] == [0] * len(outputs)
    for name, _, _ in outputs:  # the answer names the region (segfuse's addition; docs/http-api.md)
        assert result.get_output(name).parameters["shared_memory_region"].string_param == "g_out"


def scenario_grpc(c: Client, address: str) -> None:
    import base64

    import tritonclient.grpc as grpcclient

    register_examples(c)
    device = cp.cuda.Device().id
    g = grpcclient.InferenceServerClient(address)
    for T in (5, 3000):
        ids_host = np.random.default_rng(T).integers(0, E, (T, K)).astype(np.int64)
        # plain cudaMalloc allocations (a handle names a whole allocation): ids at an offset of 256 bytes
        ids_mem, out_mem = cp.cuda.Memory(256 + ids_host.nbytes), cp.cuda.Memory(E * 8 + 2 * T * K * 8)
        ids = cp.ndarray(ids_host.shape, cp.int64, memptr=cp.cuda.MemoryPointer(ids_mem, 256))
        ids.set(ids_host)
        outs = cp.ndarray(E + 2 * T * K, cp.int64, memptr=cp.cuda.MemoryPointer(out_mem, 0))
        outs.fill(-1)
        sync(None)
        for name, mem in (("g_ids", ids_mem), ("g_out", out_mem)):
            handle = base64.b64encode(bytes(cp.cuda.runtime.ipcGetMemHandle(mem.ptr)))
            g.register_cuda_shared_memory(name, handle, device, mem.size)
        status = g.get_cuda_shared_memory_status(as_json=True)["regions"]
        assert {k: int(v["byte_size"]) for k, v in status.items()} == {"g_ids": ids_mem.size, "g_out": out_mem.size}

        grpc_infer(g, "moe_problem_sizes", ids_host, [("counts", 0, E * 8)])
        grpc_infer(g, "moe_argsort", ids_host, [("input_permutation", E * 8, T * K * 8),
                                                ("output_permutation", E * 8 + T * K * 8, T * K * 8)])
        sync(None)
        want, got = oracle(ids_host), cp.asnumpy(outs)
        assert (got[:E] == want["counts"]).all(), (T, got[:E])
        assert (got[E:E + T * K] == want["input_permutation"]).all(), T
        assert (got[E + T * K:] == want["output_permutation"]).all(), T
        assert (cp.asnumpy(ids) == ids_host).all()  # inputs are read, never written
        g.unregister_cuda_shared_memory("g_ids")
        assert list(g.get_cuda_shared_memory_status(as_json=True).get("regions", {})) == ["g_out"]
        g.unregister_cuda_shared_memory()
        assert g.get_cuda_shared_memory_status(as_json=True).get("regions", {}) == {}
        say(T=T, ok=True)
    g.close()


if __name__ == "__main__":
    url, scenario = sys.argv[1], sys.argv[2]
    with Client(url) as client:
        if scenario == "grpc":
            scenario_grpc(client, sys.argv[3])
        else:
            {"moe": scenario_moe, "bad": scenario_bad, "hold": scenario_hold}[scenario](client)
