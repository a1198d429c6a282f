"""GitHub client against a local fake GitHub that records every request."""

from __future__ import annotations

import pytest
from fake_github import FakeGitHubServer

from pr_bot.github import (
    GitHubClient,
    GitHubConfig,
    GitHubError,
    RetryPolicy,
    parse_link_header,
    status_for_verdict,
    upsert_comment,
)

MARKER = "<!-- cptrace:suite=ref -->"
REPO = "octo/cp-attn"


@pytest.fixture()
def github():
    with FakeGitHubServer() as state:
        state.per_page_max = 100
        yield state


def test_creates_a_comment_when_none_is_marked(github) -> None:
    github.add_comment(REPO, 7, "LGTM")
    with GitHubClient(GitHubConfig(token="test-token", api_url=github.url)) as client:
        result = upsert_comment(client, REPO, 7, MARKER, MARKER + "\nfirst")
    assert result.action == "created"
    assert [c["body"] for c in github.comments[(REPO, 7)]] == ["LGTM", MARKER + "\nfirst"]
    methods = [(r.method, r.path) for r in github.requests]
    assert methods == [
        ("GET", "/user"),
        ("GET", f"/repos/{REPO}/issues/7/comments"),
        ("POST", f"/repos/{REPO}/issues/7/comments"),
    ]
    first = github.requests[1]
    assert first.headers["authorization"] == "Bearer test-token"
    assert first.headers["accept"] == "application/vnd.github+json"
    assert first.query["per_page"] == ["100"]


def test_finds_the_marked_comment_on_a_later_page_and_patches_it(github) -> None:
    github.per_page_max = 2  # force pagination through Link headers
    for i in range(5):
        github.add_comment(REPO, 3, f"chatter {i}")
    github.add_comment(REPO, 3, f"> quoting {MARKER} in a reply")  # must not be overwritten
    github.add_comment(REPO, 3, MARKER + "\nplanted by someone else", user="mallory")
    target = github.add_comment(REPO, 3, MARKER + "\nold", user=github.login)
    with GitHubClient(GitHubConfig(token="test-token", api_url=github.url)) as client:
        result = upsert_comment(client, REPO, 3, MARKER, MARKER + "\nnew")
    assert result.action == "updated" and result.comment_id == target
    gets = [r for r in github.requests if r.method == "GET" and r.path != "/user"]
    assert [r.query.get("page", ["1"])[0] for r in gets] == ["1", "2", "3", "4"]
    patch = github.requests[-1]
    assert (patch.method, patch.path) == ("PATCH", f"/repos/{REPO}/issues/comments/{target}")
    assert patch.body == {"body": MARKER + "\nnew"}
    assert not any(r.method == "POST" for r in github.requests)
    bodies = [c["body"] for c in github.comments[(REPO, 3)]]
    assert bodies.count(MARKER + "\nnew") == 1 and f"> quoting {MARKER} in a reply" in bodies
    assert MARKER + "\nplanted by someone else" in bodies


def test_a_marked_comment_by_another_user_is_never_taken_over(github) -> None:
    planted = github.add_comment(REPO, 4, MARKER + "\nfake results", user="mallory")
    config = GitHubConfig(token="test-token", api_url=github.url, login=github.login)
    with GitHubClient(config) as client:
        result = upsert_comment(client, REPO, 4, MARKER, MARKER + "\nreal")
    assert result.action == "created" and result.comment_id != planted
    assert github.bodies(REPO, 4) == [MARKER + "\nfake results", MARKER + "\nreal"]
    assert not any(r.path == "/user" for r in github.requests)  # the configured login is used


def _fast_retry(sleeps: list[float]) -> RetryPolicy:
    return RetryPolicy(attempts=4, base_s=0.01, max_s=5.0, sleep=sleeps.append)


def test_5xx_and_secondary_rate_limits_are_retried_with_bounded_backoff(github) -> None:
    github.fail_next(502, method="GET", path_re="/comments$")
    github.fail_next(
        403,
        method="GET",
        path_re="/comments$",
        headers={"Retry-After": "2"},
        message="You have exceeded a secondary rate limit.",
    )
    sleeps: list[float] = []
    config = GitHubConfig(token="test-token", api_url=github.url)
    with GitHubClient(config, retry=_fast_retry(sleeps)) as client:
        result = upsert_comment(client, REPO, 9, MARKER, MARKER + "\nv1")
    assert result.action == "created"
    assert len(sleeps) == 2 and sleeps[1] == 2.0  # the server's Retry-After is honoured
    assert 0.005 <= sleeps[0] <= 0.01
    lists = [r for r in github.requests if r.path.endswith("/comments") and r.method == "GET"]
    assert len(lists) == 3


def test_a_failed_create_lists_again_instead_of_posting_twice(github) -> None:
    # The first POST fails with 502 *after* GitHub stored it: simulate by storing it ourselves.
    real_take = github.take_canned

    def take(method: str, path: str):
        canned = real_take(method, path)
        if canned is not None and method == "POST":
            github.add_comment(REPO, 5, MARKER + "\nv1", user=github.login)
        return canned

    github.take_canned = take  # type: ignore[method-assign]
    github.fail_next(502, method="POST", path_re="/comments$")
    sleeps: list[float] = []
    with GitHubClient(
        GitHubConfig(token="test-token", api_url=github.url), retry=_fast_retry(sleeps)
    ) as client:
        result = upsert_comment(client, REPO, 5, MARKER, MARKER + "\nv1")
    assert result.action == "updated" and len(sleeps) == 1
    assert github.bodies(REPO, 5) == [MARKER + "\nv1"]


