"""docker/k8s/*.yaml: valid against Kubernetes' strict JSON schemas and KServe's InferenceService
schema (docker/check_manifests.py), and saying what the deployment docs promise: probes on the
health routes, a GPU, non-root, a read-only root filesystem."""

from __future__ import annotations

import copy
import importlib.util

import pytest
import yaml
from helpers import manifest_checks
from helpers.fresh_process import call
from helpers.processes import ROOT

_spec = importlib.util.spec_from_file_location("check_manifests", ROOT / "docker" / "check_manifests.py")
check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check)

K8S = ROOT / "docker" / "k8s"


def docs(name: str) -> dict:
    return {d["kind"]: d for d in yaml.safe_load_all((K8S / name).read_text()) if d}


def test_every_manifest_is_valid():
    assert call(manifest_checks.main, []) == 0  # (KServe's schema: kserve, in a process of its own)
    assert {p.name for p in K8S.glob("*.yaml")} == {"segfuse.yaml", "inferenceservice.yaml", "scaleout.yaml"}


def _set(doc: dict, path: list, value) -> dict:
    doc = copy.deepcopy(doc)
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


@pytest.mark.parametrize("kind, path, value, expected", [
    ("Deployment", ["spec", "replicas"], "one", "replicas"),
    ("Deployment", ["spec", "template", "spec", "containers", 0, "imagee"], "x", "imagee"),
    ("Service", ["spec", "ports", 0, "port"], "http", "port"),
])
def test_kubernetes_schemas_refuse_wrong_types_and_unknown_fields(kind, path, value, expected):
    doc = docs("segfuse.yaml")[kind]
    assert check.errors(doc) == []
    found = check.errors(_set(doc, path, value))
    assert found and expected in found[0], found


@pytest.mark.parametrize("path, value, expected", [
    (["spec", "predictor", "containers", 0, "imagee"], "x", "imagee"),  # a Kubernetes container field
    (["spec", "predictor", "minReplica"], 1, "unknown field 'minReplica'"),  # a KServe field
    (["spec", "predictor", "maxReplicas"], "1", "is not of type int"),
    (["spec"], {}, "predictor"),  # required
])
def test_kserve_schema_refuses_wrong_types_unknown_and_missing_fields(path, value, expected):
    doc = docs("inferenceservice.yaml")["InferenceService"]
    clean, found = call(manifest_checks.errors_of, [doc, _set(doc, path, value)])
    assert clean == []
    assert any(expected in e for e in found), found


def containers(doc: dict) -> list[dict]:
    spec = doc["spec"]["template"]["spec"] if doc["kind"] == "Deployment" else doc["spec"]["predictor"]
    return spec["containers"]


@pytest.mark.parametrize("doc", [docs("segfuse.yaml")["Deployment"], docs("inferenceservice.yaml")["InferenceService"]],
                         ids=["Deployment", "InferenceService"])
def test_the_pod_is_probed_on_health_routes_holds_a_gpu_and_runs_locked_down(doc):
    (c,) = containers(doc)
    assert c["image"] == "segfuse:cuda13"
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert str(c["resources"]["limits"]["nvidia.com/gpu"]) == "1"
    pod_sc = doc["spec"]["template"]["spec"].get("securityContext", {}) if doc["kind"] == "Deployment" else {}
    sc = {**pod_sc, **c["securityContext"]}
    assert sc["runAsNonRoot"] and sc["runAsUser"] == 10001 and sc["readOnlyRootFilesystem"]
    assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"]["drop"] == ["ALL"]
    # what a read-only root needs writable (docker/check_images.py runs the image that way)
    assert {m["mountPath"] for m in c["volumeMounts"]} == {"/var/cache/segfuse", "/tmp", "/dev/shm"}


def test_the_scaled_out_manifest_routes_to_every_shard_of_the_statefulset():
    """docker/k8s/scaleout.yaml: the router names shard-0..N-1 at the StatefulSet's pods (N its
    replicas, through the headless Service's DNS names), each pod serves as the shard of its ordinal,
    and the routers' probes are HAProxy's own (a shard that is down must not take them out)."""
    from segfuse.cli.route_cmd import parse_shards

    d = docs("scaleout.yaml")
    shards, router = d["StatefulSet"], d["Deployment"]
    n, svc = shards["spec"]["replicas"], shards["spec"]["serviceName"]
    (shard,) = shards["spec"]["template"]["spec"]["containers"]
    assert shard["args"] == ["--shard-id", "shard-$(POD_INDEX)"]
    index = next(e for e in shard["env"] if e["name"] == "POD_INDEX")
    assert index["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['apps.kubernetes.io/pod-index']"
    assert str(shard["resources"]["limits"]["nvidia.com/gpu"]) == "1"
    (route,) = router["spec"]["template"]["spec"]["containers"]
    assert route["command"][:2] == ["segfuse", "route"]
    table = parse_shards(route["args"])  # the ids a namespace hashes over, each at its pod
    assert table == {f"shard-{i}": (f"{shards['metadata']['name']}-{i}.{svc}", 8000) for i in range(n)}
    assert route["livenessProbe"]["httpGet"]["path"] == route["readinessProbe"]["httpGet"]["path"] == "/router/live"
    headless = next(doc for doc in yaml.safe_load_all((K8S / "scaleout.yaml").read_text())
                    if doc and doc["kind"] == "Service" and doc["metadata"]["name"] == svc)
    assert headless["spec"]["clusterIP"] == "None"
    for c, pod in ((shard, shards), (route, router)):
        sc = {**pod["spec"]["template"]["spec"]["securityContext"], **c["securityContext"]}
        assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and sc["capabilities"]["drop"] == ["ALL"]
