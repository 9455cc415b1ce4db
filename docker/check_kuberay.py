"""Validate docker/kuberay.yaml offline, as the API server would with strict field validation
(`kubectl apply --validate=strict`): unknown fields are errors, not pruned. Its RayCluster against
KubeRay's RayCluster CRD, its Kubernetes kinds (the router's Deployment and Service) against
Kubernetes' strict JSON schemas (docker/check_manifests.py). No cluster or kubeconform is needed;
the CRD file comes from a KubeRay checkout (ray-operator/config/crd/bases/ray.io_rayclusters.yaml)
or its release's CRD bundle:

    python docker/check_kuberay.py --crd kuberay/ray-operator/config/crd/bases/ray.io_rayclusters.yaml

A CRD's openAPIV3Schema is a structural OpenAPI schema, close to JSON Schema; jsonschema validates
it once the Kubernetes extensions below are spelled as JSON Schema (no library does that step
offline, so it is written here).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import jsonschema
import yaml

HERE = Path(__file__).resolve().parent


def as_json_schema(node):
    """The CRD schema `node` as JSON Schema: x-kubernetes-int-or-string is an integer or a string,
    an object with declared properties takes no others (strict validation) unless it says
    x-kubernetes-preserve-unknown-fields, and the extensions themselves are dropped."""
    if isinstance(node, list):
        return [as_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: as_json_schema(v) for k, v in node.items() if not k.startswith("x-kubernetes-")}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if "properties" in node and "additionalProperties" not in node \
            and not node.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def crd_schema(crd: dict, version: str) -> dict:
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            return as_json_schema(v["schema"]["openAPIV3Schema"])
    raise SystemExit(f"the CRD has no version {version!r}")


def errors(manifest: dict, crd: dict) -> list[str]:
    group, version = manifest["apiVersion"].split("/")
    if group != crd["spec"]["group"] or manifest["kind"] != crd["spec"]["names"]["kind"]:
        return [f"apiVersion/kind {manifest['apiVersion']} {manifest['kind']} is not this CRD's"]
    validator = jsonschema.Draft7Validator(crd_schema(crd, version))
    return [f"{'.'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
            for e in sorted(validator.iter_errors(manifest), key=lambda e: list(map(str, e.absolute_path)))]


def kubernetes_errors(doc: dict) -> list[str]:
    spec = importlib.util.spec_from_file_location("check_manifests", HERE / "check_manifests.py")
    check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(check)
    return check.errors(doc)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--crd", required=True, help="KubeRay's ray.io_rayclusters.yaml")
    p.add_argument("manifest", nargs="?", default=str(HERE / "kuberay.yaml"))
    args = p.parse_args(argv)
    crd = yaml.safe_load(Path(args.crd).read_text())
    total = 0
    for doc in (d for d in yaml.safe_load_all(Path(args.manifest).read_text()) if d):
        found = errors(doc, crd) if doc["apiVersion"].startswith("ray.io/") else kubernetes_errors(doc)
        for line in found:
            print(f"{doc['kind']} {line}")
        against = crd["metadata"]["name"] if doc["apiVersion"].startswith("ray.io/") else "Kubernetes' schemas"
        print(f"{args.manifest}: {doc['kind']} {doc['metadata']['name']}: "
              f"{'valid' if not found else f'{len(found)} errors'} against {against}")
        total += len(found)
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
