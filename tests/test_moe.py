"""The four MoE gate fusions of nvFuser's tests/cpp/test_moe.cpp (SgLangMoETest), from the
example JSON files and from the FusionDefinition builder, against their PyTorch references.

Sizes: nvFuser's (E=16, T in {32, 1}, K in {4, 1}, int64) and larger ones (T=4096, K=8, E=256),
plus int32 ids/counts (SGLang's dtype) made by editing the graph's dict.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers.waiting import scaled
from segfuse.compiler import Engine, Fusion, load_fusion, run_graph

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


def _load_builder():
    spec = importlib.util.spec_from_file_location("moe_builder", EXAMPLES / "moe_builder.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


B = _load_builder()


def example(name: str) -> dict:
    return json.loads((EXAMPLES / f"{name}.json").read_text())


# ---- configurations ---------------------------------------------------------------------
NVFUSER = [(16, t, k) for t in (32, 1) for k in (4, 1)]  # (E, T, K) as in test_moe.cpp
LARGE = [(256, 4096, 8)]
CONFIGS = [(e, t, k, "int64") for e, t, k in NVFUSER + LARGE] + [(e, t, k, "int32") for e, t, k in
                                                                  [(16, 32, 4), (16, 1, 1), (256, 4096, 8)]]
IDS = [f"E{e}_T{t}_K{k}_{dt}" for e, t, k, dt in CONFIGS]

TORCH_DT = {"int64": torch.int64, "int32": torch.int32}


def with_input_dtype(d: dict, dtype: str) -> dict:
    """The graph with every input's dtype replaced (the int32 variants)."""
    d = copy.deepcopy(d)
    for i in d["inputs"]:
        i["dtype"] = dtype
    return d


def problem_sizes_graph(E: int) -> dict:
    """The example for E (16 and 256 are files); another E by editing the dict."""
    if E == 16:
        return example("moe_problem_sizes")
    if E == 256:
        return example("moe_problem_sizes_e256")
    d = copy.deepcopy(example("moe_problem_sizes"))
    (full,) = [o for o in d["ops"] if o["op"] == "full"]
    full["shape"] = [E]
    return d


def argsort_graph(K: int) -> dict:
    """moe_argsort.json has topk=4 as a literal; other topk values by editing the dict."""
    d = copy.deepcopy(example("moe_argsort"))
    if K == 4:
        return d
    d["inputs"][0]["shape"] = ["T", K]
    for o in d["ops"]:
        if o["op"] == "floor_divide":
            assert o["inputs"][1] == 4
            o["inputs"][1] = K
        if o["op"] == "full":
            o["shape"] = [f"T*{K}"]
        if o["op"] == "iota":
            o["length"] = f"T*{K}"
    return d


def run_both(graph: dict, inputs: dict) -> dict:
    """Run with the interpreter and with the Engine; they must agree exactly."""
    f = Fusion.from_json(graph)
    a = run_graph(f, {k: v.copy() for k, v in inputs.items()})
    b = Engine().run(Fusion.from_json(graph), {k: v.copy() for k, v in inputs.items()}).outputs
    assert set(a) == set(b) == {o if isinstance(o, str) else o["name"] for o in graph["outputs"]}
    for k in a:
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]), err_msg=k)
        assert np.asarray(a[k]).dtype == np.asarray(b[k]).dtype
    return a


def assert_same(out, ref: torch.Tensor):
    out = np.asarray(out)
    assert out.dtype == ref.numpy().dtype, (out.dtype, ref.dtype)
    assert out.shape == tuple(ref.shape)
    np.testing.assert_array_equal(out, ref.numpy())


# ---- builder and JSON are the same graphs ---------------------------------------------------
@pytest.mark.parametrize("name", sorted(B.FUSIONS))
def test_builder_matches_json_file(name):
    built = B.FUSIONS[name]().to_dict()
    assert built == example(name)
    # the same text, and the same content id once validated
    assert B.format_graph(built) == (EXAMPLES / f"{name}.json").read_text()
    assert Fusion.from_json(built).id == load_fusion(str(EXAMPLES / f"{name}.json")).id


@pytest.mark.parametrize("K", [1, 4, 8])
def test_argsort_dict_edit_matches_builder(K):
    assert argsort_graph(K) == B.argsort(K).to_dict()


