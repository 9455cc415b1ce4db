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


def test_the_router_answers_its_own_liveness_whatever_the_shards(router):
    client, _ = router
    r = client.get("/router/live")
    assert r.status_code == 200 and "Segfuse-Shard" not in r.headers  # HAProxy's, not a shard's


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


def test_a_host_name_is_followed_through_dns_and_the_configuration_is_valid(tmp_path):
    """Shards named by host name (a StatefulSet's pods): HAProxy resolves them at start when it can,
    starts without them when it cannot, and follows them through the resolvers."""
    cfg = haproxy_config({"shard-0": ("segfuse-shard-0.segfuse-shard", 8000), "shard-1": ("127.0.0.1", 9001)},
                         ("127.0.0.1", 9000), ("127.0.0.1", 9002))
    assert "resolvers dns" in cfg and cfg.count("init-addr last,libc,none") == 1  # the IP needs none
    path = tmp_path / "router.cfg"
    path.write_text(cfg)
    check = subprocess.run([HAPROXY, "-c", "-f", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr


def test_busy_polling_runs_one_haproxy_thread_that_still_routes_by_namespace(tmp_path):
    """--busy-poll: one thread (a spinning thread per core would take every core from the shards),
    and the requests reach the same shards as without it."""
    ids = ["shard-0", "shard-1"]
    servers = {sid: _stand_in(sid) for sid in ids}
    port, admin = _free_port(), str(tmp_path / "admin.sock")
    cfg = haproxy_config({sid: ("127.0.0.1", s.server_address[1]) for sid, s in servers.items()},
                         ("127.0.0.1", port), ("127.0.0.1", servers["shard-0"].server_address[1]),
                         admin_socket=admin, busy_polling=True)
    assert "    busy-polling\n" in cfg and "    nbthread 1\n" in cfg
    assert "busy-polling" not in haproxy_config({"shard-0": ("127.0.0.1", 9001)}, ("127.0.0.1", 9000),
                                                ("127.0.0.1", 9002))
    path = tmp_path / "router.cfg"
    path.write_text(cfg)
    proc = subprocess.Popen([HAPROXY, "-db", "-f", str(path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/router/live", timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and proc.poll() is None, "haproxy did not start"
                time.sleep(0.05)
        for ns in ("a", "b", "c", "d"):
            r = httpx.get(f"http://127.0.0.1:{port}/v2/buffers", headers={"Segfuse-Namespace": ns})
            assert r.text.split()[0] == shard_for(ns, ids)
        with socket.socket(socket.AF_UNIX) as s:
            s.connect(admin)
            s.sendall(b"show info\n")
            info = b"".join(iter(lambda: s.recv(65536), b"")).decode()
        assert "\nNbthread: 1\n" in info
    finally:
        proc.kill()
        proc.wait(10)
        for s in servers.values():
            s.shutdown()


def test_segfuse_route_passes_busy_polling_to_the_router(monkeypatch, capsys):
    from segfuse.cli import main
    from segfuse.scaleout import cluster

    seen = []

    def refuse(*args):
        seen.append(args)
        raise RuntimeError("stopped here by the test")

    monkeypatch.setattr(cluster, "LocalRouter", refuse)
    assert main(["route", "--busy-poll", "shard-0=127.0.0.1:9001"]) == 2
    assert main(["route", "shard-0=127.0.0.1:9001"]) == 2
    assert [a[-1] for a in seen] == [True, False] and "stopped here by the test" in capsys.readouterr().err


def _serve_shard(sid: str, port: int) -> subprocess.Popen:
    import os
    import sys

    env = {**os.environ, "SEGFUSE_LOG_LEVEL": "warning", "SEGFUSE_KEEP_ALIVE_TIMEOUT": "300"}
    env.pop("SEGFUSE_TOKEN", None)
    return subprocess.Popen([sys.executable, "-c", "import sys; from segfuse.cli import main; sys.exit(main())",
                             "serve", "--backend", "numpy", "--port", str(port), "--shard-id", sid], env=env)


def test_segfuse_route_serves_shards_that_run_elsewhere():
    """`segfuse route SHARD=HOST:PORT ...` in front of two `segfuse serve --shard-id` processes: each
    namespace's buffers live on the shard shard_for names, registrations reach both, SIGTERM stops it."""
    import os
    import signal
    import sys

    import numpy as np
    from helpers.graphs import MOE_PROBLEM_SIZES
    from segfuse.client import Buffer, Client

    ids = ["shard-0", "shard-1"]
    ports = {sid: _free_port() for sid in ids}
    shards = [_serve_shard(sid, p) for sid, p in ports.items()]
    port = _free_port()
    route = subprocess.Popen([sys.executable, "-c", "import sys; from segfuse.cli import main; sys.exit(main())",
                              "route", "--port", str(port), *(f"{s}=127.0.0.1:{p}" for s, p in ports.items())],
                             env={**os.environ}, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(url + "/v2/health/ready", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and route.poll() is None, "the router did not become ready"
            time.sleep(0.2)
        with Client(url) as c:
            c.register(MOE_PROBLEM_SIZES)
        for sid in ids:
            ns = next(f"n{k}" for k in range(100) if shard_for(f"n{k}", ids) == sid)
            x = np.arange(24).reshape(6, 4) % 16
            with Client(url, namespace=ns) as c:
                c.put("x", x)
                got = c.run("moe_problem_sizes", inputs={"topk_ids": Buffer("x")})["counts"]
            np.testing.assert_array_equal(got, np.bincount(x.ravel(), minlength=16))
            own = httpx.get(f"http://127.0.0.1:{ports[sid]}/v2/buffers/x", headers={"Segfuse-Namespace": ns})
            assert own.status_code == 200  # on its shard, in its namespace
        route.send_signal(signal.SIGTERM)
        assert route.wait(30) == 0
        with pytest.raises(httpx.TransportError):
            httpx.get(url + "/v2/health/live", timeout=2)
    finally:
        for p in [route, *shards]:
            p.kill()
            p.wait(30)


@pytest.mark.parametrize("argv, message", [(["shard-0"], "SHARD=HOST:PORT"),
                                           (["shard-0=h:1", "shard-0=h:2"], "given twice"),
                                           (["shard-0=h:1", "shard-2=h:2"], "must be shard-0, shard-1")])
def test_segfuse_route_refuses_a_bad_shard_list(argv, message, capsys):
    from segfuse.cli import main

    assert main(["route", *argv]) == 2
    assert message in capsys.readouterr().err
