"""`segfuse serve-ray` on a local Ray cluster with two NumPy shards, through the router (HAProxy) over
HTTP: namespaces land on the shard routing.shard_for names and stay there, every call the SDK makes
works, fusions reach every shard, responses match a direct `segfuse serve`'s byte for byte, the SDK's
direct mode reaches the same shard (and buffers) as the router, /metrics is every shard's and
namespace's, and a shard Ray restarts answers 404 for its lost buffers, saying it restarted. Oracles:
NumPy (np.bincount), the direct server, prometheus_client's parser and the runs made. One cluster for
the module (starting one costs ~12 s here, stopping ~7 s)."""

from __future__ import annotations

import os
import signal
import time

import httpx
import numpy as np
import pytest
from helpers.graphs import MOE_PROBLEM_SIZES
from helpers.processes import free_port
from helpers.servers import LiveServer
from helpers.waiting import scaled
from segfuse.client import Buffer, Client, ClientError
from segfuse.scaleout.routing import shard_for

pytest.importorskip("ray", reason="segfuse serve-ray needs the ray extra")
# A hang guard (times SCALE, tests/conftest.py): on a busy 2-core machine the cluster alone took
# ~150 s to start (its setup counts here), and a killed shard over 60 s to come back.
pytestmark = pytest.mark.timeout(900)

SHARDS = ["shard-0", "shard-1"]
# httpx's 5 s default: a busy 2-core machine took longer to aggregate every shard's /metrics.
_http = httpx.Client(timeout=scaled(120))


def _namespace_on(shard: str, prefix: str) -> str:
    return next(f"{prefix}-{i}" for i in range(100) if shard_for(f"{prefix}-{i}", SHARDS) == shard)


NS0, NS1 = _namespace_on("shard-0", "team"), _namespace_on("shard-1", "team")


def _shard_urls(router: str) -> list[str]:
    return [f"{router}/shards/{s}" for s in SHARDS]


@pytest.fixture(scope="module")
def router():
    from segfuse.scaleout import serve_ray

    port = free_port()
    # CPU 0 reservations: the shards are small, and this machine's 2 cores are shared.
    serve_ray.start(shards=2, backend="numpy", port=port, num_cpus=2, shard_cpus=0)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        serve_ray.stop()


@pytest.fixture(scope="module")
def registered(router):
    with Client(router, namespace=NS0) as c:
        return c.register(MOE_PROBLEM_SIZES)


def test_namespaces_land_on_distinct_shards_and_stay(router):
    ids = np.arange(12).reshape(3, 4)
    with Client(router, namespace=NS0) as a, Client(router, namespace=NS1) as b:
        a.put("only_in_a", ids)
        for _ in range(3):
            np.testing.assert_array_equal(a.get("only_in_a"), ids)
        with pytest.raises(ClientError) as e:
            b.get("only_in_a")
        assert e.value.status == 404
    for ns, shard in ((NS0, "shard-0"), (NS1, "shard-1")):
        r = _http.get(router + "/v2/buffers", headers={"Segfuse-Namespace": ns})
        assert r.headers["Segfuse-Shard"] == shard
        assert ("only_in_a" in {b["name"] for b in r.json()["buffers"]}) == (ns == NS0)
        # GET /v2 is the namespace's shard's metadata: it names the shard (NumPy shards: no GPU)
        meta = _http.get(router + "/v2", headers={"Segfuse-Namespace": ns})
        assert meta.headers["Segfuse-Shard"] == shard
        assert (meta.json()["shard"], meta.json()["gpu"], meta.json()["backend"]) == (shard, None, "numpy")


def test_no_header_is_the_default_namespace(router):
    r = _http.get(router + "/v2")
    assert r.status_code == 200 and r.headers["Segfuse-Shard"] == shard_for("default", SHARDS)
    assert r.json()["shard"] == r.headers["Segfuse-Shard"]


def test_bad_namespace_is_400_naming_the_header(router):
    r = _http.get(router + "/v2/buffers", headers={"Segfuse-Namespace": "no spaces"})
    assert r.status_code == 400
    assert r.json()["details"][0]["loc"] == ["header", "Segfuse-Namespace"]
    assert "Segfuse-Namespace" in r.json()["error"]


def test_health(router):
    assert _http.get(router + "/v2/health/live").json() == {"live": True}
    assert _http.get(router + "/v2/health/ready").json() == {"ready": True}


