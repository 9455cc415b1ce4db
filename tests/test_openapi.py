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


def test_no_route_documents_422():
    """Every invalid request is a 400, as in Triton, including one that is well formed but wrong for
    the graph or the data; the document lists no 422 anywhere."""
    spec = _schema()
    listed = [(method, path) for path, item in spec["paths"].items() for method, op in item.items()
              if isinstance(op, dict) and "422" in op.get("responses", {})]
    assert not listed
    infer = spec["paths"]["/v2/models/{model}/infer"]["post"]["responses"]
    assert "graph" in infer["400"]["description"]


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


def _links(spec):
    for path, item in spec["paths"].items():
        for method, op in item.items():
            for status, response in op.get("responses", {}).items():
                for name, link in response.get("links", {}).items():
                    yield f"{method.upper()} {path} {status} {name}", op, link


@pytest.mark.parametrize("token", [None, "tok"])
def test_links_lead_to_operations_of_the_document(token):
    """Every OpenAPI link (what schemathesis's stateful phase follows) names an operation of the
    document, fills only parameters that operation has, all of its path parameters, and from
    values the source has: its own path parameters or fields of its documented response."""
    import re

    spec = _schema(token)
    found = {label.rsplit(" ", 1)[1] for label, _, _ in _links(spec)}
    assert {"GetBuffer", "GetFusion", "Infer", "Unload", "Load", "RegionStatus", "Unregister"} <= found, found
    for label, source, link in _links(spec):
        m = re.fullmatch(r"#/paths/(.+)/(get|put|post|delete)", link["operationRef"])
        assert m, label
        target = spec["paths"][m.group(1).replace("~1", "/").replace("~0", "~")][m.group(2)]
        params = {p["name"]: p["in"] for p in target.get("parameters", [])}
        assert set(link["parameters"]) <= set(params), (label, link["parameters"], params)
        assert {n for n, where in params.items() if where == "path"} <= set(link["parameters"]), label
        source_path = {p["name"] for p in source.get("parameters", []) if p["in"] == "path"}
        for value in link["parameters"].values():
            if value.startswith("$request.path."):
                assert value.removeprefix("$request.path.") in source_path, (label, value)
            elif value.startswith("$response.body#/"):
                status = label.split()[2]
                schema = source["responses"][status]["content"]["application/json"].get("schema", {})
                ref = schema.get("$ref")
                if ref:  # typed response: the field is one of its properties
                    props = spec["components"]["schemas"][ref.rsplit("/", 1)[1]]["properties"]
                    assert value.split("/")[1] in props, (label, value)
            else:
                assert not value.startswith("$"), (label, value)  # a constant (the version)


@pytest.mark.anyio
async def test_linked_calls_succeed_on_what_the_source_returned(asgi_server, moe_graph):
    """Following each link of a registration, a buffer PUT and a repository load with the values
    the response gave answers 2xx (the operations a stateful client reaches are the intended ones)."""
    spec = _schema()
    async with asgi_server() as c:
        reg = (await c.post("/v2/fusions", json=moe_graph)).json()
        put = await c.put("/v2/buffers/b1", json={"dtype": "int64", "shape": [2], "data": [1, 2]})
        assert put.status_code == 201
        infer_body = {"inputs": [{"name": "topk_ids", "datatype": "INT64", "shape": [2, 2], "data": [1, 3, 3, 15]}]}
        links = spec["paths"]["/v2/fusions"]["post"]["responses"]["201"]["links"]
        order = [n for n in links if n not in ("Unload", "DeleteFusion")] + ["Unload"]
        for name in order:
            link = links[name]
            path, method = link["operationRef"][len("#/paths/"):].rsplit("/", 1)
            url = path.replace("~1", "/")
            for p, expr in link["parameters"].items():
                value = reg[expr.split("/")[-1]] if expr.startswith("$response") else expr
                url = url.replace("{" + p + "}", value)
            query = {"shape": "T=2,K=2"} if url.endswith("/plan") else None  # the sizes no link can give
            r = await c.request(method.upper(), url, params=query, json=infer_body if url.endswith("/infer") else None)
            assert r.status_code == 200, (name, url, r.text)
        load = spec["paths"]["/v2/repository/models/{model}/unload"]["post"]["responses"]["200"]["links"]["Load"]
        assert load["parameters"] == {"model": "$response.body#/name"}
        assert (await c.post(f"/v2/repository/models/{reg['name']}/load")).status_code == 200
        for name, link in spec["paths"]["/v2/buffers/{name}"]["put"]["responses"]["201"]["links"].items():
            method = link["operationRef"].rsplit("/", 1)[1]
            assert (await c.request(method.upper(), "/v2/buffers/b1")).status_code == 200, name
