"""The example bodies of the OpenAPI document are requests the server accepts: Swagger UI's "Try it
out" (at /docs) fills its body with an operation's first media type and that type's first
example, and every declared example answers 2xx on a live server when sent in a sensible order
(the fusion registered before it runs, the shared-memory object made before its region)."""

from __future__ import annotations

import contextlib
import os

import jsonschema
import pytest
from segfuse.server import create_app
from segfuse.server.settings import Settings

# Where an example needs a path parameter, the value "Try it out" would be given: the examples
# register and run the MoE histogram, store a buffer and register a region of /input_data.
PATH_VALUES = {"model": "moe_problem_sizes", "key": "moe_problem_sizes", "version": "1", "name": "example"}
# registrations first, then what uses them
ORDER = ["/v2/fusions", "/v2/buffers/", "/v2/systemsharedmemory/", "/v2/repository/", "/v2/models/", "/v2/execute"]


def _rank(path: str) -> int:
    return next((i for i, p in enumerate(ORDER) if path.startswith(p)), len(ORDER))


def declared_examples(doc: dict) -> list[tuple[str, str, str, str, object]]:
    """(method, path, media type, example name, body) of every request body example, in ORDER."""
    found = []
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            for media, content in op.get("requestBody", {}).get("content", {}).items():
                for name, ex in content.get("examples", {}).items():
                    found.append((method, path, media, name, ex["value"]))
                if "example" in content:
                    found.append((method, path, media, "example", content["example"]))
    return sorted(found, key=lambda f: _rank(f[1]))


@pytest.fixture
def input_data_object():
    """/input_data, the POSIX shared-memory object the region example names, made as a client would."""
    path = "/dev/shm/input_data"
    made = not os.path.exists(path)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
    try:
        if os.fstat(fd).st_size < 4096:
            os.ftruncate(fd, 4096)
    finally:
        os.close(fd)
    yield
    if made:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


pytestmark = pytest.mark.anyio


async def test_try_it_out_starts_from_a_declared_example(asgi_server):
    async with asgi_server() as c:
        doc = (await c.get("/openapi.json")).json()
    with_examples = [(m, p, op["requestBody"]["content"]) for p, ops in doc["paths"].items()
                     for m, op in ops.items() if "requestBody" in op
                     and any("examples" in v or "example" in v for v in op["requestBody"]["content"].values())]
    assert len(with_examples) >= 5
    for method, path, content in with_examples:
        first = next(iter(content.values()))
        assert "examples" in first or "example" in first, \
            f"{method.upper()} {path}: Swagger offers {next(iter(content))} first, which has no example"


async def test_every_example_body_is_accepted(asgi_server, input_data_object):
    async with asgi_server() as c:
        examples = declared_examples((await c.get("/openapi.json")).json())
        assert {(m, p) for m, p, *_ in examples} >= {("post", "/v2/fusions"), ("put", "/v2/buffers/{name}"),
                                                    ("post", "/v2/models/{model}/infer"), ("post", "/v2/execute")}
        for method, path, media, name, body in examples:
            url = path.format(**PATH_VALUES)
            r = await c.request(method, url, json=body, headers={"content-type": media})
            assert r.is_success, f"{method.upper()} {path} example {name!r}: {r.status_code} {r.text}"
        # and the run did what the example says: 2 tokens, top-2 ids [[1, 3], [3, 15]]
        r = await c.post("/v2/models/moe_problem_sizes/infer", json=next(
            b for m, p, _, _, b in examples if p == "/v2/models/{model}/infer"))
        assert r.json()["outputs"][0]["data"] == [0, 1, 0, 2] + [0] * 11 + [1]


def _document() -> dict:
    return create_app(Settings(backend="numpy")).openapi()


def test_every_example_body_matches_its_schema():
    doc = _document()
    for method, path, media, name, body in declared_examples(doc):
        schema = {**doc["paths"][path][method]["requestBody"]["content"][media]["schema"],
                  "components": doc["components"]}
        errors = [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(body)]
        assert not errors, f"{method.upper()} {path} example {name!r}: {errors}"


def test_path_values_cover_every_parameter_of_an_operation_with_examples():
    doc = _document()
    params = {p["name"] for m, path, *_ in declared_examples(doc)
              for p in doc["paths"][path][m].get("parameters", []) if p["in"] == "path"}
    assert params <= set(PATH_VALUES), params - set(PATH_VALUES)