def test_retries_are_bounded_and_permission_errors_are_not_retried(github) -> None:
    for _ in range(6):
        github.fail_next(503, method="GET")
    sleeps: list[float] = []
    config = GitHubConfig(token="test-token", api_url=github.url, login="x")
    with GitHubClient(config, retry=_fast_retry(sleeps)) as client:
        with pytest.raises(GitHubError, match="503") as info:
            client.list_issue_comments(REPO, 1)
        assert info.value.status == 503 and len(sleeps) == 3  # 4 attempts in all
        github.canned.clear()
        github.fail_next(403, method="GET", message="Resource not accessible by integration")
        with pytest.raises(GitHubError, match="403"):
            client.list_issue_comments(REPO, 1)
    assert len(sleeps) == 3
    too_long = GitHubError("x", status=429, retry_after_s=3600)
    assert RetryPolicy(max_s=30).delay(1, too_long) is None  # an hour's wait fails now


def test_contents_compare_pull_and_permission_reads(github, tmp_path) -> None:
    import subprocess

    work = tmp_path / "work"
    subprocess.run(["git", "init", "-q", "-b", "main", str(work)], check=True)
    (work / ".cptrace.yml").write_text("suites: {}\n")
    git = ["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "one"], check=True)
    sha = subprocess.run(
        [*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    github.git_dirs[REPO] = work / ".git"
    github.pulls[(REPO, 2)] = {"number": 2, "head": {"sha": sha}}
    github.permissions[(REPO, "maint")] = "maintain"
    with GitHubClient(GitHubConfig(token="test-token", api_url=github.url)) as client:
        assert client.get_file(REPO, ".cptrace.yml", sha) == "suites: {}\n"
        assert client.get_file(REPO, "missing.yml", sha) is None
        assert client.merge_base(REPO, sha, sha) == sha
        assert client.get_pull(REPO, 2)["head"]["sha"] == sha
        assert client.can_write(REPO, "maint") and not client.can_write(REPO, "drive-by")
        assert client.viewer_login() == github.login


def test_second_post_updates_instead_of_duplicating(github) -> None:
    with GitHubClient(GitHubConfig(token="test-token", api_url=github.url)) as client:
        first = upsert_comment(client, REPO, 1, MARKER, MARKER + "\nv1")
        second = upsert_comment(client, REPO, 1, MARKER, MARKER + "\nv2")
        other = upsert_comment(
            client, REPO, 1, "<!-- cptrace:suite=b -->", "<!-- cptrace:suite=b -->\nb"
        )
    assert (first.action, second.action, other.action) == ("created", "updated", "created")
    assert first.comment_id == second.comment_id != other.comment_id
    assert len(github.comments[(REPO, 1)]) == 2


def test_commit_status(github) -> None:
    sha = "a" * 40
    with GitHubClient(GitHubConfig(token="test-token", api_url=github.url)) as client:
        client.create_commit_status(
            REPO,
            sha,
            "failure",
            context="cptrace/ref",
            description="x" * 300,
            target_url="http://c.test/compare/1/2",
        )
    status = github.statuses[0]
    assert status["sha"] == sha and status["state"] == "failure"
    assert len(status["description"]) == 140 and status["context"] == "cptrace/ref"
    assert status_for_verdict("slower") == "failure"
    assert status_for_verdict("no significant change") == "success"


def test_errors_are_specific(github) -> None:
    with GitHubClient(GitHubConfig(token="wrong", api_url=github.url)) as client:
        with pytest.raises(GitHubError, match="401: Bad credentials") as info:
            client.list_issue_comments(REPO, 1)
        assert info.value.status == 401
        with pytest.raises(GitHubError, match="OWNER/NAME"):
            client.list_issue_comments("../../etc", 1)
        with pytest.raises(GitHubError, match="hex commit SHA"):
            client.create_commit_status(REPO, "main", "success", context="c", description="d")
        with pytest.raises(GitHubError, match="must start with its suite marker"):
            upsert_comment(client, REPO, 1, MARKER, "no marker")


def test_pagination_never_follows_links_to_another_host(github) -> None:
    config = GitHubConfig(token="test-token", api_url=github.url)
    with GitHubClient(config) as client, pytest.raises(GitHubError, match="refusing to send"):
        client._request("GET", "http://127.0.0.2:1/steal")
    assert github.requests == []


def test_enterprise_api_prefix_is_kept(github) -> None:
    config = GitHubConfig(token="test-token", api_url=github.url + "/api/v3")
    with GitHubClient(config) as client, pytest.raises(GitHubError, match="404"):
        client.list_issue_comments(REPO, 1)
    assert github.requests[0].path == f"/api/v3/repos/{REPO}/issues/1/comments"


def test_config_from_env() -> None:
    cfg = GitHubConfig.from_env({"GITHUB_TOKEN": "t", "GITHUB_API_URL": "https://ghe.test/api/v3/"})
    assert cfg == GitHubConfig(token="t", api_url="https://ghe.test/api/v3")
    assert GitHubConfig.from_env({"GITHUB_TOKEN": "t"}).api_url == "https://api.github.com"
    with pytest.raises(GitHubError, match="GITHUB_TOKEN is not set"):
        GitHubConfig.from_env({})
    with pytest.raises(GitHubError, match="http"):
        GitHubConfig.from_env({"GITHUB_TOKEN": "t", "GITHUB_API_URL": "ftp://x"})


def test_parse_link_header() -> None:
    value = (
        '<https://api.github.com/x?page=2>; rel="next", '
        '<https://api.github.com/x?page=5>; rel="last"'
    )
    assert parse_link_header(value) == {
        "next": "https://api.github.com/x?page=2",
        "last": "https://api.github.com/x?page=5",
    }
    assert parse_link_header(None) == {}
