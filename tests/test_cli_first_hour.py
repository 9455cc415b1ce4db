"""A new user's first commands (issue 17, items 14 and 15): `segfuse --version`, and the cupy backend
asked for where there is no GPU gets a clear error and exit status 2, not a traceback."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers.processes import segfuse

GRAPH = Path(__file__).resolve().parents[1] / "examples" / "moe_problem_sizes.json"


def _gpu_visible() -> bool:
    from segfuse.server.array_backends import cupy_visible

    return cupy_visible()


def test_version():
    from importlib.metadata import version

    r = segfuse("--version")
    assert r.stdout.strip() == f"segfuse {version('segfuse')}"


def test_run_on_cupy_without_a_gpu_is_a_clear_error(tmp_path):
    if _gpu_visible():
        pytest.skip("a GPU is visible here")
    np.save(tmp_path / "ids.npy", np.zeros((4, 2), np.int64))
    r = segfuse("run", GRAPH, "--backend", "cupy", "-i", f"topk_ids={tmp_path / 'ids.npy'}",
                check=2)
    assert "cupy backend is not available here" in r.stderr and "Traceback" not in r.stderr


def test_engine_refuses_cupy_at_construction_without_a_gpu():
    if _gpu_visible():
        pytest.skip("a GPU is visible here")
    from segfuse.compiler import Engine

    with pytest.raises(ValueError, match="cupy backend is not available here"):
        Engine("cupy")


def test_serve_refuses_a_port_out_of_range():
    r = segfuse("serve", "--port", "99999", "--backend", "numpy", check=2)
    assert "port must be 0-65535, not 99999" in r.stderr and "Traceback" not in r.stderr
