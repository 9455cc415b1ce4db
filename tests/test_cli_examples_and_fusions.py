"""Through the console script: `segfuse run` honours $SEGFUSE_SERVER,
every `--help` example works as written, `segfuse fusions ls|get|rm`, `run --replace`, and
`segfuse explain` readable at 80 columns with plain sizes and a real shared-memory limit."""

from __future__ import annotations

import glob
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers.graphs import counts_of
from helpers.processes import ROOT, segfuse
from helpers.waiting import scaled

MOE = str(ROOT / "examples" / "moe_problem_sizes.json")


def _ids(tmp_path: Path, seed=3) -> np.ndarray:
    ids = np.random.default_rng(seed).integers(0, 16, (48, 4))
    np.save(tmp_path / "ids.npy", ids)
    return ids


# ---- the server from the environment -------------------------------------------------------------
def test_run_uses_segfuse_server_from_the_environment(server, tmp_path):
    ids = _ids(tmp_path)
    segfuse("buffers", "put", "env_ids", tmp_path / "ids.npy", server=server)
    r = segfuse("run", MOE, "-i", "topk_ids=buffer:env_ids", "-o", "counts=buffer:env_counts", server=server)
    assert "counts: stored in buffer 'env_counts'" in r.stdout and "kernel cache" in r.stderr
    segfuse("buffers", "get", "env_counts", tmp_path / "c.npy", server=server)
    assert np.array_equal(np.load(tmp_path / "c.npy"), counts_of(ids))
    # --local runs in-process although $SEGFUSE_SERVER is set
    r = segfuse("run", MOE, "-i", f"topk_ids={tmp_path / 'ids.npy'}", "--local", "-o",
                f"counts={tmp_path / 'local.npy'}", server=server)
    assert "kernel cache" not in r.stderr
    assert np.array_equal(np.load(tmp_path / "local.npy"), counts_of(ids))
    segfuse("buffers", "rm", "env_ids", "env_counts", server=server)


def test_a_server_buffer_without_a_server_is_a_clear_error(tmp_path):
    r = segfuse("run", MOE, "-i", "topk_ids=buffer:ids_0", check=2)
    assert "server" in r.stderr and "SEGFUSE_SERVER" in r.stderr and "No such file" not in r.stderr
    np.save(tmp_path / "ids.npy", np.zeros((4, 2), np.int64))
    r = segfuse("run", MOE, "-i", f"topk_ids={tmp_path / 'ids.npy'}", "-o", "counts=buffer:c", check=2)
    assert "--server" in r.stderr
    r = segfuse("run", MOE, "-i", f"topk_ids={tmp_path / 'ids.npy'}", "--replace", check=2)
    assert "--server" in r.stderr


# ---- help examples and fusions commands ----------------------------------------------------------
def _command_paths() -> list[list[str]]:
    import argparse

    from segfuse.cli import build_parser

    paths = []

    def walk(p, prefix):
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sp in a.choices.items():
                    paths.append([*prefix, name])
                    walk(sp, [*prefix, name])
    walk(build_parser(), [])
    return paths


def _examples(*path) -> list[str]:
    text = segfuse(*path, "--help").stdout
    lines = [m[1].split("   #")[0].strip() for m in re.finditer(r"^\s+(segfuse .*)$", text, re.M)]
    return [line for line in lines if line.split()[:len(path) + 1] == ["segfuse", *path] or not path]


def test_every_help_example_that_needs_no_server_works(tmp_path):
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    _ids(tmp_path)
    ran = []
    for path in [[], *_command_paths()]:
        for line in _examples(*path):
            argv = line.split()[1:]
            if argv[0] in ("serve", "serve-ray", "route", "bench", "buffers", "fusions", "regions") or "--server" in argv:
                continue  # a server, a GPU or a long-running process
            argv = [a for arg in argv for a in (sorted(glob.glob(arg, root_dir=tmp_path)) if "*" in arg else [arg])]
            r = segfuse(*argv, cwd=tmp_path, check=None)
            assert r.returncode == 0, f"{line}\n{r.stderr}"
            ran.append(argv[0])
    assert {"validate", "run", "warmup", "explain"} <= set(ran)


def test_server_help_examples_and_fusions_commands(server, tmp_path):
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    ids = _ids(tmp_path)
    seq = [e for p in (["buffers"], ["run"], ["fusions"]) for e in _examples(*p)]
    assert any("fusions ls" in e for e in seq) and any("buffer:ids_0" in e for e in seq)
    order = ["buffers put", "run", "buffers ls", "buffers get", "fusions ls", "fusions get", "fusions rm",
             "buffers rm"]
    for step in order:
        for line in [e for e in seq if e.startswith(f"segfuse {step}")]:
            argv = [a if a != "127.0.0.1:8000" else server for a in line.split()[1:]]
            if step == "run" and "--server" not in argv:
                continue
            segfuse(*argv, server=server, cwd=tmp_path)
    assert np.array_equal(np.load(tmp_path / "counts.npy"), counts_of(ids))


