"""Schema-driven fuzzing (issue 17, item 12): schemathesis generates requests, valid and invalid,
for every operation of the OpenAPI document that `create_app` serves, and sends them to that app
in-process (ASGI, NumPy backend): a server without a token, and one with a token, fuzzed with the
token and without it. Every response must be no 5xx, a documented status, a documented content
type, a body and headers that match the documented schema, a 4xx for a request outside the schema,
and a 405's Allow header must list the path's methods.

Stateful: schemathesis's state machine follows the document's links (register a fusion, then
read, plan, run, unload, load and delete it by the id and name it answered; PUT a buffer, then GET
and DELETE it; ...) in scenarios of up to 10 calls, with the checks above and two more: a deleted
object answers 404 (use_after_free), and a registered one answers until something removed it
(fusion_availability, tests/fuzz_hooks.py).

Bounded for CI (SEGFUSE_FUZZ_EXAMPLES examples per operation and mode, 12 by default, and
SEGFUSE_FUZZ_SCENARIOS stateful scenarios per variant, 80 by default: about 70 s on 2 cores with
-n 2). A longer run raises the bounds; SEGFUSE_FUZZ_REPORT=DIR writes each worker's
counts (cases, statuses) to DIR. docs/fuzz-results.md records a longer run on a live server.
"""

from __future__ import annotations

import collections
import json
import os
import random
import time

import fuzz_hooks
import hypothesis
import pytest
import schemathesis  # the dev extra's; a missing one fails here rather than skipping the fuzz
from helpers.waiting import scaled
from hypothesis import HealthCheck, Phase, settings
from hypothesis.errors import FlakyStrategyDefinition
from schemathesis import checks as st_checks

EXAMPLES = int(os.environ.get("SEGFUSE_FUZZ_EXAMPLES", "12"))
SCENARIOS = int(os.environ.get("SEGFUSE_FUZZ_SCENARIOS", "80"))
TOKEN = "fuzz-token"
OPEN = ("/v2/health/live", "/v2/health/ready")

# The checks that must hold; negative_data_rejection: a request outside the schema gets a 4xx.
# Not included: positive_data_acceptance, which expects every schema-valid request to be accepted,
# where some rules are beyond JSON Schema: raw bytes to an infer route need a JSON header of
# Inference-Header-Content-Length bytes first, a raw PUT needs ?dtype and ?shape, a graph must be
# consistent (400 otherwise), a plan needs the sizes of the graph's symbols.
CHECKS = [st_checks.status_code_conformance, st_checks.content_type_conformance,
          st_checks.response_schema_conformance, st_checks.response_headers_conformance,
          st_checks.allow_header_conformance, st_checks.unsupported_method, st_checks.negative_data_rejection,
          st_checks.missing_required_header]

# Checks of a sequence of calls (stateful): ensure_resource_availability is replaced by
# fusion_availability, which knows that unload and a replacing registration remove a fusion too.
STATEFUL_CHECKS = [st_checks.use_after_free, fuzz_hooks.fusion_availability]


@schemathesis.check
def no_server_error(ctx, response, case):
    """not_a_server_error, less the one deliberate 5xx a healthy NumPy server sends: 501 for CUDA
    shared memory (no GPU), documented on that route."""
    if response.status_code == 501 and case.path == "/v2/cudasharedmemory/region/{name}/register":
        return True
    return st_checks.not_a_server_error(ctx, response, case)


def _app(token):
    from segfuse.server import create_app
    from segfuse.server.settings import Settings

    # Small limits, so generated requests reach the 413s instead of filling memory.
    return create_app(Settings(backend="numpy", token=token, max_body_bytes=1 << 20, max_buffer_bytes=1 << 20,
                               max_total_bytes=8 << 20, max_fusions=64, max_fusion_bytes=1 << 20,
                               max_region_bytes=1 << 20))


def _schema(app, headers=None):
    schema = schemathesis.openapi.from_asgi("/openapi.json", app, headers=headers or {})
    # The tests send the Authorization header themselves (the token, or none at all), so the
    # generator leaves it alone: a negative case that dropped it would otherwise get it back.
    schema.config.generation.update(max_examples=EXAMPLES, with_security_parameters=False)
    # A request both outside the schema and over a limit may get the limit's 413 (limits are
    # checked first, before any work); schemathesis's list of rejections leaves 413 out.
    rejection = schema.config.checks.negative_data_rejection
    rejection.expected_statuses = [*rejection.expected_statuses, "413"]
    return schema


OPEN_APP, GUARDED_APP = _app(None), _app(TOKEN)
AUTH = {"Authorization": f"Bearer {TOKEN}"}
open_schema, guarded_schema = _schema(OPEN_APP), _schema(GUARDED_APP, AUTH)
STATUSES: collections.Counter = collections.Counter()

FUZZ = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))


