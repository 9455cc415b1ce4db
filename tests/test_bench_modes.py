"""The three-mode GPU benchmarks without a GPU: their modules import (benchmarks/modes.py,
workloads.py, bench_norms.py, bench_prologue.py; the GPU is only touched inside their functions), the prologue
benchmark's oracle agrees with an independent NumPy prologue on the CPU, and plot_modes draws one
PNG per workload measured in more than one mode."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))


@pytest.mark.parametrize("name", ["modes", "workloads", "bench_norms", "bench_prologue", "plot_modes"])
def test_benchmark_modules_import_without_a_gpu(name):
    importlib.import_module(name)


def test_env_list(monkeypatch):
    from modes import env_list

    monkeypatch.delenv("SEGFUSE_X", raising=False)
    assert env_list("SEGFUSE_X", ["a"]) == ["a"]
    monkeypatch.setenv("SEGFUSE_X", "1,128")
    assert env_list("SEGFUSE_X", ["a"]) == ["1", "128"]


def test_prologue_oracle_is_the_prologue():
    torch = pytest.importorskip("torch")
    from workloads import torch_prologue

    ids = np.random.default_rng(0).integers(0, 256, (300, 8))
    counts, offsets, inp, outp = (t.numpy() for t in torch_prologue(torch.from_numpy(ids)))
    flat = ids.reshape(-1)
    order = np.argsort(flat, kind="stable")
    inv = np.empty_like(order)
    inv[order] = np.arange(order.size)
    np.testing.assert_array_equal(counts, np.bincount(flat, minlength=256))
    np.testing.assert_array_equal(offsets, np.concatenate([[0], np.cumsum(np.bincount(flat, minlength=256))]))
    np.testing.assert_array_equal(inp, order // 8)
    np.testing.assert_array_equal(outp, inv)


def test_plot_modes_draws_one_png_per_workload(tmp_path):
    pytest.importorskip("matplotlib")
    from plot_modes import plot_modes, workloads

    rows = [{"bench": "moe prologue T=4096 int64", "impl": "segfuse", "us": 30.0, "pipelined us": 12.0,
             "gpu us": 10.0, "launches": 2},
            {"bench": "moe prologue T=4096 int64", "impl": "torch + CUDA graph", "us": 120.0,
             "pipelined us": 95.0, "gpu us": 91.0, "launches": None},
            {"bench": "softmax [8, 4096] float32", "impl": "segfuse", "us": 9.0, "pipelined us": 7.0,
             "gpu us": float("nan"), "launches": 1},
            {"bench": "elementwise chain", "impl": "segfuse", "us": 100.0}]  # one mode only: no plot
    results = {"meta": {"gpu": "test", "date": "today"}, "rows": rows}
    assert set(workloads(results)) == {"moe prologue T=4096 int64", "softmax [8, 4096] float32"}
    paths = plot_modes(results, tmp_path)
    assert sorted(p.name for p in paths) == ["moe_prologue_T_4096_int64.png", "softmax_8_4096_float32.png"]
    for p in paths:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "benchmarks").glob("*.sh")))
def test_device_scripts_parse(script):
    import shutil
    import subprocess

    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    p = subprocess.run([bash, "-n", str(ROOT / "benchmarks" / script)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


def test_measure_takes_gpu_times_in_turns(monkeypatch):
    """GPU times given as functions are the median of GPU_ROUNDS rounds, the implementations taking
    turns in each round; a plain number is kept as it is; `speedup` is over segfuse's median."""
    import modes

    order = []
    monkeypatch.setattr(modes, "pipelined_us", lambda fn: fn() or 1.0)
    monkeypatch.setattr(modes, "GPU_ROUNDS", 5)

    def gpu(name, values):
        it = iter(values)
        return lambda: (order.append(name), next(it))[1]

    impls = {"segfuse": (None, lambda: None, gpu("s", [5.0, 1.0, 4.0, 2.0, 3.0]), 1),
             "torch": (None, lambda: None, gpu("t", [9.0, 6.0, 8.0, 7.0, 60.0]), 3),
             "fixed": (None, lambda: None, 12.0, None)}
    rows: list = []
    base = modes.measure(rows, "w", impls, lambda call, reps, warm: [2.0, 4.0], 2)
    assert order == ["s", "t"] * 5
    assert base["segfuse"]["gpu us"] == 3.0 and base["torch"]["gpu us"] == 8.0 and base["fixed"]["gpu us"] == 12.0
    assert (base["torch"]["gpu us min"], base["torch"]["gpu us max"]) == (6.0, 60.0)
    assert "gpu us min" not in base["fixed"]
    assert base["torch"]["speedup"] == 8.0 / 3.0 and base["fixed"]["speedup"] == 4.0
    assert [r["impl"] for r in rows] == ["segfuse", "torch", "fixed"] and rows[0]["us"] == 3.0