def test_fusions_ls_get_rm(server, tmp_path):
    _ids(tmp_path)
    graph = json.loads(Path(MOE).read_text())
    graph["name"] = "cli_fusions_moe"
    (tmp_path / "g.json").write_text(json.dumps(graph))
    segfuse("run", tmp_path / "g.json", "-i", "topk_ids=ids.npy", server=server, cwd=tmp_path)
    ls = segfuse("fusions", "ls", server=server).stdout
    assert re.search(r"^cli_fusions_moe\s+[0-9a-f]{20}\s+4 ops\s+topk_ids: INT64\[\?, \?\] -> counts$", ls, re.M), ls
    listed = json.loads(segfuse("fusions", "ls", "--json", server=server).stdout)
    fid = next(f["id"] for f in listed if f["name"] == "cli_fusions_moe")
    got = json.loads(segfuse("fusions", "get", "cli_fusions_moe", server=server).stdout)
    assert got["id"] == fid and got["name"] == "cli_fusions_moe"
    assert "unregistered cli_fusions_moe" in segfuse("fusions", "rm", "cli_fusions_moe", server=server).stdout
    assert "cli_fusions_moe" not in segfuse("fusions", "ls", server=server).stdout
    r = segfuse("fusions", "rm", "cli_fusions_moe", server=server, check=2)
    assert "[404]" in r.stderr
    segfuse("fusions", "get", "nope_fusion", server=server, check=2)


def test_run_replace(server, tmp_path):
    ids = _ids(tmp_path)
    graph = json.loads(Path(MOE).read_text())
    graph["name"] = "cli_replace_moe"
    (tmp_path / "a.json").write_text(json.dumps(graph))
    segfuse("run", tmp_path / "a.json", "-i", "topk_ids=ids.npy", server=server, cwd=tmp_path)
    # A different graph under the same name: 409 with a hint, then --replace registers it.
    graph["outputs"] = [*graph["outputs"], graph["ops"][0]["out"]]
    (tmp_path / "b.json").write_text(json.dumps(graph))
    r = segfuse("run", tmp_path / "b.json", "-i", "topk_ids=ids.npy", server=server, cwd=tmp_path, check=2)
    assert "[409]" in r.stderr and "--replace" in r.stderr
    r = segfuse("run", tmp_path / "b.json", "-i", "topk_ids=ids.npy", "-o", "counts=c.npy", "--replace",
                server=server, cwd=tmp_path)
    assert np.array_equal(np.load(tmp_path / "c.npy"), counts_of(ids))
    got = json.loads(segfuse("fusions", "get", "cli_replace_moe", server=server).stdout)
    assert len(got["outputs"]) == 2
    segfuse("fusions", "rm", "cli_replace_moe", server=server)


# ---- explain -------------------------------------------------------------------------------------
def test_explain_is_readable_at_80_columns():
    out = segfuse("explain", ROOT / "examples" / "scatter_add.json", "--shape", "N=1000000,M=100000",
                  columns=80).stdout
    lines = out.splitlines()
    assert max(map(len, lines)) <= 80, out
    # no one-word-per-line wrapping: wrapped text lines carry several words
    words = [len(line.split()) for line in lines if line.strip()]
    assert sum(w <= 1 for w in words) == 0, out
    assert "ceiling(" not in out and "Max(" not in out, out
    assert "ceil(max(M, N)/256) = 3907 blocks x 256 threads" in out, out


def test_explain_cites_a_real_shared_memory_limit():
    out = segfuse("explain", ROOT / "examples" / "moe_argsort.json", "--shape", "T=4096", columns=80).stdout
    assert "1048576" not in out.split("size test")[0], out  # the reason no longer cites 1 MiB as the limit
    try:
        import cupy

        gpu = cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        gpu = False
    if not gpu:
        assert "227 KiB per block opt-in, 48 KiB by default on H200 (sm_90)" in " ".join(out.split()), out
    assert "intermediates in shared memory 32*T = 131072 B" in out


# argparse ignores write errors of --help and --version itself (exit 0); a command's output that
# cannot be written exits 141, as a process killed by SIGPIPE.
@pytest.mark.parametrize("argv, status", [(["--help"], 0), (["--version"], 0), (["serve", "--help"], 0),
                                          (["explain", MOE, "--shape", "K=8", "--shape", "T=4096"], 141),
                                          (["validate", MOE], 141)])
def test_a_closed_pipe_is_no_traceback(argv, status):
    """`segfuse ... | head`: the reader is gone before segfuse writes (the read end closed before
    the console script starts, so the write fails for certain): no traceback, nothing on stderr
    (before: BrokenPipeError's traceback, or 'Exception ignored ... BrokenPipeError' at exit); the
    same command into an open pipe prints and exits 0."""
    script = os.path.join(os.path.dirname(sys.executable), "segfuse")
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        r = subprocess.run([script, *argv], stdout=write_end, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                           timeout=scaled(120))
    finally:
        os.close(write_end)
    assert r.stderr == "" and r.returncode == status, r.stderr
    ok = subprocess.run([script, *argv], capture_output=True, text=True, cwd=ROOT, timeout=scaled(120))
    assert ok.returncode == 0 and ok.stdout and ok.stderr == "", ok.stderr
