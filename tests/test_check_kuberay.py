"""docker/check_kuberay.py: a RayCluster manifest against a KubeRay CRD, strict as
`kubectl apply --validate=strict`. KubeRay's real CRD (1 MB) is not in the repository; this CRD has
its shape (structural schema, int-or-string, preserve-unknown-fields) and the manifest's own
fields, so the conversion is what is tested. docs/operations.md records the run against KubeRay's."""

from __future__ import annotations

import copy
import importlib.util
import os

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_spec = importlib.util.spec_from_file_location("check_kuberay", os.path.join(ROOT, "docker", "check_kuberay.py"))
check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(check)

QUANTITY = {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True}
CRD = {"spec": {"group": "ray.io", "names": {"kind": "RayCluster"}, "versions": [{"name": "v1", "schema": {
    "openAPIV3Schema": {"type": "object", "properties": {
        "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
        "spec": {"type": "object", "properties": {
            "rayVersion": {"type": "string"},
            "workerGroupSpecs": {"type": "array", "items": {"type": "object", "required": ["groupName"], "properties": {
                "groupName": {"type": "string"}, "replicas": {"type": "integer", "format": "int32"},
                "rayStartParams": {"type": "object", "additionalProperties": {"type": "string"}},
                "template": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "limits": {"type": "object", "additionalProperties": QUANTITY}}}}}}}}}}]}}
MANIFEST = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "s"}, "spec": {
    "rayVersion": "2.60.0", "workerGroupSpecs": [{
        "groupName": "gpu", "replicas": 2, "rayStartParams": {"num-cpus": "4"},
        "template": {"spec": {"anything": 1}}, "limits": {"cpu": "4", "nvidia.com/gpu": 1}}]}}


def _with(path: list, value) -> dict:
    m = copy.deepcopy(MANIFEST)
    node = m
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return m


def test_a_valid_manifest_passes():
    assert check.errors(MANIFEST, CRD) == []


def test_unknown_fields_and_wrong_types_are_named():
    group = ["spec", "workerGroupSpecs", 0]
    assert check.errors(_with(group + ["replica"], 2), CRD) == [
        "spec.workerGroupSpecs.0: Additional properties are not allowed ('replica' was unexpected)"]
    assert check.errors(_with(group + ["replicas"], "two"), CRD) == [
        "spec.workerGroupSpecs.0.replicas: 'two' is not of type 'integer'"]
    assert check.errors(_with(group + ["limits"], {"cpu": 4.5}), CRD)  # a quantity: an integer or a string
    assert check.errors(_with(["spec", "rayVersion"], 2.6), CRD)  # a string


def test_preserved_fields_and_maps_take_anything_they_declare():
    group = ["spec", "workerGroupSpecs", 0]
    assert check.errors(_with(group + ["template"], {"whatever": {"deep": [1]}}), CRD) == []
    assert check.errors(_with(group + ["rayStartParams"], {"any-key": "x"}), CRD) == []
    assert check.errors(_with(group + ["rayStartParams"], {"num-cpus": 4}), CRD)  # a map of strings


def test_another_kind_is_refused():
    assert check.errors({**MANIFEST, "kind": "RayService"}, CRD) == [
        "apiVersion/kind ray.io/v1 RayService is not this CRD's"]


def test_the_repository_manifest_is_a_raycluster_and_kubernetes_kinds():
    with open(os.path.join(ROOT, "docker", "kuberay.yaml")) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    assert [d["kind"] for d in docs] == ["RayCluster", "Deployment", "Service"]
    found = check.errors(docs[0], CRD)
    # this CRD declares only a few fields: what it reports of the real manifest is unknown fields
    assert all("Additional properties are not allowed" in e for e in found), found
    for doc in docs[1:]:  # the router's Deployment and Service, against Kubernetes' strict schemas
        assert check.kubernetes_errors(doc) == [], doc["kind"]