@pytest.mark.parametrize("E", [16, 256, 7])
def test_problem_sizes_dict_edit_matches_builder(E):
    built = B.problem_sizes(E).to_dict()
    d = problem_sizes_graph(E)
    built["name"] = d["name"]
    assert d == built


# ---- the four fusions against PyTorch ------------------------------------------------------
@pytest.mark.parametrize("E,T,K,dt", CONFIGS, ids=IDS)
def test_problem_sizes(E, T, K, dt):
    g = torch.Generator().manual_seed(E * 1000 + T * 10 + K)
    ids = torch.randint(0, E, (T, K), generator=g, dtype=TORCH_DT[dt])
    N = T * K
    for graph in (with_input_dtype(problem_sizes_graph(E), dt),
                  with_input_dtype(B.problem_sizes(E).to_dict(), dt)):
        out = run_both(graph, {"topk_ids": ids.numpy()})
        ref = torch.zeros(E, dtype=torch.long).scatter_add(0, ids.flatten().long(), torch.ones(N, dtype=torch.long))
        assert_same(out["counts"], ref)
        assert_same(out["counts"], torch.bincount(ids.flatten().long(), minlength=E))


@pytest.mark.parametrize("E,T,K,dt", CONFIGS, ids=IDS)
def test_expert_offsets(E, T, K, dt):
    g = torch.Generator().manual_seed(E * 1000 + T * 10 + K + 1)
    N = T * K
    t = torch.randint(0, N, (E,), generator=g, dtype=TORCH_DT[dt])
    ref = F.pad(torch.cumsum(t, 0), (1, 0))
    for graph in (example("moe_expert_offsets"), B.expert_offsets().to_dict()):
        out = run_both(with_input_dtype(graph, dt), {"tokens_per_expert": t.numpy()})
        assert_same(out["expert_offsets"], ref)


