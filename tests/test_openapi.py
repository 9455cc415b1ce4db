"""The service's OpenAPI document is a valid OpenAPI 3.1 document (issue 17, item 12, first part),
checked by openapi-spec-validator, with and without a token (the security scheme is added then)."""

from __future__ import annotations

import pytest
from openapi_spec_validator import OpenAPIV31SpecValidator


@pytest.mark.parametrize("token", [None, "tok"])
def test_openapi_document_is_valid(token):
    from segfuse.server import create_app
    from segfuse.server.settings import Settings

    spec = create_app(Settings(backend="numpy", token=token)).openapi()
    errors = [f"{'/'.join(map(str, e.path))}: {e.message}" for e in OpenAPIV31SpecValidator(spec).iter_errors()]
    assert not errors, "\n".join(errors)
