"""The PR comment is built in one place: the service endpoint, ``cptrace pr-comment`` (which
calls it) and the comparison page's preview give the same text, over a real store (two real
bundles uploaded through the API and analysed by the real worker) and a local fake GitHub."""

from __future__ import annotations

import ast
import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_github import FakeGitHubServer
from fastapi.testclient import TestClient
from stored_runs import assert_analysed, drain_worker, upload_bundles
from testkit import REPO_ROOT, demo_bundle
from typer.testing import CliRunner
from web_server import serve

from cptrace.app import create_app
from cptrace.cli import app as cli_app
from pr_bot.github import GitHubConfig
from service.api.deps import token_role
from service.api.routes.github import github_config
from service.auth import Role, create_token
from service.core.config import Settings

pytestmark = pytest.mark.slow  # two bundles uploaded and analysed: ~18 s together, scheduled first

REPO = "octo/cp-attn"
BUNDLE = demo_bundle("synthetic-h200x2-kineto")
BASE_SHA, HEAD_SHA = "a" * 40, "b" * 40


def _with_commit(source: Path, out: Path, commit: str) -> Path:
    """``source`` with its manifest's ``run.commit`` set (the traces unchanged)."""
    with tarfile.open(source) as tar, tarfile.open(out, "w:gz") as dst:
        for member in tar.getmembers():
            data = tar.extractfile(member).read() if member.isfile() else None  # type: ignore[union-attr]
            if member.name == "manifest.json" and data is not None:
                manifest = json.loads(data)
                manifest["run"]["commit"] = commit
                data = json.dumps(manifest).encode()
                member.size = len(data)
            dst.addfile(member, io.BytesIO(data) if data is not None else None)
    return out


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("pr-comment")
    bundles = {
        "base": _with_commit(BUNDLE, root / "base.tar.gz", BASE_SHA),
        "head": _with_commit(BUNDLE, root / "head.tar.gz", HEAD_SHA),
    }
    settings = Settings(data_dir=root / "data", ingest_workers=0)
    app = create_app(settings)
    token = app.state.db.write_tx(lambda c: create_token(c, role=Role.RUNNER))
    with TestClient(app) as client:
        ids = upload_bundles(client, token, bundles)
        drain_worker(settings)
        assert_analysed(client, ids)
        yield {"app": app, "ids": ids}
    app.dependency_overrides.clear()


@pytest.fixture()
def github() -> Iterator[FakeGitHubServer]:
    with FakeGitHubServer() as state:
        yield state


def _client(
    stored: dict[str, Any], github: FakeGitHubServer, role: Role | None = Role.RUNNER,
    config: bool = True,
) -> TestClient:  # fmt: skip
    app = stored["app"]
    app.dependency_overrides[token_role] = lambda: role
    cfg = GitHubConfig(token="test-token", api_url=github.url) if config else None
    app.dependency_overrides[github_config] = lambda: cfg
    return TestClient(app)


def _url(stored: dict[str, Any], head: int | None = None) -> str:
    ids = stored["ids"]
    return f"/api/v1/comparisons/{ids['base']}/{head or ids['head']}/pr-comment"


def test_no_module_but_pr_bot_builds_a_comment_context() -> None:
    """``pr_bot.comment.comment_context`` is the one builder: no caller assembles one."""
    found = []
    for package in ("service", "web", "cptrace", "pr_bot", "runners"):
        for path in sorted((REPO_ROOT / package).rglob("*.py")):
            if path == REPO_ROOT / "pr_bot" / "comment.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call):
                    func = node.func
                    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
                    if name == "CommentContext":
                        found.append(f"{path.relative_to(REPO_ROOT)}:{node.lineno}")
    assert not found, "CommentContext built outside pr_bot.comment.comment_context:\n" + "\n".join(
        found
    )


def test_the_api_the_cli_and_the_page_say_the_same(
    stored: dict[str, Any], github: FakeGitHubServer
) -> None:
    ids = stored["ids"]
    with serve(stored["app"]) as server:
        client = _client(stored, github, role=None)
        api = client.post(_url(stored), json={"suite": "preview", "link_root": server})
        assert api.status_code == 200, api.text
        body = api.json()["body"]
        page = client.get(f"{server}/compare/{ids['base']}/{ids['head']}.json")
        assert page.status_code == 200, page.text
        printed = CliRunner().invoke(
            cli_app, ["pr-comment", "--base", str(ids["base"]), "--head", str(ids["head"]),
                      "--server", server, "--suite", "preview"],
        )  # fmt: skip
    assert printed.exit_code == 0, printed.output
    assert body.startswith("<!-- cptrace:suite=preview -->")
    assert f"[Full comparison]({server}/compare/{ids['base']}/{ids['head']})" in body
    assert f"@ {HEAD_SHA[:10]}" in body and f"@ {BASE_SHA[:10]}" in body
    assert printed.output == body
    assert page.json()["markdown"] == body
    assert github.requests == []


