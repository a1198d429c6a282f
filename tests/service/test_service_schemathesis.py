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
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance
from service_factories import auth

from cptrace.app import create_app
from service.auth import Role, create_token
from service.core.config import Settings

pytestmark = pytest.mark.slow  # the file's tests take long together: it is scheduled first

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


# The two comparison routes take window names (`arm:auto_clone`, ...) next to run ids. Random
# ids find no run (404) and never reach the window lookup, so these are driven with the ids of
# two analysed runs and a mix of real, unknown, empty and NUL-laden window names: every answer
# must still conform (a 4xx for a window the runs do not have, never a 5xx).
COMPARISON_ROUTES = {("GET", "/api/v1/comparisons/compute"), ("POST", "/api/v1/comparisons")}
COMPARISON_OPERATIONS = [
    op for op in OPERATIONS if (op.method.upper(), op.path) in COMPARISON_ROUTES
]


@pytest.fixture(scope="module")
def analysed_runs() -> tuple[list[int], list[str]]:
    from fastapi.testclient import TestClient
    from service_factories import drain_worker, te_3arms_bundle

    from service.bootstrap import seed_demo

    client = TestClient(APP)
    # seeded like the demo runs (the API's upload limit here is 1 MiB, the bundle 4.7 MB)
    (_DATA_DIR / "seed").mkdir(exist_ok=True)
    (_DATA_DIR / "seed" / "te-3arms.tar.gz").write_bytes(te_3arms_bundle())
    (seeded,) = seed_demo(APP.state.db, APP.state.settings, _DATA_DIR / "seed")
    assert seeded.run_id is not None, seeded.error
    run_id = seeded.run_id
    drain_worker(APP.state.settings)
    run = client.get(f"/api/v1/runs/{run_id}").json()
    assert run["status"] == "analysed", run
    return [run_id], list(run["window_groups"])


@pytest.mark.parametrize(
    "operation", COMPARISON_OPERATIONS, ids=[op.label for op in COMPARISON_OPERATIONS]
)
def test_comparison_routes_with_window_names(
    operation: schemathesis.APIOperation, analysed_runs: tuple[list[int], list[str]]
) -> None:
    from hypothesis import strategies as st

    run_ids, windows = analysed_runs
    assert len(COMPARISON_OPERATIONS) == 2
    window = st.one_of(
        st.none(),
        st.sampled_from(windows),
        st.sampled_from(["", "arm:nope", "whole trace\x00", "\x00", "arm:" + "x" * 190]),
        st.text(max_size=40),
    )

    @given(case=operation.as_strategy(), base_window=window, head_window=window)
    @settings(
        max_examples=40,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.generate],  # no shrinking: the failing request is printed as curl
    )
    def check(case: schemathesis.Case, base_window: str | None, head_window: str | None) -> None:
        run_id = run_ids[0]
        if operation.method.upper() == "GET":
            case.query = {"base": run_id, "head": run_id}
            if base_window is not None:
                case.query["base_window"] = base_window
            if head_window is not None:
                case.query["head_window"] = head_window
        else:
            case.body = {
                "base_run_id": run_id,
                "head_run_id": run_id,
                "base_window": base_window,
                "head_window": head_window,
            }
        # unknown windows are rightly refused, so schema-valid data need not be accepted
        case.call_and_validate(headers=ADMIN, excluded_checks=[positive_data_acceptance])

    check()