def test_measure_times_a_timer_shared_by_two_rows_once_a_round(monkeypatch):
    """torch eager and torch + CUDA graph replay the same graph: given the same function, measure
    runs it once a round and gives both rows that round's time."""
    import modes

    calls = []
    monkeypatch.setattr(modes, "pipelined_us", lambda fn: 1.0)
    monkeypatch.setattr(modes, "GPU_ROUNDS", 3)
    seg = iter([2.0, 2.0, 2.0])
    shared_times = iter([10.0, 30.0, 20.0])

    def shared():
        calls.append("shared")
        return next(shared_times)

    impls = {"segfuse": (None, None, lambda: (calls.append("s"), next(seg))[1], 1),
             "torch eager": (None, None, shared, 5),
             "torch + CUDA graph": (None, None, shared, None)}
    base = modes.measure([], "w", impls, lambda call, reps, warm: [1.0], 1)
    assert calls == ["s", "shared"] * 3
    for impl in ("torch eager", "torch + CUDA graph"):
        assert base[impl]["gpu us"] == 20.0 and (base[impl]["gpu us min"], base[impl]["gpu us max"]) == (10.0, 30.0)
        assert base[impl]["speedup"] == 10.0


def test_a_launch_count_that_fails_leaves_the_rows_and_the_other_counts(monkeypatch):
    """count_launches after a time limit: one callable that raises (a torch.compile function whose
    compile was interrupted) leaves its rows' launches None; the others are still counted."""
    torch = pytest.importorskip("torch")
    import modes
    from torch import profiler

    class FakeProfile:  # (torch's profiler without a GPU: three CUDA events a call)
        def __init__(self, activities):
            pass

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def events(self):
            return [type("E", (), {"device_type": torch.autograd.DeviceType.CUDA})()] * 3

    def broken():
        raise RuntimeError("Attempting to use a closed pool")

    monkeypatch.setattr(profiler, "profile", FakeProfile)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    calls = []
    rows = [{"bench": "w", "impl": "a", "launches": modes.torch_launches(broken)},
            {"bench": "w", "impl": "b", "launches": modes.torch_launches(lambda: calls.append(1))}]
    modes.count_launches(rows)
    assert rows[0]["launches"] is None and rows[1]["launches"] == 3 and calls == [1, 1]




def imports_of_the_test_tree(source: str) -> list[str]:
    """The imports of a benchmark's source that only tests/ provides, and any "tests" path it builds."""
    import ast

    tests, bench = ROOT / "tests", ROOT / "benchmarks"
    test_only = ({p.stem for p in tests.glob("*.py")} | {p.name for p in tests.iterdir() if (p / "__init__.py").exists()}
                 | {"tests"}) - {p.stem for p in bench.glob("*.py")}
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in test_only]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] in test_only:
            found.append(node.module)
        elif isinstance(node, ast.Constant) and node.value == "tests":
            found.append('the path "tests"')
    return found


def test_benchmarks_import_nothing_from_the_test_tree():
    """The benchmarks run on their own (on a GPU machine, through `segfuse bench`): no script puts
    tests/ on sys.path or imports a module that only tests/ has; shared code is in benchmarks/."""
    assert sorted(imports_of_the_test_tree("import sys\nsys.path.insert(0, 'tests')\nfrom corpus import moe_graphs\n")) \
        == ["corpus", 'the path "tests"']
    found = {p.name: imports_of_the_test_tree(p.read_text()) for p in sorted((ROOT / "benchmarks").glob("*.py"))}
    assert {name: f for name, f in found.items() if f} == {}