def test_registration_reaches_every_shard_and_runs_match_numpy(router, registered):
    # a registration goes to every shard; its answer is the namespace's shard's, and says so
    again = _http.post(router + "/v2/fusions", json=MOE_PROBLEM_SIZES, headers={"Segfuse-Namespace": NS1})
    assert again.status_code in (200, 201) and again.headers["Segfuse-Shard"] == "shard-1"
    rng = np.random.default_rng(18)
    for ns in (NS0, NS1):
        with Client(router, namespace=ns) as c:
            assert c.fusion(registered.id)["id"] == registered.id
            ids = rng.integers(0, 16, (64, 4))
            c.put(f"ids_{ns}", ids)
            res = c.run("moe_problem_sizes", inputs={"topk_ids": Buffer(f"ids_{ns}")})
            np.testing.assert_array_equal(res["counts"], np.bincount(ids.ravel(), minlength=16))
            inline = c.run(registered, inputs={"topk_ids": ids[:5]})
            np.testing.assert_array_equal(inline["counts"], np.bincount(ids[:5].ravel(), minlength=16))


def test_responses_match_a_direct_server(router, registered):
    """The same requests to a direct `segfuse serve` and through the router: same status, body and
    headers, but for the ones each HTTP server adds itself and the router's Segfuse-Shard (and a run's
    timings, which differ run to run: its outputs are compared)."""
    direct = LiveServer(backend="numpy").start()
    own = {"date", "server", "x-request-id", "segfuse-shard"}
    data = np.arange(24, dtype=np.float32).tobytes()
    try:
        _http.post(direct.url + "/v2/fusions", json=MOE_PROBLEM_SIZES).raise_for_status()
        calls = [("PUT", "/v2/buffers/raw?dtype=FP32&shape=4,6", {"Content-Type": "application/octet-stream"}, data),
                 ("GET", "/v2/buffers/raw", {"Accept": "application/octet-stream"}, b""),
                 ("GET", "/v2/buffers/raw", {"Accept": "application/json", "Accept-Encoding": "gzip"}, b""),
                 ("GET", "/v2/buffers/missing", {}, b""),
                 ("POST", "/v2/models/moe_problem_sizes/infer", {"Content-Type": "application/json"},
                  b'{"inputs":[{"name":"topk_ids","datatype":"INT64","shape":[2,2],"data":[1,1,3,15]}]}'),
                 ("GET", f"/v2/fusions/{registered.id}/plan?T=64&K=4", {}, b"")]
        for method, path, headers, body in calls:
            want = httpx.request(method, direct.url + path, headers=headers, content=body)
            got = httpx.request(method, router + path, headers={**headers, "Segfuse-Namespace": NS1}, content=body)
            assert got.status_code == want.status_code, (method, path)
            skip = own | ({"content-length"} if "infer" in path else set())
            strip = [(k, v) for k, v in want.headers.multi_items() if k not in skip]
            assert [(k, v) for k, v in got.headers.multi_items() if k not in skip] == strip, (method, path)
            if "infer" in path:
                assert got.json()["outputs"] == want.json()["outputs"]
            else:
                assert got.content == want.content, (method, path)
    finally:
        direct.stop()


DIRECT_GRAPH = {**MOE_PROBLEM_SIZES, "name": "direct_hist"}


def test_direct_mode_reaches_the_shard_and_buffers_the_router_does(router, registered):
    """Client(shards=...) skips the router: for each namespace it reaches the shard the router
    names, and the very runtime: a buffer put directly is read back through the router."""
    rng = np.random.default_rng(7)
    urls = _shard_urls(router)
    for ns in [f"direct-{i}" for i in range(6)]:
        ids = rng.integers(0, 16, (16, 4))
        with Client(shards=urls, namespace=ns) as direct, Client(router, namespace=ns) as via:
            direct.put("x", ids)
            r = _http.get(router + "/v2/buffers/x", headers={"Segfuse-Namespace": ns, "Accept": "application/json"})
            assert r.status_code == 200 and r.headers["Segfuse-Shard"] == direct.shard
            np.testing.assert_array_equal(via.get("x"), ids)
            res = direct.run(registered, inputs={"topk_ids": Buffer("x")})
            np.testing.assert_array_equal(res["counts"], np.bincount(ids.ravel(), minlength=16))
            other = urls[1 - SHARDS.index(direct.shard)]
            assert _http.get(other + "/v2/buffers/x", headers={"Segfuse-Namespace": ns}).status_code == 404


@pytest.fixture(scope="module")
def direct_registered(router):
    """DIRECT_GRAPH registered through a shard's own route (a fixture: under xdist the tests that
    need it may run in another worker, with a cluster of its own, than the one that registers it)."""
    with Client(shards=_shard_urls(router), namespace=NS0) as direct:
        return direct.register(DIRECT_GRAPH, replace=True)


def test_direct_registration_reaches_every_shard(router, direct_registered):
    ref = direct_registered
    ids = np.array([[1, 2], [2, 15]])
    for ns in (NS0, NS1):  # through the router, on both shards
        with Client(router, namespace=ns) as c:
            res = c.run(ref, inputs={"topk_ids": ids})
            np.testing.assert_array_equal(res["counts"], np.bincount(ids.ravel(), minlength=16))