@pytest.mark.parametrize("E,T,K,dt", CONFIGS, ids=IDS)
def test_blockscale_offsets(E, T, K, dt):
    g = torch.Generator().manual_seed(E * 1000 + T * 10 + K + 2)
    N = T * K
    t = torch.randint(0, N, (E,), generator=g, dtype=TORCH_DT[dt])
    for graph in (example("moe_blockscale_offsets"), B.blockscale_offsets().to_dict()):
        out = run_both(with_input_dtype(graph, dt), {"tokens_per_expert": t.numpy()})
        assert_same(out["expert_offsets"], F.pad(torch.cumsum(t, 0), (1, 0)))
        assert_same(out["blockscale_offsets"], F.pad(torch.cumsum((t + 127) // 128 * 128, 0), (1, 0)))


def test_blockscale_rounds_exact_multiples_and_zero():
    # ceil_div at the edges: 0 stays 0, multiples of 128 stay, one above goes up a block
    t = torch.tensor([0, 1, 127, 128, 129, 256, 255, 0], dtype=torch.long)
    out = run_both(example("moe_blockscale_offsets"), {"tokens_per_expert": t.numpy()})
    assert_same(out["blockscale_offsets"], F.pad(torch.cumsum((t + 127) // 128 * 128, 0), (1, 0)))


def argsort_reference(ids: torch.Tensor, topk: int):
    N = ids.numel()
    t2 = torch.argsort(ids.flatten(), dim=0, descending=True, stable=True)
    input_perm = t2 // topk
    output_perm = torch.empty_like(t2).scatter_(0, t2, torch.arange(N))
    return input_perm, output_perm


@pytest.mark.parametrize("E,T,K,dt", CONFIGS, ids=IDS)
def test_argsort(E, T, K, dt):
    g = torch.Generator().manual_seed(E * 1000 + T * 10 + K + 3)
    N = T * K
    ids = torch.randint(0, N, (T, K), generator=g, dtype=TORCH_DT[dt])  # not limited to E (as nvFuser)
    ref_in, ref_out = argsort_reference(ids, K)
    for graph in (argsort_graph(K), B.argsort(K).to_dict()):
        out = run_both(with_input_dtype(graph, dt), {"topk_ids": ids.numpy()})
        assert_same(out["input_permutation"], ref_in)
        assert_same(out["output_permutation"], ref_out)
        # output_permutation is the inverse of the sort order
        s = torch.argsort(ids.flatten(), dim=0, descending=True, stable=True)
        np.testing.assert_array_equal(out["output_permutation"][s.numpy()], np.arange(N))


def test_argsort_with_many_ties_is_stable():
    # few distinct values: stability decides the order, and descending must keep ties in input order
    ids = torch.randint(0, 3, (64, 4), generator=torch.Generator().manual_seed(5))
    ref_in, ref_out = argsort_reference(ids, 4)
    out = run_both(argsort_graph(4), {"topk_ids": ids.numpy()})
    assert_same(out["input_permutation"], ref_in)
    assert_same(out["output_permutation"], ref_out)


def test_problem_sizes_rejects_out_of_range_ids():
    from segfuse.compiler import RunError

    ids = np.array([[0, 16]], dtype=np.int64)  # 16 is not an expert of 16
    with pytest.raises(RunError, match="out of bounds"):
        run_graph(load_fusion(str(EXAMPLES / "moe_problem_sizes.json")), {"topk_ids": ids})


def test_argsort_fixed_topk_rejects_other_k():
    from segfuse.compiler import BindError

    with pytest.raises(BindError, match="should be 4"):
        run_graph(load_fusion(str(EXAMPLES / "moe_argsort.json")), {"topk_ids": np.zeros((3, 2), np.int64)})


def test_builder_script_runs():
    r = subprocess.run([sys.executable, str(EXAMPLES / "moe_builder.py"), "-T", "8", "-K", "2", "-E", "4"],
                       capture_output=True, text=True, timeout=scaled(120))
    assert r.returncode == 0, r.stderr
    for word in ("counts", "expert_offsets", "blockscale_offsets", "input_permutation", "output_permutation"):
        assert word in r.stdout
    r = subprocess.run([sys.executable, str(EXAMPLES / "moe_builder.py"), "--int32"],
                       capture_output=True, text=True, timeout=scaled(120))
    assert r.returncode == 0, r.stderr


# ---- the CLI on the examples ----------------------------------------------------------------
def segfuse_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "segfuse"
    if exe.exists():
        return [str(exe)]
    return [sys.executable, "-c", "import sys; from segfuse.cli import main; sys.exit(main())"]


def cli(*args, cwd=ROOT):
    return subprocess.run(segfuse_cmd() + [str(a) for a in args], capture_output=True, text=True,
                          cwd=cwd, timeout=scaled(120))


ALL_EXAMPLES = sorted(p.name for p in EXAMPLES.glob("*.json"))


def test_examples_exist():
    for name in ("moe_problem_sizes", "moe_problem_sizes_e256", "moe_expert_offsets", "moe_blockscale_offsets",
                 "moe_argsort", "elementwise_chain", "scatter_add"):
        assert f"{name}.json" in ALL_EXAMPLES


@pytest.mark.parametrize("name", ALL_EXAMPLES)
def test_cli_validate_example(name):
    r = cli("validate", f"examples/{name}")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("ok:")
    d = json.loads((EXAMPLES / name).read_text())
    for o in d["outputs"]:
        assert (o if isinstance(o, str) else o["name"]) in r.stdout


def test_cli_run_problem_sizes(tmp_path):
    ids = torch.randint(0, 16, (32, 4), generator=torch.Generator().manual_seed(11))
    np.save(tmp_path / "ids.npy", ids.numpy())
    r = cli("run", "examples/moe_problem_sizes.json", "--input", f"topk_ids={tmp_path / 'ids.npy'}",
            "--output", f"counts={tmp_path / 'counts.npy'}")
    assert r.returncode == 0, r.stderr
    counts = np.load(tmp_path / "counts.npy")
    ref = torch.zeros(16, dtype=torch.long).scatter_add(0, ids.flatten(), torch.ones(128, dtype=torch.long))
    assert_same(counts, ref)


def test_cli_run_argsort_relative_paths(tmp_path):
    ids = torch.randint(0, 12, (3, 4), generator=torch.Generator().manual_seed(12))
    np.save(tmp_path / "ids.npy", ids.numpy())
    r = cli("run", EXAMPLES / "moe_argsort.json", "-i", "topk_ids=ids.npy", "-o", "input_permutation=in.npy",
            "-o", "output_permutation=out.npy", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    ref_in, ref_out = argsort_reference(ids, 4)
    assert_same(np.load(tmp_path / "in.npy"), ref_in)
    assert_same(np.load(tmp_path / "out.npy"), ref_out)


def test_cli_run_scatter_add_updates_input_file(tmp_path):
    g = torch.Generator().manual_seed(13)
    dst = torch.randn(10, generator=g)
    idx = torch.randint(0, 10, (25,), generator=g)  # duplicates
    src = torch.randn(25, generator=g)
    for n, t in (("dst", dst), ("index", idx), ("src", src)):
        np.save(tmp_path / f"{n}.npy", t.numpy())
    r = cli("run", "examples/scatter_add.json", "-i", f"dst={tmp_path / 'dst.npy'}",
            "-i", f"index={tmp_path / 'index.npy'}", "-i", f"src={tmp_path / 'src.npy'}")
    assert r.returncode == 0, r.stderr
    ref = dst.clone().scatter_add_(0, idx, src)
    torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "dst.npy")), ref)


def test_cli_validate_broken_graph(tmp_path):
    d = example("moe_problem_sizes")
    d["ops"][1]["op"] = "ful"  # typo
    d["ops"][3]["inputs"][1] = "nope"  # unknown tensor
    d["ops"][3]["dim"] = "zero"  # wrong attribute type
    d["outputs"] = ["counts", "missing"]
    p = tmp_path / "broken.json"
    p.write_text(json.dumps(d))
    r = cli("validate", p)
    assert r.returncode == 2
    assert r.stdout == ""
    lines = [ln.strip() for ln in r.stderr.splitlines()]
    assert lines[0].startswith("error: GraphError")
    assert any(ln.startswith("ops[1].op: unknown op 'ful'") and "'full'" in ln for ln in lines), r.stderr
    assert any(ln.startswith("ops[3].dim:") for ln in lines), r.stderr
    assert any(ln.startswith("outputs[1].name: unknown tensor 'missing'") for ln in lines), r.stderr
    # every reported problem is on its own line with its location
    assert len(lines) >= 4


def test_cli_validate_not_json(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text("{\"format\": ")
    r = cli("validate", p)
    assert r.returncode == 2
    assert "not valid JSON" in r.stderr


def test_cli_run_wrong_input_shape(tmp_path):
    np.save(tmp_path / "ids.npy", np.zeros((3, 2), np.int64))
    r = cli("run", "examples/moe_argsort.json", "-i", f"topk_ids={tmp_path / 'ids.npy'}")
    assert r.returncode == 2
    assert "topk_ids" in r.stderr and "should be 4" in r.stderr


def test_examples_readme_commands_run(tmp_path):
    # the bash blocks of examples/README.md run as written (except --write, which edits the repo)
    import re

    (tmp_path / "examples").symlink_to(EXAMPLES)
    env = dict(os.environ, PATH=f"{Path(segfuse_cmd()[0]).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if segfuse_cmd()[0] == sys.executable:
        pytest.skip("no segfuse script next to this Python")
    doc = (EXAMPLES / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)```", doc, flags=re.S)
    assert len(blocks) >= 2
    for b in blocks:
        code = "\n".join(ln.replace("python ", f"{sys.executable} ", 1) if ln.startswith("python ") else ln
                         for ln in b.splitlines() if "--write" not in ln)
        r = subprocess.run(["bash", "-ec", code], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=scaled(300))
        assert r.returncode == 0, code + "\n" + r.stdout + r.stderr
    ids = np.load(tmp_path / "ids.npy")
    ref = torch.bincount(torch.from_numpy(ids).flatten(), minlength=16)
    assert_same(np.load(tmp_path / "counts.npy"), ref)
    # dst.npy started as zeros (the README says so) and was updated in place
    idx, src = (torch.from_numpy(np.load(tmp_path / f"{n}.npy")) for n in ("index", "src"))
    want = torch.zeros(8).scatter_add_(0, idx, src)
    torch.testing.assert_close(torch.from_numpy(np.load(tmp_path / "dst.npy")), want)
