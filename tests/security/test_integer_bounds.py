"""Every integer is bounded at the edge: huge page numbers, ids, pull request numbers and
ranks answer 4xx (or an empty page), never a 500 (issue 24, item 11)."""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from typing import Any

import pytest
from fake_github import sign
from fastapi.testclient import TestClient
from pydantic import SecretStr
from service_factories import kineto_bundle, tar_gz

from cptrace.app import create_app
from service.api.routes.github import github_config, loop_settings
from service.auth import Role, create_token
from service.core.config import Settings
from service.github_loop.config import LoopSettings
from service.github_loop.models import RepoConfig, SuiteFile

BIG = 2**63
SECRET = "bounds-secret"


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    app = create_app(
        Settings(data_dir=tmp_path_factory.mktemp("bounds"), ingest_workers=0, public_read=True)
    )
    suites = SuiteFile.model_validate(
        {"suites": {"s": {"gpus": 0, "specs": [{"name": "x", "ranks": 1}]}}}
    )

    class Loop(LoopSettings):
        def repo_configs(self) -> dict[str, RepoConfig]:
            return {"octo/model": RepoConfig(suites=suites)}

    app.dependency_overrides[loop_settings] = lambda: Loop(webhook_secret=SecretStr(SECRET))
    app.dependency_overrides[github_config] = lambda: None
    token = app.state.db.write_tx(lambda c: create_token(c, role=Role.ADMIN))
    with TestClient(app, raise_server_exceptions=False) as client:
        yield {"client": client, "admin": {"Authorization": f"Bearer {token}"}}


@pytest.mark.parametrize(
    "url",
    [
        f"/runs?page={BIG}",
        f"/api/v1/runs?page={BIG}",
        f"/api/v1/runs?offset={BIG}",
        f"/api/v1/runs?limit={BIG}",
        f"/api/v1/runs?pr={BIG}",
        f"/api/v1/github/batches/{BIG}",
        f"/api/v1/jobs/{BIG}",
        f"/api/v1/runs/{BIG}",
        f"/api/v1/runs?rank={'9' * 4400}",
    ],
)
def test_huge_integers_in_urls_are_not_500(env: dict[str, Any], url: str) -> None:
    answer = env["client"].get(url)
    assert answer.status_code < 500, (url, answer.text[:300])


@pytest.mark.parametrize("number", [BIG, 2**31, 0, -1, "7", None, True])
def test_pull_request_numbers_out_of_range_queue_nothing(env: dict[str, Any], number: Any) -> None:
    payload = {
        "action": "opened",
        "number": number,
        "pull_request": {
            "number": number,
            "head": {"sha": "ab" * 20, "repo": {"full_name": "octo/model"}},
        },
        "repository": {"full_name": "octo/model", "clone_url": "https://github.com/octo/model.git"},
    }
    body = json.dumps(payload).encode()
    answer = env["client"].post(
        "/api/v1/github/webhook", content=body,
        headers={"X-GitHub-Event": "pull_request", "X-GitHub-Delivery": f"pr-{number}",
                 "X-Hub-Signature-256": sign(SECRET, body)},
    )  # fmt: skip
    assert answer.status_code < 500, answer.text
    assert answer.json().get("batches", []) == [] and "not queued" in answer.json()["outcome"]


def test_a_4400_digit_rank_in_a_manifest_is_a_4xx(env: dict[str, Any]) -> None:
    members = []
    with tarfile.open(fileobj=io.BytesIO(kineto_bundle(name="huge-rank")), mode="r:gz") as src:
        for member in src.getmembers():
            handle = src.extractfile(member)
            if handle is None:
                continue
            data = handle.read()
            if member.name == "manifest.json":
                data = data.replace(b'"rank": 0', b'"rank": ' + b"9" * 4400, 1)
                assert b"9" * 4400 in data
            members.append((member.name, data))
    answer = env["client"].post(
        "/api/v1/uploads/bundles", content=tar_gz(members),
        headers={**env["admin"], "Content-Type": "application/gzip"},
    )  # fmt: skip
    assert 400 <= answer.status_code < 500 and "out of range" in answer.json()["error"]