def _wait_ready(schema, app, headers=None):
    """The lifespan starts the backend in the background (/ready answers 503 until then): wait,
    so the fuzz meets a started server. Schemathesis ends the lifespan after each test."""
    if app.state.server_state.ready:
        return
    probe = schema["/v2/health/ready"]["GET"]
    deadline = time.monotonic() + scaled(60)
    while probe.Case().call(headers=headers).status_code != 200:
        assert time.monotonic() < deadline, "the server did not become ready"
        time.sleep(0.02)


def _record(variant, case, response):
    STATUSES[(variant, case.method, case.path, response.status_code)] += 1


@open_schema.parametrize()
@FUZZ
def test_fuzz_without_token(case):
    _wait_ready(open_schema, OPEN_APP)
    response = case.call_and_validate(checks=[no_server_error, *CHECKS])
    _record("no token", case, response)


@guarded_schema.parametrize()
@FUZZ
def test_fuzz_with_token(case):
    _wait_ready(guarded_schema, GUARDED_APP, AUTH)
    response = case.call_and_validate(headers=AUTH, checks=[no_server_error, *CHECKS, st_checks.ignored_auth])
    _record("token", case, response)


@guarded_schema.parametrize()
@FUZZ
def test_fuzz_guarded_server_without_credentials(case):
    _wait_ready(guarded_schema, GUARDED_APP)
    case.headers = {k: v for k, v in (case.headers or {}).items() if k.lower() != "authorization"}
    response = case.call_and_validate(checks=[no_server_error, *CHECKS])
    if case.path not in OPEN and case.method.upper() in ("GET", "PUT", "POST", "DELETE"):
        assert response.status_code in (401, 405), (case.method, case.path, response.status_code, response.text)
    _record("token set, none sent", case, response)


def _state_machine(schema, app, variant, headers=None, extra_checks=()):
    """The document's state machine (its links) on `app`, with `headers` on every call; it counts
    its scenarios and keeps every check failure (a replay need not reproduce one, see below)."""
    checks = [no_server_error, *CHECKS, *STATEFUL_CHECKS, *extra_checks]

    class Machine(schema.as_state_machine()):
        scenarios = [0]
        failures: list = []

        def setup(self):
            self.scenarios[0] += 1
            _wait_ready(schema, app, headers)

        def get_call_kwargs(self, case):
            return {"headers": headers} if headers else {}

        def validate_response(self, response, case, additional_checks=None, **kwargs):
            _record(variant, case, response)
            try:
                case.validate_response(response, checks=checks, recorder=self.recorder,
                                       transport_kwargs=kwargs or None)
            except AssertionError as e:  # schemathesis's Failure and FailureGroup are AssertionErrors
                self.failures.append(f"{case.method} {case.formatted_path}: {e}")
                raise

    return Machine


# Generation only (as schemathesis runs its state machines): no replay of a database entry, no
# shrinking, both of which assume a scenario takes the same path when its choices are repeated.
STATEFUL = settings(max_examples=SCENARIOS, stateful_step_count=10, deadline=None, phases=[Phase.generate],
                    database=None, suppress_health_check=list(HealthCheck))
STATEFUL_SEED = int(os.environ.get("SEGFUSE_FUZZ_SEED", random.randrange(1 << 32)))


def _run_stateful(machine) -> None:
    """Suites of scenarios until SCENARIOS have run. A scenario's path depends on what earlier ones
    left on the server (a bundle filled by a 201 is empty after a 200), which Hypothesis reports as
    FlakyStrategyDefinition and ends the suite: the next suite, with the next seed, goes on (what
    schemathesis's own runner does)."""
    for k in range(4 * SCENARIOS):
        if machine.scenarios[0] >= SCENARIOS:
            break
        try:
            hypothesis.seed(STATEFUL_SEED + k)(machine).run(settings=STATEFUL)
        except FlakyStrategyDefinition:
            pass
        assert not machine.failures, (f"SEGFUSE_FUZZ_SEED={STATEFUL_SEED}", machine.failures)
    assert machine.scenarios[0] >= SCENARIOS, machine.scenarios


def test_stateful_fuzz_without_token():
    _run_stateful(_state_machine(open_schema, OPEN_APP, "stateful, no token"))


def test_stateful_fuzz_with_token():
    _run_stateful(_state_machine(guarded_schema, GUARDED_APP, "stateful, token", AUTH, [st_checks.ignored_auth]))


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    out = os.environ.get("SEGFUSE_FUZZ_REPORT")
    if out:
        os.makedirs(out, exist_ok=True)
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        rows = [{"variant": v, "method": m, "path": p, "status": s, "count": n}
                for (v, m, p, s), n in sorted(STATUSES.items())]
        with open(os.path.join(out, f"statuses-{worker}.json"), "w") as f:
            json.dump(rows, f)
