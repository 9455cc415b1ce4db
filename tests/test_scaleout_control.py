"""The scale-out control app (segfuse.scaleout.control) in front of two real `segfuse serve` NumPy servers
standing in for shards, itself under uvicorn: registrations and removals reach every shard and answer as
the namespace's home shard; other requests reach the home shard unchanged (a gzip body too); /metrics
merges every shard's; readiness and broadcasts name a shard that stopped; the shards' token applies.
Oracles: np.bincount and NumPy for the runs, each shard asked directly, prometheus_client's parser,
shard_for for the home shard, and a direct `segfuse serve`'s own headers."""

from __future__ import annotations

import gzip
import json
import threading

import httpx
import numpy as np
import pytest
from helpers.graphs import ELEMENTWISE_CHAIN, MOE_PROBLEM_SIZES, counts_of
from helpers.servers import LiveServer
from helpers.waiting import scaled, wait_until
from segfuse.scaleout.control import create_control_app, set_shards
from segfuse.scaleout.routing import shard_for

TOKEN = "control-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
IDS = ("shard-0", "shard-1")


class ControlServer:
    """The control app under a real uvicorn server on a free loopback port, in a thread."""

    def __init__(self, app):
        import uvicorn

        self.app = app
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                                   lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> str:
        self.thread.start()
        wait_until(lambda: self.server.started or not self.thread.is_alive(), 30, "the control app's uvicorn")
        assert self.server.started, "the control app's uvicorn did not start"
        return f"http://127.0.0.1:{self.server.servers[0].sockets[0].getsockname()[1]}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=scaled(30))


def shard_server(shard: str) -> LiveServer:
    server = LiveServer(token=TOKEN)
    server.app.state.server_state.shard = shard  # segfuse_gpu_info's label (no sample on NumPy)
    return server


@pytest.fixture(scope="module")
def cluster():
    """(control client, control app, {shard id: direct client}, {shard id: URL})."""
    servers = {sid: shard_server(sid) for sid in IDS}
    started, clients = [], []
    try:
        for s in servers.values():
            started.append(s.start())
        urls = {sid: s.url for sid, s in servers.items()}
        control = ControlServer(create_control_app(urls, timeout_s=scaled(60)))
        control_url = control.start()
        try:
            timeout = scaled(60)
            direct = {sid: httpx.Client(base_url=u, headers=AUTH, timeout=timeout) for sid, u in urls.items()}
            clients = [*direct.values(), httpx.Client(base_url=control_url, headers=AUTH, timeout=timeout)]
            yield clients[-1], control.app, direct, urls
        finally:
            for c in clients:
                c.close()
            control.stop()
    finally:
        for s in started:
            s.stop()


def namespace_on(shard: str, ids=IDS) -> str:
    """A namespace whose home shard is `shard`."""
    return next(f"ns-{k}" for k in range(1000) if shard_for(f"ns-{k}", ids) == shard)


def moe_infer(ids: np.ndarray) -> dict:
    return {"inputs": [{"name": "topk_ids", "datatype": "INT64", "shape": list(ids.shape),
                        "data": ids.ravel().tolist()}]}


def test_a_registration_reaches_every_shard_answers_as_the_home_shard_and_removal_too(cluster):
    control, _, direct, _ = cluster
    ns = namespace_on("shard-1")
    r = control.post("/v2/fusions", json=MOE_PROBLEM_SIZES, headers={"Segfuse-Namespace": ns, "X-Request-Id": "reg-1"})
    assert r.status_code == 201, r.text
    assert r.headers["segfuse-shard"] == "shard-1" and r.headers["x-request-id"] == "reg-1"
    assert r.json()["name"] == "moe_problem_sizes" and r.json()["created"] is True
    ids = np.array([[0, 3], [3, 15], [7, 3]], np.int64)
    for sid, c in direct.items():  # runnable on both shards, asked directly
        out = c.post("/v2/models/moe_problem_sizes/infer", json=moe_infer(ids))
        assert out.status_code == 200, (sid, out.text)
        assert out.json()["outputs"][0]["data"] == counts_of(ids).tolist()
    r = control.delete("/v2/fusions/moe_problem_sizes", headers={"Segfuse-Namespace": namespace_on("shard-0")})
    assert r.status_code == 200 and r.headers["segfuse-shard"] == "shard-0", r.text
    for c in direct.values():
        assert c.get("/v2/fusions/moe_problem_sizes").status_code == 404
        assert c.post("/v2/models/moe_problem_sizes/infer", json=moe_infer(ids)).status_code == 404


