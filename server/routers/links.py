"""OpenAPI links: which operation a response's values lead to (a buffer PUT to its GET and DELETE, a
registered fusion's id to its infer, ...). Clients may ignore them; schemathesis's stateful phase
follows them, so it runs sequences of calls on objects that exist instead of names that do not."""

from __future__ import annotations

from ..protocol import MODEL_VERSION


def link(path: str, method: str, description: str, **parameters: str) -> dict:
    """A Link Object to `method path`, its parameters given as runtime expressions
    ($request.path.name, $response.body#/id)."""
    pointer = path.replace("~", "~0").replace("/", "~1")
    return {"operationRef": f"#/paths/{pointer}/{method}", "description": description, "parameters": parameters}


VERSION = "/v2/models/{model}/versions/{version}"


def fusion_links() -> dict:
    """Where a fusion's registration leads (its response has the fusion's id and name): reading,
    planning, running and removing it, by id or by name, and its one version."""
    fusion_id, name, v = "$response.body#/id", "$response.body#/name", MODEL_VERSION
    return {
        "GetFusion": link("/v2/fusions/{key}", "get", "the registered fusion", key=fusion_id),
        "PlanFusion": link("/v2/fusions/{key}/plan", "get", "its plan", key=fusion_id),
        "Infer": link("/v2/models/{model}/infer", "post", "run it", model=fusion_id),
        "ModelMetadata": link("/v2/models/{model}", "get", "its inputs and outputs", model=name),
        "ModelReady": link("/v2/models/{model}/ready", "get", "its readiness", model=name),
        "ModelConfig": link("/v2/models/{model}/config", "get", "its model configuration", model=name),
        "ModelStats": link("/v2/models/{model}/stats", "get", "its statistics", model=name),
        "ModelTrace": link("/v2/models/{model}/trace/setting", "get", "its trace settings", model=name),
        "VersionMetadata": link(VERSION, "get", "the version's metadata", model=name, version=v),
        "VersionReady": link(VERSION + "/ready", "get", "the version's readiness", model=name, version=v),
        "VersionConfig": link(VERSION + "/config", "get", "the version's configuration", model=name, version=v),
        "VersionStats": link(VERSION + "/stats", "get", "the version's statistics", model=name, version=v),
        "VersionInfer": link(VERSION + "/infer", "post", "run the version", model=fusion_id, version=v),
        "Unload": link("/v2/repository/models/{model}/unload", "post", "unload it", model=name),
        "DeleteFusion": link("/v2/fusions/{key}", "delete", "unregister it", key=fusion_id),
    }
