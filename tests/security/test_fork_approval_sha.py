"""A fork approval names the commit it covers: ``/cptrace run <sha>`` queues that commit only
when it is still the head; a push after the approval is not run on it (issue 24, item 13)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_github import FakeGitHub, FakeGitHubServer, sign
from fastapi.testclient import TestClient
from loop_repo import SMOKE_SPEC, LoopRepo
from pydantic import SecretStr

from pr_bot.github import GitHubConfig
from service.api.routes.github import github_config, loop_settings
from service.core.config import Settings
from service.github_loop.config import LoopSettings
from service.main import create_app

REPO = "octo/model"
SECRET = "approval-secret"


@pytest.fixture()
def env(tmp_path: Path) -> Iterator[dict[str, Any]]:
    repo = LoopRepo(tmp_path / "git")
    base = repo.commit("base", spec=SMOKE_SPEC)
    reviewed = repo.commit("reviewed", spec={**SMOKE_SPEC, "heads": 4})
    repo.push("main")
    with FakeGitHubServer() as github:
        github.git_dirs[REPO] = repo.bare
        github.permissions[(REPO, "maint")] = "write"
        app = create_app(Settings(data_dir=tmp_path / "data", ingest_workers=0))
        loop = LoopSettings(webhook_secret=SecretStr(SECRET))
        app.dependency_overrides[loop_settings] = lambda: loop
        config = GitHubConfig(token=github.token, api_url=github.url)
        app.dependency_overrides[github_config] = lambda: config
        with TestClient(app) as client:
            yield {"client": client, "github": github, "repo": repo, "base": base,
                   "reviewed": reviewed, "app": app}  # fmt: skip


def _set_head(github: FakeGitHub, head: str, base: str) -> None:
    github.pulls[(REPO, 5)] = {
        "number": 5,
        "head": {"sha": head, "ref": "f", "repo": {"full_name": "eve/model"}},
        "base": {"sha": base, "ref": "main", "repo": {"full_name": REPO}},
    }


def _comment(env: dict[str, Any], body: str, delivery: str) -> Any:
    payload = {
        "action": "created",
        "issue": {"number": 5, "pull_request": {}},
        "comment": {"body": body, "user": {"login": "maint"}},
        "repository": {"full_name": REPO, "clone_url": env["repo"].clone_url},
    }
    raw = json.dumps(payload).encode()
    return env["client"].post(
        "/api/v1/github/webhook", content=raw,
        headers={"X-GitHub-Event": "issue_comment", "X-GitHub-Delivery": delivery,
                 "X-Hub-Signature-256": sign(SECRET, raw)},
    )  # fmt: skip


def _queued(env: dict[str, Any]) -> list[str]:
    db = env["app"].state.db
    return db.read(lambda c: [r[0] for r in c.execute("SELECT head_sha FROM jobs")])


def test_an_approval_for_a_commit_that_is_no_longer_the_head_queues_nothing(
    env: dict[str, Any],
) -> None:
    reviewed = env["reviewed"]
    pushed_after = "f" * 40  # the fork pushed again after the maintainer looked
    _set_head(env["github"], pushed_after, env["base"])
    stale = _comment(env, f"/cptrace run {reviewed[:12]}", "c1")
    assert stale.status_code == 202 and "not queued" in stale.json()["outcome"], stale.text
    assert _queued(env) == []
    _set_head(env["github"], reviewed, env["base"])
    ok = _comment(env, f"/cptrace run {reviewed}", "c2")
    assert ok.status_code == 202 and ok.json()["batches"], ok.text
    assert set(_queued(env)) == {reviewed}


def test_a_comment_with_more_than_a_sha_is_no_approval(env: dict[str, Any]) -> None:
    _set_head(env["github"], env["reviewed"], env["base"])
    answer = _comment(env, f"/cptrace run {env['reviewed']} && something", "c3")
    assert "not an approval" in answer.json()["outcome"] and _queued(env) == []
