"""The PR-comment endpoint and ``cptrace pr-comment``, against a local fake GitHub."""

from __future__ import annotations

import pytest
from fake_github import FakeGitHubServer
from fastapi.testclient import TestClient
from typer.testing import CliRunner
from web_fake_store import demo_store, make_app
from web_server import serve

from cptrace.cli import app as cli_app
from pr_bot.github import GitHubConfig
from service.api.deps import token_role
from service.auth import Role
from web.pr_routes import github_config

REPO = "octo/cp-attn"
URL = "/api/v1/comparisons/1/2/pr-comment"


@pytest.fixture()
def github():
    with FakeGitHubServer() as state:
        yield state


def _client(github, role: Role | None = Role.RUNNER, config: bool = True) -> TestClient:
    store = demo_store()
    store.runs[2] = store.runs[2].model_copy(update={"commit": "b" * 40})
    app = make_app(store)
    app.dependency_overrides[token_role] = lambda: role
    cfg = GitHubConfig(token="test-token", api_url=github.url) if config else None
    app.dependency_overrides[github_config] = lambda: cfg
    return TestClient(app)


def test_render_only_needs_no_github_and_no_token(github) -> None:
    answer = _client(github, role=None).post(URL, json={"suite": "ref"})
    assert answer.status_code == 200
    assert answer.json()["posted"] is False
    body = answer.json()["body"]
    assert body.startswith("<!-- cptrace:suite=ref -->") and "http://testserver/compare/1/2" in body
    assert github.requests == []


def test_post_creates_then_updates_one_comment_and_sets_a_status(github) -> None:
    client = _client(github)
    request = {"repo": REPO, "pr": 5, "suite": "ref", "post": True, "status": True}
    first = client.post(URL, json=request).json()
    second = client.post(URL, json=request).json()
    assert (first["action"], second["action"]) == ("created", "updated")
    assert first["comment_id"] == second["comment_id"] and first["status_state"] == "success"
    assert len(github.comments[(REPO, 5)]) == 1
    assert github.comments[(REPO, 5)][0]["body"] == second["body"]
    assert [s["sha"] for s in github.statuses] == ["b" * 40, "b" * 40]
    assert github.statuses[0]["context"] == "cptrace/ref"
    assert github.statuses[0]["target_url"] == "http://testserver/compare/1/2"
    assert github.statuses[0]["description"].startswith("faster: median 21.")


@pytest.mark.parametrize(
    ("role", "config", "request_extra", "status", "message"),
    [
        (None, True, {}, 401, "needs a bearer token"),
        (Role.VIEWER, True, {}, 403, "runner role"),
        (Role.RUNNER, False, {}, 503, "no GITHUB_TOKEN"),
        (Role.RUNNER, True, {"repo": None}, 400, "repo"),
        (Role.RUNNER, True, {"repo": "not a repo"}, 400, "OWNER/NAME"),
        (Role.RUNNER, True, {"suite": "bad suite"}, 400, "suite name"),
    ],
)
def test_post_errors(github, role, config, request_extra, status, message) -> None:
    request = {"repo": REPO, "pr": 5, "post": True, **request_extra}
    answer = _client(github, role=role, config=config).post(URL, json=request)
    assert answer.status_code == status, answer.text
    assert answer.json()["ok"] is False and message in answer.json()["error"]
    assert not any(r.method in ("POST", "PATCH") for r in github.requests)


def test_github_refusal_is_a_bad_gateway(github) -> None:
    github.token = "another-token"  # the service's token is now wrong
    answer = _client(github).post(URL, json={"repo": REPO, "pr": 5, "post": True})
    assert answer.status_code == 502 and "Bad credentials" in answer.json()["error"]


def test_unknown_run_is_404(github) -> None:
    answer = _client(github).post("/api/v1/comparisons/1/99/pr-comment", json={})
    assert answer.status_code == 404


def test_cli_prints_and_posts(github, monkeypatch) -> None:
    store = demo_store()
    store.runs[2] = store.runs[2].model_copy(update={"commit": "c" * 40})
    runner = CliRunner()
    with serve(make_app(store)) as server:
        printed = runner.invoke(
            cli_app,
            ["pr-comment", "--base", "1", "--head", "2", "--server", server, "--suite", "nightly"],
        )
        assert printed.exit_code == 0, printed.output
        assert printed.output.startswith("<!-- cptrace:suite=nightly -->")
        assert f"[Full comparison]({server}/compare/1/2)" in printed.output
        assert github.requests == []

        monkeypatch.setenv("GITHUB_TOKEN", "test-token")
        monkeypatch.setenv("GITHUB_API_URL", github.url)
        args = [
            "pr-comment",
            "--base",
            "1",
            "--head",
            "2",
            "--server",
            server,
            "--repo",
            REPO,
            "--pr",
            "9",
            "--post",
            "--status",
            "--public-url",
            "https://cptrace.example",
        ]
        posted = runner.invoke(cli_app, args)
        assert posted.exit_code == 0, posted.output
        assert "created" in posted.output and "commit status success" in posted.output
        again = runner.invoke(cli_app, args)
        assert "updated" in again.output
        assert len(github.comments[(REPO, 9)]) == 1
        assert "(https://cptrace.example/compare/1/2)" in github.comments[(REPO, 9)][0]["body"]

        missing = runner.invoke(
            cli_app, ["pr-comment", "--base", "1", "--head", "99", "--server", server]
        )
        assert missing.exit_code == 1 and "run 99 does not exist" in missing.output
        no_repo = runner.invoke(
            cli_app, ["pr-comment", "--base", "1", "--head", "2", "--server", server, "--post"]
        )
        assert no_repo.exit_code == 2  # usage error: --post without --repo/--pr
        monkeypatch.delenv("GITHUB_TOKEN")
        no_token = runner.invoke(cli_app, args)
        assert no_token.exit_code == 1 and "GITHUB_TOKEN is not set" in no_token.output