def test_a_registration_through_control_has_the_headers_of_a_direct_one(cluster):
    control, _, direct, _ = cluster
    got = control.post("/v2/fusions", json=MOE_PROBLEM_SIZES, headers={"X-Request-Id": "same-id"})
    try:
        home = shard_for("default", IDS)
        assert got.status_code == 201 and got.headers["segfuse-shard"] == home
        direct[home].delete("/v2/fusions/moe_problem_sizes")
        want = direct[home].post("/v2/fusions", json=MOE_PROBLEM_SIZES, headers={"X-Request-Id": "same-id"})
        assert want.status_code == 201 and got.content == want.content
        seen = sorted((k, v) for k, v in got.headers.multi_items() if k not in ("segfuse-shard", "date"))
        assert seen == sorted((k, v) for k, v in want.headers.multi_items() if k != "date")
        assert len(got.headers.get_list("date")) == 1  # one Date, the control's server's
    finally:
        control.delete("/v2/fusions/moe_problem_sizes")


def test_shards_that_refuse_alike_give_the_home_shards_answer(cluster):
    control, _, direct, _ = cluster
    bad = {**MOE_PROBLEM_SIZES, "ops": [{"op": "no_such_op", "out": "counts", "inputs": ["topk_ids"]}]}
    ns = namespace_on("shard-0")
    r = control.post("/v2/fusions", json=bad, headers={"Segfuse-Namespace": ns})
    want = direct["shard-0"].post("/v2/fusions", json=bad)
    assert 400 <= want.status_code < 500
    assert (r.status_code, r.json()) == (want.status_code, want.json())
    assert r.headers["segfuse-shard"] == "shard-0"


def test_shards_that_disagree_give_502_listing_each_and_the_shards_that_could_apply_it_did(cluster):
    control, _, direct, _ = cluster
    assert direct["shard-0"].post("/v2/fusions", json=MOE_PROBLEM_SIZES).status_code == 201  # on shard-0 only
    r = control.delete("/v2/fusions/moe_problem_sizes")
    assert r.status_code == 502 and "segfuse-shard" not in r.headers
    assert "shard-0: 200, shard-1: 404" in r.json()["error"] and r.json()["details"][0]["loc"] == ["shards"]
    assert direct["shard-0"].get("/v2/fusions/moe_problem_sizes").status_code == 404  # removed where it was


def test_other_requests_reach_the_home_shard_unchanged_and_follow_set_shards(cluster):
    control, app, direct, urls = cluster
    assert direct["shard-0"].put("/v2/buffers/x", json={"dtype": "int64", "shape": [3], "data": [4, 5, 6]}).status_code == 201
    on_0, on_1 = namespace_on("shard-0"), namespace_on("shard-1")
    control.headers["Accept"] = "application/json"  # the buffer as JSON, not .npy
    try:
        r = control.get("/v2/buffers/x", headers={"Segfuse-Namespace": on_0})
        assert r.status_code == 200 and r.json()["data"] == [4, 5, 6] and r.headers["segfuse-shard"] == "shard-0"
        r = control.get("/v2/buffers/x", headers={"Segfuse-Namespace": on_1})
        assert r.status_code == 404 and r.headers["segfuse-shard"] == "shard-1"
        set_shards(app, {"shard-0": urls["shard-1"], "shard-1": urls["shard-0"] + "/"})  # the servers swap
        assert control.get("/v2/buffers/x", headers={"Segfuse-Namespace": on_0}).status_code == 404
        assert control.get("/v2/buffers/x", headers={"Segfuse-Namespace": on_1}).json()["data"] == [4, 5, 6]
    finally:
        set_shards(app, urls)
        del control.headers["Accept"]
        direct["shard-0"].delete("/v2/buffers/x")


def test_a_large_answer_comes_back_compressed_as_the_shard_sent_it(cluster):
    control, _, direct, _ = cluster
    ns = namespace_on("shard-1")
    assert control.post("/v2/fusions", json=ELEMENTWISE_CHAIN).status_code == 201
    try:
        rng = np.random.default_rng(7)
        a, b, c = (rng.standard_normal(512).astype(np.float32) for _ in range(3))
        body = {"inputs": [{"name": n, "datatype": "FP32", "shape": [512], "data": v.tolist()}
                           for n, v in zip("abc", (a, b, c))]}
        with httpx.stream("POST", str(control.base_url) + "/v2/models/elementwise_chain/infer", json=body,
                          headers={**AUTH, "Segfuse-Namespace": ns, "Accept-Encoding": "gzip"}) as r:
            raw = b"".join(r.iter_raw())
        assert r.status_code == 200 and r.headers["content-encoding"] == "gzip"
        assert int(r.headers["content-length"]) == len(raw) and r.headers["segfuse-shard"] == "shard-1"
        got = np.asarray(json.loads(gzip.decompress(raw))["outputs"][0]["data"], np.float32)
        want = np.where(a > 0, a * b + c, np.exp(c) * np.float32(0.5))
        np.testing.assert_allclose(got, want, rtol=1e-6)
    finally:
        control.delete("/v2/fusions/elementwise_chain")