def test_async_direct_mode(router, registered):
    import asyncio

    from segfuse.client import AsyncClient

    ids = np.arange(10).reshape(5, 2)

    async def main():
        async with AsyncClient(shards=_shard_urls(router), namespace="async-direct") as c:
            await c.put("ids", ids)
            return await c.run(registered, inputs={"topk_ids": Buffer("ids")}), await c.get("ids")

    res, back = asyncio.run(main())
    np.testing.assert_array_equal(res["counts"], np.bincount(ids.ravel(), minlength=16))
    with Client(router, namespace="async-direct") as via:
        np.testing.assert_array_equal(via.get("ids"), back)


def test_metrics_are_every_shards_and_namespaces(router, registered):
    from prometheus_client.parser import text_string_to_metric_families

    runs = {_namespace_on("shard-0", "metrics"): 2, _namespace_on("shard-1", "metrics"): 3}
    ids = np.array([[0, 1]])
    for ns, n in runs.items():
        with Client(router, namespace=ns) as c:
            for _ in range(n):
                c.run(registered, inputs={"topk_ids": ids})
    r = _http.get(router + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    families = list(text_string_to_metric_families(r.text))
    assert len({f.name for f in families}) == len(families)  # each family once, its samples together
    ok = {(s.labels["shard"], s.labels["namespace"]): s.value for f in families for s in f.samples
          if s.name == "segfuse_runs_total" and s.labels.get("outcome") == "ok"}
    for ns, n in runs.items():
        assert ok[(shard_for(ns, SHARDS), ns)] == n
    assert {shard for shard, _ in ok} == set(SHARDS) and ("shard-0", "default") in ok
    # segfuse_gpu_info: through the router too, with no sample on NumPy shards (no GPU)
    assert "segfuse_gpu_info" in {f.name for f in families}
    assert not [s for f in families for s in f.samples if s.name == "segfuse_gpu_info"]
    own = list(text_string_to_metric_families(_http.get(_shard_urls(router)[1] + "/metrics").text))
    assert {s.labels["shard"] for f in own for s in f.samples} == {"shard-1"}  # a shard's route: its own


def test_max_namespaces_reaches_the_shard(router):
    import ray
    from segfuse.scaleout.shard_host import ShardHost

    host = ray.remote(ShardHost).options(num_cpus=0).remote("shard-7", {"backend": "numpy"}, 2, "127.0.0.1")
    try:
        where = ray.get(host.address.remote())
        url = f"http://{where['host']}:{where['port']}"
        with Client(url, namespace="one") as c:
            c.put("x", np.arange(3))  # the default namespace and this one: 2
        with Client(url, namespace="two", retries=0) as c:
            with pytest.raises(ClientError, match="holds 2 namespaces") as e:
                c.put("x", np.arange(3))
        assert e.value.status == 429
    finally:
        ray.kill(host, no_restart=True)


def _kill_replica(shard: str) -> None:
    """SIGKILL the shard's process (as a crash would; no graceful shutdown)."""
    import ray

    pid = ray.get(ray.get_actor(f"segfuse-{shard}", namespace="segfuse").address.remote())["pid"]
    os.kill(pid, signal.SIGKILL)


def test_a_restarted_shard_says_so_and_works(router, registered, direct_registered):
    ids = np.arange(8).reshape(4, 2)
    # Ray starts a new shard process; on a busy 2-core machine that took over 60 s.
    with Client(router, namespace=NS1, retries=0, timeout=scaled(300)) as b, Client(router, namespace=NS0) as a:
        b.put("lost", ids)
        a.put("kept", ids)
        _kill_replica("shard-1")
        deadline, seen = time.monotonic() + scaled(300), []
        while True:  # Ray notices the death and starts a new shard: the router says 503 meanwhile
            try:
                b.get("lost")
                seen.append(200)  # answered before the shard was gone
            except ClientError as e:
                if e.status == 404:
                    break
                seen.append((e.status, e.message))
            assert time.monotonic() < deadline, "shard-1 did not come back"
            time.sleep(0.2)
        # Between the kill and the new shard: the old answer, the router's 503 that the SDK retries,
        # or, for the request that met the dead shard's kept-alive connection, the connection closed
        # without an answer (as a crashed `segfuse serve` does; the SDK sends a GET again); never a
        # 5xx of another kind, never a hang.
        lost = [x for x in seen if x != 200 and x[0] is None]
        assert len(lost) <= 1 and all("disconnected" in x[1] for x in lost), seen
        assert all(x == 200 or x[0] is None or (x[0] == 503 and "shard shard-1 is unavailable" in x[1])
                   for x in seen), seen
        with pytest.raises(ClientError, match="shard shard-1 restarted at") as e:
            b.get("lost")
        assert e.value.status == 404
        with Client(shards=_shard_urls(router), namespace=NS1) as direct:  # direct mode: the same 404
            with pytest.raises(ClientError, match="shard shard-1 restarted at"):
                direct.get("lost")
        np.testing.assert_array_equal(a.get("kept"), ids)  # the other shard's buffers are untouched
        # The new shard works, and has the fusions registered before, through the router and
        # directly (replayed from the registry).
        b.put("again", ids)
        for name in ("moe_problem_sizes", "direct_hist"):
            res = b.run(name, inputs={"topk_ids": Buffer("again")})
            np.testing.assert_array_equal(res["counts"], np.bincount(ids.ravel(), minlength=16))


def _routed(argv: list[str], port: int, env: dict):
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "import sys; from segfuse.cli import main; sys.exit(main())",
                             "serve-ray", *argv, "--port", str(port)], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + scaled(300)
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/router/live", timeout=5).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"the router did not start: {proc.stderr.read()[-3000:]}")
        time.sleep(0.3)


