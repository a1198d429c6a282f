"""The webhook endpoint and the planner against the real app (TestClient, real SQLite) and the
fake GitHub: signatures, replays, unknown events, suite files, forks and their approval."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fake_github import FakeGitHubServer, sign
from fastapi.testclient import TestClient
from loop_repo import SMOKE_SPEC, LoopRepo
from pydantic import SecretStr

from pr_bot.github import GitHubConfig
from service.api.routes.github import github_config, loop_settings
from service.core.config import Settings
from service.github_loop.config import LoopSettings
from service.main import create_app

REPO = "octo/model"
SECRET = "hook-secret"
URL = "/api/v1/github/webhook"


@pytest.fixture()
def github():
    with FakeGitHubServer() as state:
        yield state


@pytest.fixture()
def repo(tmp_path: Path) -> LoopRepo:
    repo = LoopRepo(tmp_path / "git")
    repo.commit("one", spec=SMOKE_SPEC)
    repo.push("main")
    return repo


def _app(tmp_path: Path, github, *, secret: str | None = SECRET, **loop: Any):
    app = create_app(Settings(data_dir=tmp_path / "data", ingest_workers=0))
    settings = LoopSettings(
        webhook_secret=SecretStr(secret) if secret else None, public_url="https://c.test", **loop
    )
    app.dependency_overrides[loop_settings] = lambda: settings
    config = GitHubConfig(token=github.token, api_url=github.url)
    app.dependency_overrides[github_config] = lambda: config
    return app


def _deliver(
    client: TestClient, event: str, payload: dict[str, Any], *, delivery: str = "d1", sig=None
):
    body = json.dumps(payload).encode()
    return client.post(
        URL,
        content=body,
        headers={
            "X-GitHub-Event": event,
            "X-GitHub-Delivery": delivery,
            "X-Hub-Signature-256": sig if sig is not None else sign(SECRET, body),
            "Content-Type": "application/json",
        },
    )


def _pr(action: str, head: str, base: str, clone_url: str, *, fork: bool = False, **extra: Any):
    return {
        "action": action,
        "number": 5,
        "pull_request": {
            "number": 5,
            "head": {
                "sha": head,
                "ref": "topic",
                "repo": {"full_name": "eve/model" if fork else REPO},
            },
            "base": {"sha": base, "ref": "main", "repo": {"full_name": REPO}},
        },
        "repository": {"full_name": REPO, "clone_url": clone_url},
        "sender": {"login": "eve" if fork else "dev"},
        **extra,
    }


def _jobs(app) -> list[dict[str, Any]]:
    return app.state.db.read(
        lambda c: [dict(r) for r in c.execute("SELECT * FROM jobs ORDER BY id").fetchall()]
    )


def _rows(app, sql: str) -> list[tuple[Any, ...]]:
    return app.state.db.read(lambda c: [tuple(r) for r in c.execute(sql).fetchall()])


def test_signature_is_checked_on_the_raw_body(tmp_path, github, repo) -> None:
    app = _app(tmp_path, github)
    github.git_dirs[REPO] = repo.bare
    head = repo.git("rev-parse", "HEAD")
    payload = _pr("opened", head, head, repo.clone_url)
    with TestClient(app) as client:
        for bad in ("", "sha256=" + "0" * 64, sign("other-secret", b"{}"), "sha1=abc"):
            answer = _deliver(client, "pull_request", payload, sig=bad)
            assert answer.status_code == 401, bad
            assert "X-Hub-Signature-256" in answer.json()["error"]
        assert _jobs(app) == [] and _rows(app, "SELECT * FROM github_deliveries") == []
        assert github.requests == []  # nothing was read before the signature check


def test_no_secret_configured_is_503_not_an_open_door(tmp_path, github) -> None:
    with TestClient(_app(tmp_path, github, secret=None)) as client:
        answer = _deliver(client, "push", {})
    assert answer.status_code == 503 and "CPTRACE_GITHUB_WEBHOOK_SECRET" in answer.json()["error"]


def test_unknown_events_and_untracked_pushes_are_202_and_queue_nothing(
    tmp_path, github, repo
) -> None:
    app = _app(tmp_path, github)
    head = repo.git("rev-parse", "HEAD")
    with TestClient(app) as client:
        star = _deliver(client, "star", {"action": "created"}, delivery="a")
        assert star.status_code == 202 and "not handled" in star.json()["outcome"]
        other = {"ref": "refs/heads/dev", "after": head, "repository": {
            "full_name": REPO, "clone_url": repo.clone_url}}  # fmt: skip
        push = _deliver(client, "push", other, delivery="b")
        assert push.status_code == 202 and "not a tracked branch" in push.json()["outcome"]
        closed = _deliver(client, "pull_request", _pr("closed", head, head, repo.clone_url),
                          delivery="c")  # fmt: skip
        assert closed.status_code == 202 and "nothing to do" in closed.json()["outcome"]
        garbage = client.post(URL, content=b"not json", headers={
            "X-GitHub-Event": "push", "X-GitHub-Delivery": "x",
            "X-Hub-Signature-256": sign(SECRET, b"not json")})  # fmt: skip
        assert garbage.status_code == 400 and "not valid JSON" in garbage.json()["error"]
    assert _jobs(app) == []


def test_a_pull_request_queues_one_job_per_spec_with_its_checkout(tmp_path, github, repo) -> None:
    github.git_dirs[REPO] = repo.bare
    base = repo.git("rev-parse", "HEAD")
    repo.git("checkout", "-qb", "topic")
    head = repo.commit("two", spec={**SMOKE_SPEC, "layers": 2}, setup="pip install -e .")
    repo.push("topic")
    app = _app(tmp_path, github)
    with TestClient(app) as client:
        answer = _deliver(client, "pull_request", _pr("opened", head, base, repo.clone_url))
        assert answer.status_code == 202, answer.text
        assert len(answer.json()["batches"]) == 1
        replay = _deliver(client, "pull_request", _pr("opened", head, base, repo.clone_url))
        assert replay.status_code == 200 and replay.json()["duplicate"] is True
        # Same commit under a new delivery id (e.g. "reopened"): the batch exists, no new job.
        again = _deliver(client, "pull_request", _pr("reopened", head, base, repo.clone_url),
                         delivery="d2")  # fmt: skip
        assert again.status_code == 202
        assert again.json()["outcome"] == "already queued for this commit"
        claimed = client.post(
            "/api/v1/jobs/claim", json={"runner": "r", "gpus": 0, "wait_s": 0},
            headers={"Authorization": f"Bearer {_runner_token(app)}"},
        )  # fmt: skip
    jobs = _jobs(app)
    assert len(jobs) == 1
    job = jobs[0]
    assert (job["repo"], job["pr_number"], job["head_sha"], job["base_sha"], job["suite"]) == (
        REPO, 5, head, base, "smoke")  # fmt: skip
    assert json.loads(job["spec_json"])["layers"] == 2  # the spec file at the head commit
    checkout = claimed.json()["checkout"]
    assert checkout["sha"] == head and checkout["clone_url"] == repo.clone_url
    assert checkout["setup"] == "pip install -e ." and checkout["pr"] == 5
    pending = github.statuses_for(head)
    assert pending[-1]["state"] == "pending" and pending[-1]["context"] == "cptrace/smoke"


def _runner_token(app) -> str:
    from service.auth import Role, create_token

    return app.state.db.write(lambda c: create_token(c, role=Role.RUNNER, name="runner"))


def test_a_bad_suite_file_is_reported_and_queues_nothing(tmp_path, github, repo) -> None:
    (repo.work / ".cptrace.yml").write_text("suites:\n  smoke:\n    specs: []\n    gpuz: 2\n")
    repo.git("commit", "-qam", "typo")
    head = repo.git("rev-parse", "HEAD")
    repo.push("main")
    github.git_dirs[REPO] = repo.bare
    app = _app(tmp_path, github)
    with TestClient(app) as client:
        push = {"ref": "refs/heads/main", "after": head,
                "repository": {"full_name": REPO, "clone_url": repo.clone_url}}  # fmt: skip
        answer = _deliver(client, "push", push)
    assert answer.status_code == 202
    assert answer.json()["outcome"].startswith("not queued: .cptrace.yml at ")
    assert "suites.smoke" in answer.json()["outcome"]
    assert _jobs(app) == []


def test_github_outage_forgets_the_delivery_so_a_redelivery_works(tmp_path, github, repo) -> None:
    github.git_dirs[REPO] = repo.bare
    head = repo.git("rev-parse", "HEAD")
    for _ in range(4):
        github.fail_next(502, method="GET", path_re="/contents/")
    app = _app(tmp_path, github, retry_base_s=0.0)  # retried without waiting
    push = {"ref": "refs/heads/main", "after": head,
            "repository": {"full_name": REPO, "clone_url": repo.clone_url}}  # fmt: skip
    with TestClient(app) as client:
        first = _deliver(client, "push", push)
        assert first.status_code == 502 and "GitHub" in first.json()["error"]
        assert _jobs(app) == []
        second = _deliver(client, "push", push)
        assert second.status_code == 202 and len(_jobs(app)) == 1


def test_fork_waits_for_approval_by_a_writer(tmp_path, github, repo) -> None:
    github.git_dirs[REPO] = repo.bare
    base = repo.git("rev-parse", "HEAD")
    head = repo.commit("fork change", spec={**SMOKE_SPEC, "heads": 4})
    repo.push("main")
    github.permissions[(REPO, "maint")] = "write"
    github.pulls[(REPO, 5)] = _pr("opened", head, base, repo.clone_url, fork=True)["pull_request"]
    app = _app(tmp_path, github)
    with TestClient(app) as client:
        fork_pr = _pr("opened", head, base, repo.clone_url, fork=True)
        opened = _deliver(client, "pull_request", fork_pr, delivery="o")
        assert opened.status_code == 202 and "waiting for a maintainer" in opened.json()["outcome"]
        assert _jobs(app) == []
        assert "waiting for a maintainer" in github.statuses_for(head)[-1]["description"]
        # The fork's author labels it, or comments the command: no write access, ignored.
        label = {"label": {"name": "cptrace:approved"}}
        self_label = _deliver(client, "pull_request",
                              _pr("labeled", head, base, repo.clone_url, fork=True, **label),
                              delivery="l1")  # fmt: skip
        assert "no write access" in self_label.json()["outcome"] and _jobs(app) == []
        comment = {"action": "created", "issue": {"number": 5, "pull_request": {}},
                   "comment": {"body": "/cptrace run", "user": {"login": "eve"}},
                   "repository": {"full_name": REPO, "clone_url": repo.clone_url}}  # fmt: skip
        self_approve = _deliver(client, "issue_comment", comment, delivery="c1")
        assert "no write access" in self_approve.json()["outcome"] and _jobs(app) == []
        # A maintainer comments the command: the current head is queued.
        comment["comment"]["user"]["login"] = "maint"
        approved = _deliver(client, "issue_comment", comment, delivery="c2")
        assert approved.status_code == 202 and approved.json()["batches"], approved.text
    jobs = _jobs(app)
    assert [(j["head_sha"], j["pr_number"]) for j in jobs] == [(head, 5)]
    perms = [r.path for r in github.requests if r.path.endswith("/permission")]
    assert perms == [f"/repos/{REPO}/collaborators/{u}/permission" for u in ("eve", "eve", "maint")]


def test_a_newer_push_takes_the_older_heads_queued_jobs_out(tmp_path, github, repo) -> None:
    github.git_dirs[REPO] = repo.bare
    base = repo.git("rev-parse", "HEAD")
    repo.git("checkout", "-qb", "topic")
    first = repo.commit("first try", spec={**SMOKE_SPEC, "layers": 2})
    second = repo.commit("second try", spec={**SMOKE_SPEC, "layers": 3})
    repo.push("topic")
    app = _app(tmp_path, github)
    with TestClient(app) as client:
        _deliver(client, "pull_request", _pr("opened", first, base, repo.clone_url), delivery="1")
        _deliver(client, "pull_request", _pr("synchronize", second, base, repo.clone_url),
                 delivery="2")  # fmt: skip
    jobs = {j["head_sha"]: j for j in _jobs(app)}
    assert jobs[first]["status"] == "failed"
    assert jobs[first]["reason"] == "superseded by a newer push"
    assert jobs[second]["status"] == "queued"
    assert _rows(app, "SELECT head_sha, status FROM pr_batches ORDER BY id") == [
        (first, "superseded"), (second, "queued")]  # fmt: skip


def test_with_check_runs_on_pending_and_results_are_check_runs(tmp_path, github, repo) -> None:
    """An App token posts check runs (no baseline is "neutral"); a personal token cannot, and
    the same call falls back to a commit status, so the gate is never silent."""
    from pr_bot.github import GitHubClient
    from pr_bot.policy import StatusState
    from service.github_loop.commit_state import post_commit_state

    github.git_dirs[REPO] = repo.bare
    github.app_token = True
    base = repo.git("rev-parse", "HEAD")
    repo.git("checkout", "-qb", "topic")
    head = repo.commit("two", spec={**SMOKE_SPEC, "layers": 2})
    repo.push("topic")
    app = _app(tmp_path, github, check_runs=True)
    with TestClient(app) as client:
        answer = _deliver(client, "pull_request", _pr("opened", head, base, repo.clone_url))
        assert answer.status_code == 202, answer.text
    assert github.statuses_for(head) == []
    (pending,) = github.check_runs
    assert (pending["name"], pending["head_sha"], pending["status"]) == (
        "cptrace/smoke", head, "in_progress")  # fmt: skip
    assert "conclusion" not in pending and pending["output"]["title"].startswith("queued 1 job")

    loop = LoopSettings(check_runs=True)
    config = GitHubConfig(token=github.token, api_url=github.url)
    with GitHubClient(config) as gh:
        how = post_commit_state(
            gh, loop, REPO, head, context="cptrace/smoke", state=StatusState.NEUTRAL,
            description="no baseline: no baseline on the base branch",
            target_url="https://c.test/runs/3",
        )  # fmt: skip
        assert how == "check run"
        final = github.check_runs[-1]
        assert (final["status"], final["conclusion"]) == ("completed", "neutral")
        assert final["details_url"] == "https://c.test/runs/3"
        github.app_token = False  # a personal access token: 403 -> a commit status
        how = post_commit_state(
            gh, loop, REPO, head, context="cptrace/smoke", state=StatusState.NEUTRAL,
            description="no baseline: no baseline on the base branch",
        )  # fmt: skip
        assert how == "status"
        assert github.statuses_for(head)[-1]["state"] == "success"  # statuses have no neutral
        how = post_commit_state(
            gh, LoopSettings(), REPO, head, context="cptrace/smoke", state=StatusState.ERROR,
            description="a job failed",
        )  # fmt: skip
        assert how == "status" and github.statuses_for(head)[-1]["state"] == "failure"


def test_a_bad_suite_file_on_a_pull_request_posts_the_fix_and_a_failing_status(
    tmp_path, github, repo
) -> None:
    base = repo.git("rev-parse", "HEAD")
    repo.git("checkout", "-qb", "topic")
    (repo.work / ".cptrace.yml").write_text(
        "suites:\n  smoke:\n    specs: [bench/smoke.yaml]\n    gpuz: 2\n"
    )
    repo.git("commit", "-qam", "typo in the suite file")
    head = repo.git("rev-parse", "HEAD")
    repo.push("topic")
    github.git_dirs[REPO] = repo.bare
    app = _app(tmp_path, github)
    with TestClient(app) as client:
        answer = _deliver(client, "pull_request", _pr("opened", head, base, repo.clone_url))
        assert answer.status_code == 202, answer.text
        assert answer.json()["outcome"].startswith("not queued: .cptrace.yml at ")
        again = _deliver(client, "pull_request", _pr("synchronize", head, base, repo.clone_url),
                         delivery="d2")  # fmt: skip
        assert again.status_code == 202
    assert _jobs(app) == []
    (body,) = github.bodies(REPO, 5)  # the second delivery updated the same comment
    assert body.startswith("<!-- cptrace:suite-file -->")
    assert f"**File**: `.cptrace.yml at {head[:12]}`" in body
    assert "**Field**: `suites.smoke.gpuz`" in body
    assert "Extra inputs are not permitted" in body
    assert "**Fix**: remove 'gpuz' from suites.smoke or correct its spelling" in body
    status = github.statuses_for(head)[-1]
    assert status["state"] == "failure" and status["context"] == "cptrace"
    assert status["description"].startswith("invalid .cptrace.yml: suites.smoke.gpuz:")


def test_a_suite_file_that_is_not_yaml_names_line_and_column(tmp_path, github, repo) -> None:
    base = repo.git("rev-parse", "HEAD")
    repo.git("checkout", "-qb", "topic")
    (repo.work / ".cptrace.yml").write_text("suites:\n  smoke: [unclosed\n")
    repo.git("commit", "-qam", "broken yaml")
    head = repo.git("rev-parse", "HEAD")
    repo.push("topic")
    github.git_dirs[REPO] = repo.bare
    with TestClient(_app(tmp_path, github)) as client:
        answer = _deliver(client, "pull_request", _pr("opened", head, base, repo.clone_url))
    assert answer.status_code == 202, answer.text
    (body,) = github.bodies(REPO, 5)
    assert "**Field**: `line 3, column 1`" in body and "not valid YAML" in body
    assert "**Fix**: fix the YAML syntax at line 3, column 1" in body
    assert github.statuses_for(head)[-1]["state"] == "failure"
