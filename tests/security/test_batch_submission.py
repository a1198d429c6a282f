"""Who may queue pull-request loop batches, for what, fetched from where (issue 24, item 2).

A runner token runs jobs and nothing else; a CI token queues batches only for its one
repository, only a pull request of that repository (never a fork's) at its real head or a
commit on a tracked branch; the clone URL is always the service's. Real app, real SQLite, the
fake GitHub over HTTP.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_github import FakeGitHub, FakeGitHubServer
from fastapi.testclient import TestClient
from loop_repo import SMOKE_SPEC, LoopRepo

from pr_bot.github import GitHubConfig
from service.api.routes.github import github_config, loop_settings
from service.auth import Role, create_token
from service.core.config import Settings
from service.github_loop.config import LoopSettings
from service.github_loop.models import RepoConfig, SuiteFile
from service.main import create_app

REPO = "octo/model"
CLONE = "https://git.example/octo/model.git"
URL = "/api/v1/github/batches"


@pytest.fixture()
def env(tmp_path: Path) -> Iterator[dict[str, Any]]:
    repo = LoopRepo(tmp_path / "git")
    main_sha = repo.commit("base", spec=SMOKE_SPEC)
    repo.push("main")
    suites = SuiteFile.model_validate({"suites": {"smoke": {"gpus": 0, "specs": [SMOKE_SPEC]}}})
    configs = {REPO: RepoConfig(clone_url=CLONE, suites=suites)}

    class Loop(LoopSettings):
        def repo_configs(self) -> dict[str, RepoConfig]:
            return configs

    with FakeGitHubServer() as github:
        github.git_dirs[REPO] = repo.bare
        app = create_app(Settings(data_dir=tmp_path / "data", ingest_workers=0))
        app.dependency_overrides[loop_settings] = lambda: Loop()
        config = GitHubConfig(token=github.token, api_url=github.url)
        app.dependency_overrides[github_config] = lambda: config
        db = app.state.db
        tokens = {
            "admin": db.write_tx(lambda c: create_token(c, role=Role.ADMIN)),
            "runner": db.write_tx(lambda c: create_token(c, role=Role.RUNNER)),
            "viewer": db.write_tx(lambda c: create_token(c, role=Role.VIEWER)),
            "ci": db.write_tx(lambda c: create_token(c, role=Role.CI, repo=REPO)),
            "ci_other": db.write_tx(lambda c: create_token(c, role=Role.CI, repo="octo/other")),
        }
        with TestClient(app) as client:
            yield {"client": client, "tokens": tokens, "github": github, "main": main_sha,
                   "db": db}  # fmt: skip


def _post(env: dict[str, Any], who: str | None, **body: Any) -> Any:
    headers = {"Authorization": f"Bearer {env['tokens'][who]}"} if who else {}
    return env["client"].post(URL, json={"repo": REPO, **body}, headers=headers)


def _jobs(env: dict[str, Any]) -> list[dict[str, Any]]:
    return env["db"].read(
        lambda c: [{"checkout": r[0]} for r in c.execute("SELECT checkout_json FROM jobs")]
    )


def _pull(github: FakeGitHub, number: int, sha: str, *, fork: bool) -> None:
    head_repo = "mallory/model" if fork else REPO
    github.pulls[(REPO, number)] = {
        "number": number,
        "head": {"sha": sha, "ref": "feature", "repo": {"full_name": head_repo}},
        "base": {"sha": sha, "ref": "main", "repo": {"full_name": REPO}},
    }


def test_runner_viewer_and_anonymous_tokens_queue_nothing(env: dict[str, Any]) -> None:
    sha = "ab" * 20
    assert _post(env, None, head_sha=sha).status_code == 401
    for who in ("runner", "viewer"):
        answer = _post(env, who, head_sha=sha, clone_url="file:///evil")
        assert answer.status_code == 403, answer.text
        assert "runs jobs" in answer.json()["error"] or "webhook" in answer.json()["error"]
    assert _jobs(env) == []


def test_ci_token_is_scoped_to_its_repository_and_real_heads(env: dict[str, Any]) -> None:
    github: FakeGitHub = env["github"]
    main = env["main"]
    other = env["client"].post(
        URL, json={"repo": "octo/other", "head_sha": main, "head_ref": "main"},
        headers={"Authorization": f"Bearer {env['tokens']['ci']}"},
    )  # fmt: skip
    assert other.status_code == 403 and "octo/model" in other.json()["error"]
    wrong_scope = _post(env, "ci_other", head_sha=main, head_ref="main")
    assert wrong_scope.status_code == 403
    # The clone URL is the service's: a request naming another one is refused, by anyone.
    for who in ("ci", "admin"):
        evil = _post(env, who, head_sha=main, head_ref="main", clone_url="file:///tmp/evil.git")
        assert evil.status_code == 422 and CLONE in evil.json()["error"], evil.text
    _pull(github, 5, "cd" * 20, fork=True)
    fork = _post(env, "ci", head_sha="cd" * 20, pr=5)
    assert fork.status_code == 403 and "fork" in fork.json()["error"]
    _pull(github, 6, "ef" * 20, fork=False)
    stale = _post(env, "ci", head_sha="12" * 20, pr=6)
    assert stale.status_code == 422 and "head" in stale.json()["error"]
    untracked = _post(env, "ci", head_sha=main, head_ref="feature")
    assert untracked.status_code == 403
    assert _jobs(env) == [], "nothing was queued by a refused request"
    ok_pr = _post(env, "ci", head_sha="ef" * 20, pr=6)
    assert ok_pr.status_code == 201, ok_pr.text
    ok_branch = _post(env, "ci", head_sha=main, head_ref="main")
    assert ok_branch.status_code == 201, ok_branch.text
    jobs = _jobs(env)
    assert len(jobs) == 2 and all(f'"clone_url": "{CLONE}"' in j["checkout"] for j in jobs)


def test_admin_queues_with_the_configured_clone_url(env: dict[str, Any]) -> None:
    answer = _post(env, "admin", head_sha="ab" * 20, pr=3, clone_url=CLONE)
    assert answer.status_code == 201, answer.text
    (job,) = _jobs(env)
    assert f'"clone_url": "{CLONE}"' in job["checkout"]


@pytest.mark.parametrize("batch", [2**63, 2**64, 0, -1])
def test_batch_ids_out_of_range_are_4xx(env: dict[str, Any], batch: int) -> None:
    answer = env["client"].get(
        f"{URL}/{batch}", headers={"Authorization": f"Bearer {env['tokens']['viewer']}"}
    )
    assert answer.status_code in (404, 422), answer.text
