"""A real Triton 2.51.0 for the conformance suite: benchmarks/triton_setup.sh (PyPI wheels in their own venv) run
once into a cache folder outside the clone, under a file lock so that pytest-xdist's workers install it once.

A layout counts as complete only once its marker is written, last, holding the digest of triton_setup.sh: a
half-finished install (an interrupted run, a failed pip) or one laid out by an older script is wiped and redone."""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
from filelock import FileLock

ROOT = Path(__file__).resolve().parents[2]
SETUP = ROOT / "benchmarks" / "triton_setup.sh"
VERSION = "2.51.0"
MIN_GLIBC = (2, 35)  # the nvidia-pytriton 0.7.0 wheel is manylinux_2_35_x86_64
MARKER = "COMPLETE"
INSTALL_SECONDS = 900


class InstallError(RuntimeError):
    """triton_setup.sh failed; the message ends with its output."""


def layout_dir() -> Path:
    """SEGFUSE_TRITON_DIR, else $XDG_CACHE_HOME (or ~/.cache)/segfuse/triton-2.51.0."""
    if os.environ.get("SEGFUSE_TRITON_DIR"):
        return Path(os.environ["SEGFUSE_TRITON_DIR"]).expanduser().resolve()
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "segfuse" / f"triton-{VERSION}"


def platform_problem() -> str | None:
    """Why the wheel cannot run on this machine, or None."""
    system, machine = platform.system(), platform.machine()
    if system != "Linux" or machine not in ("x86_64", "AMD64"):
        return f"the tritonserver wheel is for Linux x86-64, this is {system} {machine}"
    libc, version = platform.libc_ver()
    if libc != "glibc":
        return f"the tritonserver wheel needs glibc, this C library is {libc or 'unknown'}"
    have = tuple(int(x) for x in version.split(".")[:2])
    if have < MIN_GLIBC:
        return f"the tritonserver wheel needs glibc >= 2.35, this is {version}"
    return None


def _digest() -> str:
    return hashlib.sha256(SETUP.read_bytes()).hexdigest()


def is_complete(dest: Path) -> bool:
    marker = dest / MARKER
    return marker.is_file() and marker.read_text().strip() == _digest()


def ensure_layout(dest: Path | None = None) -> Path:
    """The folder of a complete layout (env.sh, server/, venv/ with perf_analyzer), installing it if needed."""
    dest = dest or layout_dir()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(dest) + ".lock", timeout=INSTALL_SECONDS + 60):
        if is_complete(dest):
            return dest
        shutil.rmtree(dest, ignore_errors=True)
        env = {**os.environ, "DEST": str(dest), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        try:
            r = subprocess.run(["bash", str(SETUP)], env=env, capture_output=True, text=True,
                               timeout=INSTALL_SECONDS)
        except subprocess.TimeoutExpired as e:
            raise InstallError(f"triton_setup.sh ran past {INSTALL_SECONDS} s") from e
        missing = [p for p in ("env.sh", "server/bin/tritonserver", "venv/bin/perf_analyzer")
                   if not (dest / p).exists()]
        if r.returncode != 0 or missing:
            raise InstallError(f"triton_setup.sh exited {r.returncode}" + (f", missing {missing}" if missing else "")
                               + f":\n{(r.stdout + r.stderr)[-3000:]}")
        tmp = dest / (MARKER + ".tmp")
        tmp.write_text(_digest() + "\n")
        tmp.replace(dest / MARKER)
    return dest


def index_problem() -> str | None:
    """Why pip cannot reach its package index (PIP_INDEX_URL or PyPI), or None when it answers."""
    index = os.environ.get("PIP_INDEX_URL")
    if not index:
        r = subprocess.run([sys.executable, "-m", "pip", "config", "get", "global.index-url"], capture_output=True,
                           text=True)
        index = r.stdout.strip() if r.returncode == 0 and r.stdout.strip() else "https://pypi.org/simple"
    url = index.rstrip("/") + "/nvidia-pytriton/"
    try:
        httpx.get(url, timeout=15, follow_redirects=True).raise_for_status()
    except httpx.HTTPError as e:
        return f"PyPI unreachable ({url}: {type(e).__name__}: {e})"
    return None