# Opt-in: under CI's load (two test workers on 2 cores) the first router's Ray Client join died without a word
# in 2 of 4 clean-clone runs, cause not found yet; alone it passes (SEGFUSE_TEST_RAY_CLIENT=1 runs it).
@pytest.mark.skipif(os.environ.get("SEGFUSE_TEST_RAY_CLIENT") != "1",
                    reason="flaky under load (a Ray Client join dies silently); SEGFUSE_TEST_RAY_CLIENT=1 runs it")
def test_routers_that_join_a_cluster_share_its_shards_which_outlive_them():
    """docker/kuberay.yaml's design on one machine: a Ray cluster of its own (`ray start --head`), and
    routers that join it from outside through Ray Client (ray://): the first creates the shards, a
    second finds the same ones, with their buffers, after the first stopped (SIGTERM)."""
    import shutil
    import subprocess
    import tempfile

    # Its own short folder (a socket path under it may be 107 bytes at most): no ray.init() elsewhere
    # finds this cluster, and its processes are told apart by it.
    temp = tempfile.mkdtemp(prefix="sfray-", dir="/tmp")
    gcs, client = free_port(), free_port()
    env = {**os.environ, "SEGFUSE_LOG_LEVEL": "warning", "RAY_AUTH_MODE": os.environ.get("RAY_AUTH_MODE", "token"),
           # Ray Client's server per client must answer within this (30 s by default): a loaded 2-core
           # machine took longer to start one
           "RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S": str(int(scaled(300)))}
    env.pop("SEGFUSE_TOKEN", None)
    started = subprocess.run(["ray", "start", "--head", "--temp-dir", str(temp), "--port", str(gcs),
                              "--ray-client-server-port", str(client), "--num-cpus", "2", "--include-dashboard",
                              "false", "--disable-usage-stats"], env=env, capture_output=True, text=True,
                             timeout=scaled(300))
    assert started.returncode == 0, started.stderr[-3000:]
    argv = ["--address", f"ray://127.0.0.1:{client}", "--shards", "2", "--shard-cpus", "0"]
    first = second = None
    try:
        first = _routed(argv, free_port(), env)
        url = f"http://127.0.0.1:{first.args[-1]}"
        ids = np.arange(12).reshape(3, 4) % 16
        for ns in (NS0, NS1):  # a namespace on each shard
            with Client(url, namespace=ns) as c:
                c.put("kept", ids)
        first.send_signal(signal.SIGTERM)
        assert first.wait(scaled(60)) == 0
        second = _routed(argv, free_port(), env)
        url = f"http://127.0.0.1:{second.args[-1]}"
        for ns in (NS0, NS1):
            with Client(url, namespace=ns) as c:
                np.testing.assert_array_equal(c.get("kept"), ids)
                c.register(MOE_PROBLEM_SIZES)
                res = c.run("moe_problem_sizes", inputs={"topk_ids": Buffer("kept")})
                np.testing.assert_array_equal(res["counts"], np.bincount(ids.ravel(), minlength=16))
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(scaled(60))
                except subprocess.TimeoutExpired:
                    proc.kill()
        # this cluster's processes only (not `ray stop`: every cluster's), Ray Client's servers by its GCS
        for pid in _processes_with(temp, f":{gcs} "):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(temp, ignore_errors=True)


def _processes_with(*markers: str) -> list[int]:
    """The processes whose command line holds any of `markers` (arguments joined by spaces)."""
    from pathlib import Path

    pids = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                line = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if any(m in line for m in markers):
                pids.append(int(d.name))
    return pids
