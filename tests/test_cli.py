"""Every client-side CLI command (`buffers`, `run --server`, `warmup`, `bench`) through a subprocess,
against a live server where it needs one."""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import pytest
from helpers.graphs import MOE, counts_of
from helpers.processes import ROOT, free_port, segfuse, server_process


def test_help_lists_commands_with_examples():
    out = segfuse("--help").stdout
    for cmd in ("buffers", "warmup", "bench", "run"):
        assert cmd in out
    for args in (["buffers"], ["buffers", "put"], ["buffers", "get"], ["buffers", "ls"], ["buffers", "rm"],
                 ["warmup"], ["bench"], ["run"]):
        out = segfuse(*args, "--help").stdout
        assert "example" in out, args
    assert "--server" in segfuse("run", "--help").stdout


def test_buffers_put_ls_get_rm(server, tmp_path):
    ids = np.random.default_rng(0).integers(0, 16, (32, 4))
    np.save(tmp_path / "ids.npy", ids)
    r = segfuse("buffers", "put", "cli_ids", tmp_path / "ids.npy", "--server", server)
    assert "cli_ids: int64[32, 4]" in r.stdout
    ls = segfuse("buffers", "ls", server=server).stdout  # server from $SEGFUSE_SERVER
    assert "cli_ids" in ls and "int64" in ls
    listed = json.loads(segfuse("buffers", "ls", "--json", "-s", server).stdout)
    assert any(b["name"] == "cli_ids" and b["shape"] == [32, 4] for b in listed)
    segfuse("buffers", "get", "cli_ids", tmp_path / "back.npy", "--server", server)
    assert np.array_equal(np.load(tmp_path / "back.npy"), ids)
    assert "cli_ids: int64[32, 4]" in segfuse("buffers", "get", "cli_ids", "--server", server).stdout
    assert "deleted cli_ids" in segfuse("buffers", "rm", "cli_ids", "--server", server).stdout
    r = segfuse("buffers", "get", "cli_ids", "--server", server, check=2)
    assert "[404]" in r.stderr and "not found" in r.stderr
    segfuse("buffers", "rm", "cli_ids", "--server", server, check=2)
    r = segfuse("buffers", "put", "x", tmp_path / "missing.npy", "--server", server, check=2)
    assert "cannot load" in r.stderr


def test_run_on_a_server(server, tmp_path):
    ids = np.random.default_rng(1).integers(0, 16, (64, 8))
    np.save(tmp_path / "ids.npy", ids)
    # .npy in, .npy out, graph sent inline
    r = segfuse("run", MOE, "--input", f"topk_ids={tmp_path / 'ids.npy'}", "--output",
                f"counts={tmp_path / 'counts.npy'}", "--server", server)
    assert "counts: int64[16] ->" in r.stdout and "kernel cache" in r.stderr
    assert np.array_equal(np.load(tmp_path / "counts.npy"), counts_of(ids))
    # buffers in and out, the fusion by its registered name
    segfuse("buffers", "put", "run_ids", tmp_path / "ids.npy", "--server", server)
    r = segfuse("run", "moe_problem_sizes", "-i", "topk_ids=buffer:run_ids", "-o", "counts=buffer:run_counts",
                "--server", server)
    assert "counts: stored in buffer 'run_counts'" in r.stdout
    segfuse("buffers", "get", "run_counts", tmp_path / "c2.npy", "--server", server)
    assert np.array_equal(np.load(tmp_path / "c2.npy"), counts_of(ids))
    # outputs not named are printed
    assert "counts: int64[16]" in segfuse("run", MOE, "-i", "topk_ids=buffer:run_ids", "-s", server).stdout
    segfuse("buffers", "rm", "run_ids", "run_counts", "--server", server)


def test_run_user_errors_exit_2(server, tmp_path):
    r = segfuse("run", MOE, "--input", "topk_ids", "--server", server, check=2)
    assert "NAME=FILE" in r.stderr
    r = segfuse("run", MOE, "-i", "topk_ids=buffer:nope", "--server", server, check=2)
    assert "[404]" in r.stderr and "nope" in r.stderr
    np.save(tmp_path / "f.npy", np.zeros((2, 2), np.float32))
    r = segfuse("run", MOE, "-i", f"topk_ids={tmp_path / 'f.npy'}", "--server", server, check=2)
    assert "[400]" in r.stderr and "inputs.topk_ids" in r.stderr
    r = segfuse("run", "missing.json", "--server", server, check=2)
    assert "missing.json" in r.stderr
    r = segfuse("buffers", "ls", "--server", f"127.0.0.1:{free_port()}", check=2)
    assert "cannot reach the segfuse server at http://127.0.0.1:" in r.stderr


