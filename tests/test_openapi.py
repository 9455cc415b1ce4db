"""The service's OpenAPI document is a valid OpenAPI 3.1 document (issue 17, item 12, first part),
checked by openapi-spec-validator, with and without a token (the security scheme is added then)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openapi_spec_validator import OpenAPIV31SpecValidator


@pytest.mark.parametrize("token", [None, "tok"])
def test_openapi_document_is_valid(token):
    from segfuse.server import create_app
    from segfuse.server.settings import Settings

    spec = create_app(Settings(backend="numpy", token=token)).openapi()
    errors = [f"{'/'.join(map(str, e.path))}: {e.message}" for e in OpenAPIV31SpecValidator(spec).iter_errors()]
    assert not errors, "\n".join(errors)


def _schema(token=None):
    from segfuse.server import create_app
    from segfuse.server.settings import Settings

    return create_app(Settings(backend="numpy", token=token)).openapi()


def test_documented_statuses_are_the_ones_sent():
    """No FastAPI 422 `HTTPValidationError` (segfuse answers a malformed request with 400 and its
    own body); 400 documented wherever a route takes parameters or a body; 401 on every route but
    health when a token is set."""
    for token in (None, "tok"):
        spec = _schema(token)
        assert "HTTPValidationError" not in str(spec)
        for path, item in spec["paths"].items():
            for method, op in item.items():
                if not isinstance(op, dict) or "responses" not in op:
                    continue
                if op.get("parameters") or op.get("requestBody"):
                    assert "400" in op["responses"], (method, path)
                if token and not path.startswith("/v2/health/"):
                    assert "401" in op["responses"], (method, path)


@pytest.mark.anyio
async def test_failures_answer_a_documented_status(asgi_server):
    spec = _schema()
    cases = [("get", "/v2/buffers/{name}", "/v2/buffers/a%0A"), ("get", "/v2/buffers/{name}", "/v2/buffers/missing"),
             ("put", "/v2/buffers/{name}", "/v2/buffers/x"), ("post", "/v2/fusions", "/v2/fusions"),
             ("get", "/v2/fusions/{key}/plan", "/v2/fusions/none/plan"),
             ("post", "/v2/models/{model}/infer", "/v2/models/none/infer")]
    async with asgi_server() as c:
        for method, template, url in cases:
            r = await c.request(method.upper(), url, content=b"{bad", headers={"content-type": "application/json"})
            assert r.status_code >= 400 and set(r.json()) == {"error", "details"}, (url, r.text)
            assert str(r.status_code) in spec["paths"][template][method]["responses"], (url, r.status_code)


ALLOW_CASES = [("/v2/trace/setting", "GET, POST"), ("/v2/logging", "GET, POST"),
               ("/v2/buffers/b", "DELETE, GET, PUT"), ("/v2/fusions", "GET, POST"),
               ("/v2/fusions/f", "DELETE, GET")]


@pytest.mark.anyio
async def test_a_405_lists_every_method_of_the_path(asgi_server):
    """RFC 9110: a 405's Allow names all methods of the resource. Starlette named only those of
    the first route of the path (GET /v2/fusions/f: 'GET', although DELETE serves it too); the
    fuzz (tests/test_fuzz_openapi.py) found it."""
    async with asgi_server() as c:
        for url, allow in ALLOW_CASES:
            r = await c.request("PATCH", url)
            assert r.status_code == 405 and r.headers["allow"] == allow, (url, r.headers.get("allow"))
            assert set(r.json()) == {"error", "details"}


def test_a_405_lists_every_method_on_a_live_server(live_server_factory):
    import httpx

    server = live_server_factory(backend="numpy", token="tok")
    for url, allow in ALLOW_CASES:
        r = httpx.request("OPTIONS", server.url + url, headers={"Authorization": "Bearer tok"})
        assert r.status_code == 405 and r.headers["allow"] == allow, (url, r.headers.get("allow"))


def test_health_is_documented_as_open_when_a_token_is_set():
    """The document's global bearer requirement is lifted on the two open paths (security: []),
    as GuardMiddleware serves them; every other operation inherits it."""
    spec = _schema("tok")
    assert spec["security"] == [{"bearer": []}]
    for path, item in spec["paths"].items():
        for op in item.values():
            assert op.get("security") == ([] if path.startswith("/v2/health/") else None), path


def _ecma(pattern: str):
    """A JSON Schema pattern as ECMA-262 reads it: `$` is the end, never before a final newline."""
    import re

    return re.compile(pattern.replace("$", r"\Z"))


NAMEISH = "ab.-_/\n$Z9"


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=NAMEISH, max_size=6) | st.sampled_from([".", "..", "...", "a" * 128, "a" * 129, "/x", "/..",
                                                                  "/.", "/a..b", "/" + "k" * 250, "k" * 251]))
def test_documented_name_and_key_patterns_are_the_checks(text):
    """The OpenAPI document gives buffer and region names and shared-memory keys as patterns (so
    a schema-driven client generates names the server takes); they accept exactly what the
    server's checks accept."""
    from segfuse.server.errors import ApiError
    from segfuse.server.names import KEY_PATTERN, NAME_PATTERN, is_valid_name
    from segfuse.server.regions import check_key

    assert (_ecma(NAME_PATTERN).search(text) is not None) == is_valid_name(text), text
    try:
        check_key(text)
        key_ok = True
    except ApiError:
        key_ok = False
    assert (_ecma(KEY_PATTERN).search(text) is not None) == key_ok, text


def test_patterns_are_in_the_document():
    from segfuse.server.names import KEY_PATTERN, NAME_PATTERN

    spec = _schema()
    for path in ("/v2/buffers/{name}", "/v2/systemsharedmemory/region/{name}/status",
                 "/v2/cudasharedmemory/region/{name}/register"):
        for op in spec["paths"][path].values():
            (param,) = [p for p in op["parameters"] if p["name"] == "name"]
            assert param["schema"]["pattern"] == NAME_PATTERN, path
    assert spec["components"]["schemas"]["SystemRegionRegister"]["properties"]["key"]["pattern"] == KEY_PATTERN


@pytest.mark.anyio
async def test_model_ready_answers_the_documented_json(asgi_server, moe_graph):
    """GET /v2/models/{m}/ready (and its versioned form) answered 200 with an empty body and no
    content type, where the document promised JSON (the 200-example fuzz found it): now KServe
    v2's {"name", "ready"}, which the schema describes."""
    spec = _schema()
    async with asgi_server() as c:
        await c.post("/v2/fusions", json=moe_graph)
        for url, template in [("/v2/models/moe_problem_sizes/ready", "/v2/models/{model}/ready"),
                              ("/v2/models/moe_problem_sizes/versions/1/ready",
                               "/v2/models/{model}/versions/{version}/ready")]:
            r = await c.get(url)
            assert r.status_code == 200 and r.headers["content-type"] == "application/json"
            assert r.json() == {"name": "moe_problem_sizes", "ready": True}
            documented = spec["paths"][template]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
            assert documented == {"$ref": "#/components/schemas/ModelReady"}
        assert (await c.get("/v2/models/nope/ready")).status_code == 404