def test_post_creates_then_updates_one_comment_and_sets_a_status(
    stored: dict[str, Any], github: FakeGitHubServer
) -> None:
    client = _client(stored, github)
    request = {"repo": REPO, "pr": 5, "suite": "ref", "post": True, "status": True}
    first = client.post(_url(stored), json=request).json()
    second = client.post(_url(stored), json=request).json()
    assert (first["action"], second["action"]) == ("created", "updated"), first
    assert first["comment_id"] == second["comment_id"]
    assert first["status_state"] == first["commit_status"]["state"]
    assert first["status_state"] in ("success", "pending", "failure")
    assert len(github.comments[(REPO, 5)]) == 1
    assert github.comments[(REPO, 5)][0]["body"] == second["body"]
    assert [s["sha"] for s in github.statuses] == [HEAD_SHA, HEAD_SHA]
    assert github.statuses[0]["context"] == "cptrace/ref"
    base, head = stored["ids"]["base"], stored["ids"]["head"]
    assert github.statuses[0]["target_url"] == f"http://testserver/compare/{base}/{head}"
    assert github.statuses[0]["description"] == first["commit_status"]["description"]


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
def test_post_errors(
    stored: dict[str, Any], github: FakeGitHubServer, role: Role | None, config: bool,
    request_extra: dict[str, Any], status: int, message: str,
) -> None:  # fmt: skip
    request = {"repo": REPO, "pr": 5, "post": True, **request_extra}
    answer = _client(stored, github, role=role, config=config).post(_url(stored), json=request)
    assert answer.status_code == status, answer.text
    assert answer.json()["ok"] is False and message in answer.json()["error"]
    assert not any(r.method in ("POST", "PATCH") for r in github.requests)


def test_github_refusal_is_a_bad_gateway(stored: dict[str, Any], github: FakeGitHubServer) -> None:
    github.token = "another-token"  # the service's token is now wrong
    answer = _client(stored, github).post(_url(stored), json={"repo": REPO, "pr": 5, "post": True})
    assert answer.status_code == 502 and "Bad credentials" in answer.json()["error"]


def test_unknown_run_is_404(stored: dict[str, Any], github: FakeGitHubServer) -> None:
    assert _client(stored, github).post(_url(stored, head=99), json={}).status_code == 404


def test_cli_posts_what_the_service_rendered(
    stored: dict[str, Any], github: FakeGitHubServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    base, head = (str(stored["ids"][k]) for k in ("base", "head"))
    runner = CliRunner()
    _client(stored, github, role=None)
    with serve(stored["app"]) as server:
        monkeypatch.setenv("GITHUB_TOKEN", "test-token")
        monkeypatch.setenv("GITHUB_API_URL", github.url)
        args = ["pr-comment", "--base", base, "--head", head, "--server", server,
                "--repo", REPO, "--pr", "9", "--post", "--status",
                "--public-url", "https://cptrace.example"]  # fmt: skip
        posted = runner.invoke(cli_app, args)
        assert posted.exit_code == 0, posted.output
        assert "created" in posted.output and "commit status" in posted.output
        again = runner.invoke(cli_app, args)
        assert "updated" in again.output
        assert len(github.comments[(REPO, 9)]) == 1
        comment = github.comments[(REPO, 9)][0]["body"]
        assert f"(https://cptrace.example/compare/{base}/{head})" in comment
        assert github.statuses[0]["target_url"] == f"https://cptrace.example/compare/{base}/{head}"

        missing = runner.invoke(cli_app, ["pr-comment", "--base", base, "--head", "99",
                                          "--server", server])  # fmt: skip
        assert missing.exit_code == 1 and "run 99 does not exist" in missing.output
        no_repo = runner.invoke(
            cli_app, ["pr-comment", "--base", base, "--head", head, "--server", server, "--post"]
        )
        assert no_repo.exit_code == 2  # usage error: --post without --repo/--pr
        monkeypatch.delenv("GITHUB_TOKEN")
        no_token = runner.invoke(cli_app, args)
        assert no_token.exit_code == 1 and "GITHUB_TOKEN is not set" in no_token.output