def test_token_from_the_environment(tmp_path):
    with server_process(token="t0k") as url:
        r = segfuse("buffers", "ls", "--server", url, check=2)
        assert "[401]" in r.stderr
        assert "no buffers" in segfuse("buffers", "ls", "--server", url, "--token", "t0k").stdout


def test_warmup():
    r = segfuse("warmup", MOE, str(ROOT / "examples" / "moe_argsort.json"), "--shape", "T=4096,K=8",
                "--shape", "T=1,K=8", "--backend", "numpy")
    assert "warmed up 4 graph/size pair(s) on the numpy backend" in r.stdout
    assert "moe_problem_sizes T=4096,K=8" in r.stdout
    assert "give a value for K" in segfuse("warmup", MOE, "--shape", "T=4", check=2).stderr
    assert "which no graph has" in segfuse("warmup", MOE, "--shape", "T=4,K=2,Q=1", check=2).stderr
    assert "SYM=N" in segfuse("warmup", MOE, "--shape", "T4096", check=2).stderr
    assert "cannot read" in segfuse("warmup", "nope.json", "--shape", "T=1", check=2).stderr


def test_bench_without_a_gpu(tmp_path):
    from segfuse.cli.client_cmds import gpu_visible

    if gpu_visible():
        pytest.skip("a GPU is visible: bench would really run")
    script = tmp_path / "bench_gpu.py"
    script.write_text("print('never runs')\n")
    r = segfuse("bench", "--script", script, check=2)
    assert "no CUDA GPU is visible" in r.stderr
    r = segfuse("bench", cwd=tmp_path / "..", check=2)  # from elsewhere: the checkout's script, or none
    assert "GPU" in r.stderr or "no benchmark script" in r.stderr


def test_bench_progress_follows_step_lines(tmp_path, capsys):
    from segfuse.cli.client_cmds import _run_with_progress

    script = tmp_path / "steps.py"
    script.write_text("for i in range(1, 4):\n    print(f'[{i}/3] case {i}', flush=True)\nprint('table written')\n")
    assert _run_with_progress([sys.executable, str(script)]) == 0
    assert "table written" in capsys.readouterr().err


def test_bench_plot_from_results(tmp_path):
    pytest.importorskip("matplotlib")
    from segfuse.cli.client_cmds import plot_bench

    results = {"meta": {"gpu": "NVIDIA H200", "date": "2026-11-29"},
               "rows": [{"bench": "chain", "impl": "segfuse", "us": 10.0},
                        {"bench": "chain", "impl": "torch eager", "us": 30.0},
                        {"bench": "moe", "impl": "segfuse", "us": float("nan")}]}
    path = plot_bench(results, tmp_path / "bench_gpu.png")
    assert path is not None and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_speedup_series_follow_the_summary():
    from segfuse.cli.client_cmds import bench_speedups

    summary = {"chain_vs_compile": 0.8, "scatter_256_vs_eager": 36.0,
               "moe_argsort_T128_int64": 0.9, "moe_argsort_T65536_int64": 0.5, "moe_argsort_T128_int32": 7.0}
    labels, series, targets = bench_speedups(summary)
    assert labels == ["chain 2^28 f32 (vs torch.compile)", "scatter-add 256 bins", "argsort T=128", "argsort T=65536"]
    assert series["Engine.run (int64 ids)"] == [0.8, 36.0, 0.9, 0.5]
    assert series["Engine.run (int32 ids)"][2] == 7.0 and math.isnan(series["Engine.run (int32 ids)"][3])
    assert targets == [0.95, 40.0, 3.0, 1.0]


def test_bench_speedups_show_deferred_runs_and_skip_medians():
    from segfuse.cli.client_cmds import bench_speedups

    summary = {"chain_vs_compile": 1.1, "moe_problem_sizes_T1_int64": 2.0, "moe_problem_sizes_T1_int64_p50": 2.2,
               "moe_problem_sizes_T1_int64_deferred": 2.6, "moe_problem_sizes_T1_int64_deferred_p50": 2.9,
               "moe_problem_sizes_T1_int32": 2.5, "moe_problem_sizes_T1_int32_deferred": 3.1,
               "moe_problem_sizes_T65536_int64_deferred": 4.0}
    labels, series, targets = bench_speedups(summary)
    assert labels == ["chain 2^28 f32 (vs torch.compile)", "problem_sizes T=1", "problem_sizes T=1, errors='deferred'",
                      "problem_sizes T=65536, errors='deferred'"]
    assert series["Engine.run (int64 ids)"] == [1.1, 2.0, 2.6, 4.0]
    assert series["Engine.run (int32 ids)"][1:3] == [2.5, 3.1] and math.isnan(series["Engine.run (int32 ids)"][3])
    assert targets == [0.95, 3.0, 3.0, 1.0]
