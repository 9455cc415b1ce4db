"""What a user installs: the wheel and the sdist, non-editable, in fresh virtual environments.

The editable install CI uses finds modules in the checkout whatever pyproject.toml lists, so a
package missing from `[tool.setuptools] packages` only shows in a built wheel (it once shipped
without `segfuse.server.routers`, and `segfuse serve` died at start). These tests build both
archives, install each in a venv of its own from PyPI, start `segfuse serve` from it and run a
registered fusion; every optional extra resolves and its modules import.
"""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tomllib
from helpers.processes import ROOT, server_process
from helpers.waiting import scaled

ROOTS = {"compiler", "server", "client", "scaleout", "cli", "torch_ext"}


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_every_folder_of_modules_is_a_listed_package():
    setup = pyproject()["tool"]["setuptools"]
    to_folder = setup["package-dir"]
    assert set(to_folder.values()) == ROOTS
    listed = set(setup["packages"])
    folders = {d for root in ROOTS for d in [ROOT / root, *(ROOT / root).rglob("*")]
               if d.is_dir() and d.name != "__pycache__" and any(d.glob("*.py"))}
    expected = set()
    for d in folders:
        rel = d.relative_to(ROOT).parts
        package = next(k for k, v in to_folder.items() if v == rel[0])
        expected.add(".".join([package, *rel[1:]]))
    assert listed == expected, f"missing: {sorted(expected - listed)}, extra: {sorted(listed - expected)}"


@pytest.fixture(scope="module")
def archives(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "build", "--wheel", "--sdist", "--outdir", str(out), str(ROOT)],
                   check=True, capture_output=True, text=True, timeout=scaled(600))
    return {"wheel": next(out.glob("segfuse-*.whl")), "sdist": next(out.glob("segfuse-*.tar.gz"))}


def venv(path: Path, *requirements: str, system_site: bool = False) -> Path:
    """A venv at `path` with `requirements` installed by its own pip; returns its bin folder."""
    subprocess.run([sys.executable, "-m", "venv", *(["--system-site-packages"] if system_site else []), str(path)],
                   check=True, timeout=scaled(120))
    r = subprocess.run([str(path / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                        *requirements], capture_output=True, text=True, timeout=scaled(900))
    assert r.returncode == 0, r.stdout + r.stderr
    return path / "bin"


def serves_a_registered_fusion(bin_dir: Path) -> None:
    """`segfuse serve` of that venv registers the MoE histogram and runs it; numpy's bincount
    is the oracle. The modules come from the venv, not from this checkout."""
    where = subprocess.run([str(bin_dir / "python"), "-c", "import segfuse.server.routers as m; print(m.__file__)"],
                           capture_output=True, text=True, timeout=scaled(60))
    assert where.returncode == 0 and where.stdout.startswith(str(bin_dir.parent)), where.stdout + where.stderr
    with server_process([str(bin_dir / "segfuse"), "serve", "--backend", "numpy"]) as url:
        graph = (ROOT / "examples" / "moe_problem_sizes.json").read_bytes()
        req = urllib.request.Request(f"{url}/v2/fusions", graph, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=scaled(30)) as r:
            name = json.loads(r.read())["name"]
        ids = np.random.default_rng(0).integers(0, 16, (64, 2))
        body = {"inputs": [{"name": "topk_ids", "shape": list(ids.shape), "datatype": "INT64",
                            "data": ids.ravel().tolist()}]}
        req = urllib.request.Request(f"{url}/v2/models/{name}/infer", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=scaled(30)) as r:
            out = json.loads(r.read())["outputs"][0]
    assert out["data"] == np.bincount(ids.ravel(), minlength=16).tolist()


@pytest.mark.parametrize("kind", ["wheel", "sdist"])
def test_the_built_archive_installs_alone_and_serves(kind, archives, tmp_path):
    bin_dir = venv(tmp_path / "venv", f"segfuse[server] @ {archives[kind].as_uri()}")
    serves_a_registered_fusion(bin_dir)


# extra -> a module it exists for, imported in the venv that installed it
EXTRA_IMPORTS = {
    "server": "segfuse.server.app", "client": "segfuse.client", "ray": "segfuse.scaleout.serve_ray",
    "torch": "segfuse.torch", "cuda13": "cupy", "nvrtc": "cuda.bindings.nvrtc", "bench": "matplotlib",
    "grpc": "segfuse.server.grpc.server",
}


def test_every_extra_installs_and_its_modules_import(archives, tmp_path):
    extras = set(pyproject()["project"]["optional-dependencies"])
    # cuda12 and cuda13 are both CuPy (one `cupy` module): one venv takes one of them; dev is CI's own
    assert extras == set(EXTRA_IMPORTS) | {"cuda12", "dev"}, "a new extra needs a module to import here"
    wheel = archives["wheel"].as_uri()
    # On top of this interpreter's packages (CI's dev extra has torch and Ray): pip installs what is missing
    bin_dir = venv(tmp_path / "all", f"segfuse[{','.join(sorted(EXTRA_IMPORTS))}] @ {wheel}", system_site=True)
    code = "import importlib\n" + "".join(f"importlib.import_module({m!r})\n" for m in EXTRA_IMPORTS.values())
    r = subprocess.run([str(bin_dir / "python"), "-c", code], capture_output=True, text=True, timeout=scaled(300))
    assert r.returncode == 0, r.stderr
    # The nvrtc extra compiles a graph's kernels without a GPU
    r = subprocess.run([str(bin_dir / "segfuse"), "explain", str(ROOT / "examples" / "moe_problem_sizes.json"),
                        "--shape", "T=64,K=2", "--compile", "sm_90"], capture_output=True, text=True, timeout=scaled(300))
    assert r.returncode == 0 and "for sm_90 with nvrtc-" in r.stdout, r.stdout + r.stderr
    for extra in ("cuda12", "dev"):  # resolvable with the wheel (cuda12 replaces cuda13's CuPy)
        r = subprocess.run([str(bin_dir / "python"), "-m", "pip", "install", "--dry-run", "-q",
                            "--disable-pip-version-check", f"segfuse[{extra}] @ {wheel}"],
                           capture_output=True, text=True, timeout=scaled(600))
        assert r.returncode == 0, f"[{extra}]: {r.stdout}{r.stderr}"
