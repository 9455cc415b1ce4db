"""The router's HAProxy configuration (segfuse.scaleout.router) run by a real HAProxy in front of stand-in
shards: every request reaches the shard `shard_for` names for its namespace (the SDK's direct mode
picks the same), requests without the header the default namespace's shard, and the requests every
shard must see the control endpoint. The stand-ins answer with their own name and the request line."""

from __future__ import annotations

import http.server
import shutil
import socket
import subprocess
import threading
import time

import httpx
import pytest
from segfuse.scaleout.router import haproxy_config
from segfuse.scaleout.routing import shard_for

HAPROXY = shutil.which("haproxy")
pytestmark = pytest.mark.skipif(HAPROXY is None, reason="no haproxy on PATH (.ci/run installs Debian's)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stand_in(name: str):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _answer(self):
            n = int(self.headers.get("content-length") or 0)
            self.rfile.read(n)
            body = f"{name} {self.command} {self.path} {self.headers.get('segfuse-namespace')}".encode()
            self.send_response(200)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_DELETE = do_PUT = _answer

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture(scope="module")
def router(tmp_path_factory):
    ids = [f"shard-{i}" for i in range(4)]
    servers = {sid: _stand_in(sid) for sid in ids}
    control = _stand_in("control")
    port = _free_port()
    cfg = haproxy_config({sid: ("127.0.0.1", s.server_address[1]) for sid, s in servers.items()},
                         ("127.0.0.1", port), ("127.0.0.1", control.server_address[1]))
    path = tmp_path_factory.mktemp("router") / "router.cfg"
    path.write_text(cfg)
    check = subprocess.run([HAPROXY, "-c", "-f", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    proc = subprocess.Popen([HAPROXY, "-db", "-f", str(path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            httpx.get(url + "/v2", timeout=1)
            break
        except httpx.TransportError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail(f"haproxy did not start: {proc.stdout.read().decode()}")
            time.sleep(0.05)
    with httpx.Client(base_url=url, timeout=10) as client:
        yield client, ids
    proc.terminate()
    proc.wait(10)
    for s in [*servers.values(), control]:
        s.shutdown()


def test_each_namespace_reaches_the_shard_shard_for_names(router):
    client, ids = router
    seen = set()
    for k in range(300):
        ns = f"tenant-{k}"
        r = client.get("/v2/models/m/infer", headers={"Segfuse-Namespace": ns})
        want = shard_for(ns, ids)
        assert r.status_code == 200 and r.text == f"{want} GET /v2/models/m/infer {ns}", ns
        seen.add(want)
    assert seen == set(ids)  # every shard holds some of 300 namespaces


def test_a_request_without_the_header_reaches_the_default_namespaces_shard(router):
    client, ids = router
    r = client.post("/v2/models/m/infer", content=b"{}")
    assert r.text.split()[0] == shard_for("default", ids)


@pytest.mark.parametrize("method, path", [("POST", "/v2/fusions"), ("POST", "/v2/fusions/"),
                                          ("DELETE", "/v2/fusions/abc"), ("POST", "/v2/repository/models/m/load"),
                                          ("POST", "/v2/repository/models/m/unload"), ("GET", "/metrics"),
                                          ("GET", "/v2/health/ready")])
def test_requests_every_shard_must_see_reach_the_control_endpoint(router, method, path):
    client, _ = router
    r = client.request(method, path, headers={"Segfuse-Namespace": "tenant-1"}, content=b"{}")
    assert r.text.startswith(f"control {method} {path}")


@pytest.mark.parametrize("method, path", [("GET", "/v2/fusions"), ("GET", "/v2/fusions/abc"),
                                          ("DELETE", "/v2/buffers/b"), ("GET", "/v2/health/live"),
                                          ("POST", "/v2/fusions/abc/x")])
def test_other_requests_reach_the_namespaces_shard(router, method, path):
    client, ids = router
    r = client.request(method, path, headers={"Segfuse-Namespace": "tenant-7"})
    assert r.text.split()[0] == shard_for("tenant-7", ids)


@pytest.mark.parametrize("method, path", [("POST", "/v2/fusions"), ("GET", "/metrics"), ("GET", "/v2/buffers/b")])
def test_a_shards_own_prefix_reaches_that_shard_below_the_prefix(router, method, path):
    """The SDK's direct mode: /shards/<id>/... goes to shard <id> whatever the namespace, without the
    prefix, and is not broadcast (a direct client sends a registration to every shard itself)."""
    client, ids = router
    for sid in ids:
        r = client.request(method, f"/shards/{sid}{path}", headers={"Segfuse-Namespace": "tenant-7"}, content=b"{}")
        assert r.text == f"{sid} {method} {path} tenant-7"
        assert r.headers["Segfuse-Shard"] == sid


def test_answers_name_the_shard_that_gave_them(router):
    client, ids = router
    for ns in ("a", "b", "c", "d"):
        r = client.get("/v2/buffers", headers={"Segfuse-Namespace": ns})
        assert r.headers["Segfuse-Shard"] == r.text.split()[0] == shard_for(ns, ids)


def test_a_shard_that_is_down_answers_503_naming_it_and_others_still_work(tmp_path):
    ids = ["shard-0", "shard-1"]
    live = _stand_in("shard-0")
    gone = _free_port()  # nothing listens here
    port = _free_port()
    path = tmp_path / "router.cfg"
    path.write_text(haproxy_config({"shard-0": ("127.0.0.1", live.server_address[1]), "shard-1": ("127.0.0.1", gone)},
                                   ("127.0.0.1", port), ("127.0.0.1", live.server_address[1])))
    proc = subprocess.Popen([HAPROXY, "-db", "-f", str(path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        down = next(f"t{k}" for k in range(100) if shard_for(f"t{k}", ids) == "shard-1")
        up = next(f"t{k}" for k in range(100) if shard_for(f"t{k}", ids) == "shard-0")
        deadline = time.monotonic() + 20
        while True:
            try:
                r = httpx.get(url + "/v2/buffers", headers={"Segfuse-Namespace": down}, timeout=5)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and proc.poll() is None
                time.sleep(0.05)
        assert r.status_code == 503 and r.headers["Retry-After"] == "1"
        assert r.json()["details"][0]["loc"] == ["shards", "shard-1"] and "shard-1 is unavailable" in r.json()["error"]
        assert httpx.get(url + "/v2/buffers", headers={"Segfuse-Namespace": up}).text.startswith("shard-0 GET")
    finally:
        proc.kill()
        proc.wait(10)
        live.shutdown()


def test_the_configuration_refuses_what_would_break_it():
    ok = {"shard-0": ("127.0.0.1", 9001)}
    with pytest.raises(ValueError, match="at least one shard"):
        haproxy_config({}, ("127.0.0.1", 9000), ("127.0.0.1", 9002))
    with pytest.raises(ValueError, match="port"):
        haproxy_config(ok, ("127.0.0.1", 0), ("127.0.0.1", 9002))
    with pytest.raises(ValueError, match="shard id"):
        haproxy_config({"shard 0\n": ("127.0.0.1", 9001)}, ("127.0.0.1", 9000), ("127.0.0.1", 9002))
    with pytest.raises(ValueError, match="host"):
        haproxy_config(ok, ("bad host", 9000), ("127.0.0.1", 9002))
