"""`segfuse serve` (a real process, flags and SEGFUSE_* variables) and settings parsing."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import httpx
import pytest
from helpers.processes import SEGFUSE, free_port
from segfuse.server.settings import Settings, parse_size


def test_settings_from_env_and_overrides():
    env = {"SEGFUSE_PORT": "9001", "SEGFUSE_TOKEN": "t", "SEGFUSE_MAX_BODY_BYTES": "64M",
           "SEGFUSE_MAX_TOTAL_BYTES": "2G", "SEGFUSE_BACKEND": "numpy"}
    s = Settings.from_env(env)
    assert (s.port, s.token, s.max_body_bytes, s.max_total_bytes, s.backend) == (9001, "t", 64 << 20, 2 << 30, "numpy")
    s = Settings.from_env(env, port=9002, token=None)  # None: not given on the command line
    assert s.port == 9002 and s.token == "t"
    with pytest.raises(ValueError, match="SEGFUSE_MAX_OPS"):
        Settings.from_env({"SEGFUSE_MAX_OPS": "many"})
    with pytest.raises(ValueError, match="backend"):
        Settings.from_env({"SEGFUSE_BACKEND": "tpu"})
    with pytest.raises(ValueError, match="max_rank"):
        Settings.from_env({}, max_rank=0)
    assert parse_size("1024") == 1024 and parse_size("8k") == 8192 and parse_size("1.5GiB") == 3 << 29


def test_serve_parser_flags():
    from segfuse.cli import build_parser
    from segfuse.cli.serve_cmd import settings_from_args

    args = build_parser().parse_args(["serve", "--port", "1234", "--backend", "numpy", "--max-buffer-bytes", "1M",
                                      "--max-queued-runs", "3", "--token", "x"])
    s = settings_from_args(args)
    assert (s.port, s.backend, s.max_buffer_bytes, s.max_queued_runs, s.token) == (1234, "numpy", 1 << 20, 3, "x")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--max-body-bytes", "lots"])


def test_serve_process_with_env_token():
    port = free_port()
    env = dict(os.environ, SEGFUSE_PORT=str(port), SEGFUSE_TOKEN="envtoken", SEGFUSE_LOG_LEVEL="warning")
    proc = subprocess.Popen([*SEGFUSE, "serve", "--backend", "numpy", "--host", "127.0.0.1"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/v2/health/ready", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stdout.read().decode()
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.1)
        assert httpx.get(url + "/v2").status_code == 401
        meta = httpx.get(url + "/v2", headers={"authorization": "Bearer envtoken"}).json()
        assert meta["backend"] == "numpy"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, proc.stdout.read().decode()


def test_serve_cupy_without_gpu_is_a_clear_error():
    from segfuse.server.array_backends import cupy_visible

    if cupy_visible():
        pytest.skip("a GPU is visible here")
    r = subprocess.run([*SEGFUSE, "serve", "--backend", "cupy", "--port", str(free_port())], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "needs a visible CUDA GPU" in r.stderr, r.stderr
    assert "--backend numpy" in r.stderr and "SEGFUSE_BACKEND=numpy" in r.stderr  # the way out is named
    # the GPU image sets SEGFUSE_BACKEND=cupy: the variable alone gives the same refusal
    r = subprocess.run([*SEGFUSE, "serve", "--port", str(free_port())], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "SEGFUSE_BACKEND": "cupy"})
    assert r.returncode == 2 and "needs a visible CUDA GPU" in r.stderr, r.stderr


def test_cache_dir_layout(tmp_path, monkeypatch):
    from segfuse.server.array_backends import resolve

    monkeypatch.setenv("SEGFUSE_KERNEL_CACHE", "unset")  # restored after the test
    monkeypatch.setenv("CUPY_CACHE_DIR", "unset")
    engine, arrays = resolve("numpy", 0, str(tmp_path))
    assert arrays.name == "numpy" and engine.backend == "numpy"
    assert os.environ["SEGFUSE_KERNEL_CACHE"] == str(tmp_path / "kernels")
    assert os.environ["CUPY_CACHE_DIR"] == str(tmp_path / "cupy")
    assert (tmp_path / "kernels").is_dir() and (tmp_path / "cupy").is_dir()
