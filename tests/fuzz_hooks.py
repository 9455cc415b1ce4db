"""Schemathesis hooks shared by tests/test_fuzz_openapi.py and the live-server run of
docs/fuzz-results.md (`SCHEMATHESIS_HOOKS=tests/fuzz_hooks.py st run ...`): .npy bodies are sent
as bytes, and `fusion_availability` replaces schemathesis's `ensure_resource_availability`."""

from __future__ import annotations

import schemathesis
from schemathesis import checks as st_checks
from schemathesis.core.failures import Failure

# .npy bodies as bytes, like application/octet-stream (mostly malformed files: the error path).
schemathesis.serializer.alias("application/x-npy", "application/octet-stream")

# The operations after whose success a registered fusion may be gone although nobody sent DELETE
# to its URL: unload (Triton's), DELETE under its name, and a registration or load that replaces
# it under its name.
REGISTRY_CHANGES = {("POST", "/v2/repository/models/{model}/unload"), ("POST", "/v2/repository/models/{model}/load"),
                    ("DELETE", "/v2/fusions/{key}"), ("POST", "/v2/fusions"), ("POST", "/v2/execute")}


def _registry_changed(ctx, case) -> bool:
    """Whether, in this scenario, a request of REGISTRY_CHANGES succeeded after the one that
    registered what `case` asks for (its parent) and before `case`."""
    recorder = ctx.internals.recorder
    parent = ctx.internals.find_parent(case_id=case.id)
    if recorder is None or parent is None:
        return False
    after_parent = False
    for prior in recorder.find_all_cases():
        if prior.id == case.id:
            break
        if prior.id == parent.id:
            after_parent = True
            continue
        response = recorder.find_response(case_id=prior.id)
        if (after_parent and response is not None and 200 <= response.status_code < 300
                and (prior.operation.method.upper(), prior.path) in REGISTRY_CHANGES):
            return True
    return False


@schemathesis.check
def fusion_availability(ctx, response, case):
    """ensure_resource_availability (what a POST registered answers the GET its link leads to),
    less its false alarms here: schemathesis counts only a DELETE of the same URL as a removal,
    but a fusion also leaves through the operations of REGISTRY_CHANGES."""
    try:
        return st_checks.ensure_resource_availability(ctx, response, case)
    except Failure:
        if _registry_changed(ctx, case):
            return None
        raise