def runs_ok(text: str) -> list[float]:
    from prometheus_client.parser import text_string_to_metric_families

    families = list(text_string_to_metric_families(text))
    names = [f.name for f in families]
    assert len(names) == len(set(names)), "a metric family appears more than once"
    return [s.value for f in families for s in f.samples
            if s.name == "segfuse_runs_total" and s.labels.get("outcome") == "ok"]


def test_metrics_are_every_shards_in_one_exposition(cluster):
    control, _, direct, _ = cluster
    assert control.post("/v2/fusions", json=MOE_PROBLEM_SIZES).status_code == 201
    try:
        ids = np.array([[1, 2]], np.int64)
        for sid, n in (("shard-0", 1), ("shard-1", 3)):  # different counts: each shard's sample is told apart
            for _ in range(n):
                assert direct[sid].post("/v2/models/moe_problem_sizes/infer", json=moe_infer(ids)).status_code == 200
        each = {sid: runs_ok(c.get("/metrics").text) for sid, c in direct.items()}
        assert len(each["shard-0"]) == len(each["shard-1"]) == 1 and each["shard-0"] != each["shard-1"]
        r = control.get("/metrics", headers={"Accept-Encoding": "gzip"})
        assert r.status_code == 200 and "content-encoding" not in r.headers
        assert sorted(runs_ok(r.text)) == sorted(each["shard-0"] + each["shard-1"])
        assert r.text.count("# TYPE segfuse_runs_total ") == 1
        refused = httpx.get(str(control.base_url) + "/metrics")  # no token: the shards' 401 passes through
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        assert refused.json()["error"] == "missing bearer token"
    finally:
        control.delete("/v2/fusions/moe_problem_sizes")


def test_the_shards_token_applies_through_control(cluster):
    control, _, direct, _ = cluster
    base = str(control.base_url)
    r = httpx.post(base + "/v2/fusions", json=MOE_PROBLEM_SIZES)  # every shard refuses alike: the home's 401
    assert r.status_code == 401 and r.headers["segfuse-shard"] == shard_for("default", IDS)
    assert all(c.get("/v2/fusions/moe_problem_sizes").status_code == 404 for c in direct.values())
    r = httpx.get(base + "/v2/buffers", headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401 and r.json()["error"] == "invalid bearer token"
    assert control.get("/v2/buffers").status_code == 200  # with the token
    assert httpx.get(base + "/v2/health/ready").json() == {"ready": True}  # open, as on a shard


def test_a_bad_namespace_is_400_and_live_is_answered_by_control_itself(cluster):
    control, app, _, urls = cluster
    r = control.get("/v2/buffers", headers={"Segfuse-Namespace": "no spaces!"})
    assert r.status_code == 400 and r.json()["details"][0]["loc"] == ["header", "Segfuse-Namespace"]
    assert "segfuse-shard" not in r.headers
    set_shards(app, {sid: "http://127.0.0.1:9" for sid in IDS})  # nothing listens: live does not ask
    try:
        r = control.get("/v2/health/live")
        assert r.status_code == 200 and r.json() == {"live": True}
        assert control.get("/v2/health/ready").status_code == 503
    finally:
        set_shards(app, urls)
    with pytest.raises(ValueError, match="at least one shard"):
        set_shards(app, {})


def test_a_stopped_shard_makes_readiness_and_broadcasts_503_and_its_namespaces_retryable(cluster):
    control, app, direct, urls = cluster
    third = shard_server("shard-2").start()
    ids = (*IDS, "shard-2")
    set_shards(app, {**urls, "shard-2": third.url})
    try:
        assert control.get("/v2/health/ready").json() == {"ready": True}
        on_2 = namespace_on("shard-2", ids)
        assert control.get("/v2/buffers", headers={"Segfuse-Namespace": on_2}).status_code == 200  # a kept connection
        third.stop()
        r = control.get("/v2/health/ready")
        assert r.status_code == 503 and r.json()["error"] == "not ready: shards shard-2"
        r = control.get("/v2/buffers", headers={"Segfuse-Namespace": on_2})
        assert r.status_code == 503 and r.headers["retry-after"] == "1" and r.headers["segfuse-shard"] == "shard-2"
        assert r.json()["details"][0]["loc"] == ["shards", "shard-2"] and "send the request again" in r.json()["error"]
        r = control.post("/v2/fusions", json=ELEMENTWISE_CHAIN)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert "shard-0: 201, shard-1: 201, shard-2: 503" in r.json()["error"]
        # The shards that were reached applied it: sending it again (once shard-2 is back) succeeds on each.
        assert all(c.get("/v2/fusions/elementwise_chain").status_code == 200 for c in direct.values())
        set_shards(app, urls)
        r = control.post("/v2/fusions", json=ELEMENTWISE_CHAIN)
        assert r.status_code == 200 and r.json()["created"] is False
    finally:
        third.stop()
        set_shards(app, urls)
        control.delete("/v2/fusions/elementwise_chain")
