"""Validate the cluster manifests offline, strictly (unknown fields are errors, as with
`kubectl apply --validate=strict`), against the real schemas from PyPI:

- Kubernetes' own kinds (Deployment, Service, ...) against Kubernetes' JSON schemas, strict
  flavour, as packaged by kubernetes-validate;
- KServe's InferenceService against the schema KServe publishes as its Python SDK (`kserve`):
  the SDK's models are generated from KServe's OpenAPI document, with each field's JSON name and
  type, and their pod fields are the Kubernetes client's models (pydantic, unknown fields
  forbidden). No library validates a document against those models, so the walk is written here.

    python docker/check_manifests.py [--kubernetes-version 1.31] [FILE.yaml ...]

With no files it checks docker/k8s/*.yaml. Exit 1 with one line per error.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
KUBERNETES_VERSION = "1.31"  # the oldest Kubernetes release the manifests are meant for


def _model(name: str):
    import kserve.models
    import kubernetes.client.models

    for module in (kserve.models, kubernetes.client.models):
        cls = getattr(module, name, None)
        if cls is not None:
            return cls
    raise LookupError(f"no model {name} in kserve or kubernetes")


_SCALARS = {"str": str, "int": int, "bool": bool, "float": (int, float), "datetime": str, "bytes": str,
            "ResourceQuantity": (int, float, str)}


def sdk_errors(value, typ: str, path: str) -> list[str]:
    """Errors of `value` against the SDK type `typ` ('V1beta1PredictorSpec', 'list[V1Container]',
    'dict(str, ResourceQuantity)', 'str', ...)."""
    typ = typ.strip()
    if typ == "object":
        return []
    if typ in _SCALARS:
        ok = isinstance(value, _SCALARS[typ]) and not (typ != "bool" and isinstance(value, bool))
        return [] if ok else [f"{path}: {value!r} is not of type {typ}"]
    m = re.fullmatch(r"(?:list|List)\[(.+)\]", typ)
    if m:
        if not isinstance(value, list):
            return [f"{path}: expected a list"]
        return [e for k, v in enumerate(value) for e in sdk_errors(v, m.group(1), f"{path}.{k}")]
    m = re.fullmatch(r"(?:dict\(str, (.+)\)|Dict\[str, (.+)\])", typ)
    if m:
        if not isinstance(value, dict):
            return [f"{path}: expected a mapping"]
        return [e for k, v in value.items() for e in sdk_errors(v, m.group(1) or m.group(2), f"{path}.{k}")]
    cls = _model(typ)
    if hasattr(cls, "model_validate"):  # the Kubernetes client's pydantic models
        from pydantic import ValidationError

        try:
            cls.model_validate(value)
        except ValidationError as e:
            return [f"{'.'.join([path, *map(str, err['loc'])])}: {err['msg']}" for err in e.errors()]
        return []
    if not isinstance(value, dict):
        return [f"{path}: expected a mapping ({typ})"]
    by_json_name = {json_name: attr for attr, json_name in cls.attribute_map.items()}
    errors = [f"{path}: unknown field {key!r} ({typ})" for key in value if key not in by_json_name]
    try:  # the SDK's constructors check required fields
        cls(**{by_json_name[k]: v for k, v in value.items() if k in by_json_name})
    except ValueError as e:
        errors.append(f"{path}: {e}")
    for key, v in value.items():
        if key in by_json_name:
            errors += sdk_errors(v, cls.openapi_types[by_json_name[key]], f"{path}.{key}")
    return errors


def errors(doc: dict, kubernetes_version: str = KUBERNETES_VERSION) -> list[str]:
    api, kind = doc.get("apiVersion", ""), doc.get("kind", "")
    group = api.rpartition("/")[0]
    if group == "serving.kserve.io":
        version = api.rpartition("/")[2]
        return sdk_errors(doc, f"{version.capitalize()}{kind}", kind)
    if "." in group and not group.endswith(".k8s.io"):
        return [f"{api} {kind}: no schema for this API group here"]
    import kubernetes_validate

    try:
        kubernetes_validate.validate(doc, kubernetes_version, strict=True)
    except kubernetes_validate.ValidationError as e:
        return [f"{kind}.{'.'.join(map(str, e.path))}: {e.message}"]
    except kubernetes_validate.SchemaNotFoundError as e:
        return [e.message]
    return []


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--kubernetes-version", default=KUBERNETES_VERSION)
    p.add_argument("files", nargs="*", default=sorted(map(str, (HERE / "k8s").glob("*.yaml"))))
    args = p.parse_args(argv)
    failed = 0
    for path in args.files:
        for doc in yaml.safe_load_all(Path(path).read_text()):
            if not doc:
                continue
            found = errors(doc, args.kubernetes_version)
            name = f"{path}: {doc.get('kind')} {doc.get('metadata', {}).get('name')}"
            print(f"{name}: {'valid' if not found else f'{len(found)} errors'}")
            for line in found:
                print("  " + line)
            failed += bool(found)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
