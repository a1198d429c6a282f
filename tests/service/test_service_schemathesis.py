"""Property-based checks of every endpoint against the app's own OpenAPI schema (bounded).

Each operation gets a few generated requests (with an admin token, so writes are exercised
too); every answer must conform to the schema: documented status, content type and body, and
never a 5xx. Driven through Hypothesis directly, one pytest item per operation.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance
from service_factories import auth

from cptrace.app import create_app
from service.auth import Role, create_token
from service.core.config import Settings

_DATA_DIR = Path(tempfile.mkdtemp(prefix="cptrace-schemathesis-"))
# claim_max_wait_s=0: a generated wait_s must not turn each example into a 30 s long poll
APP = create_app(
    Settings(data_dir=_DATA_DIR, ingest_workers=0, claim_max_wait_s=0, max_upload_bytes=1024 * 1024)
)
ADMIN = auth(APP.state.db.write_tx(lambda c: create_token(c, role=Role.ADMIN)))
SCHEMA = schemathesis.openapi.from_asgi("/openapi.json", APP)
# The service's own JSON API, by its router tags (web pages, their JSON twins and the PR-comment
# route are tagged "pages" and tested by the web package).
SERVICE_TAGS = {
    "health",
    "runs",
    "uploads",
    "analyses",
    "comparisons",
    "jobs",
    "runners",
    "catalog",
}
OPERATIONS = [
    op
    for op in (result.ok() for result in SCHEMA.get_all_operations())
    if set(op.definition.raw.get("tags", ())) <= SERVICE_TAGS
]


# Operations whose bodies are validated beyond what a schema can say: a bundle must be a real
# tar.gz with a manifest and traces, a trace a real nsys/Kineto file, a job spec a valid runner
# workload. Schema-valid random data is rightly refused there (4xx), so the "schema-valid data is
# accepted" check does not apply to them; every other check still does.
CONTENT_VALIDATED = {
    ("POST", "/api/v1/uploads/bundles"),
    ("POST", "/api/v1/uploads/traces"),
    ("POST", "/api/v1/jobs"),
}


def teardown_module() -> None:
    APP.state.db.close()


@pytest.mark.parametrize("operation", OPERATIONS, ids=[op.label for op in OPERATIONS])
def test_operation_conforms_to_the_schema(operation: schemathesis.APIOperation) -> None:
    @given(case=operation.as_strategy())
    @settings(
        max_examples=25, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    def check(case: schemathesis.Case) -> None:
        case.call_and_validate(headers=ADMIN, excluded_checks=excluded)

    key = (operation.method.upper(), operation.path)
    excluded = [positive_data_acceptance] if key in CONTENT_VALIDATED else []

    check()
