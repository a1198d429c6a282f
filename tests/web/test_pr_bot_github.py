"""GitHub client against a local fake GitHub that records every request."""

from __future__ import annotations

import pytest
from fake_github import FakeGitHubServer

from pr_bot.github import (
    GitHubClient,
    GitHubConfig,
    GitHubError,
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
        ("GET", f"/repos/{REPO}/issues/7/comments"),
        ("POST", f"/repos/{REPO}/issues/7/comments"),
    ]
    first = github.requests[0]
    assert first.headers["authorization"] == "Bearer test-token"
    assert first.headers["accept"] == "application/vnd.github+json"
    assert first.query["per_page"] == ["100"]


def test_finds_the_marked_comment_on_a_later_page_and_patches_it(github) -> None:
    github.per_page_max = 2  # force pagination through Link headers
    for i in range(5):
        github.add_comment(REPO, 3, f"chatter {i}")
    github.add_comment(REPO, 3, f"> quoting {MARKER} in a reply")  # must not be overwritten
    target = github.add_comment(REPO, 3, MARKER + "\nold", user="cptrace-bot")
    with GitHubClient(GitHubConfig(token="test-token", api_url=github.url)) as client:
        result = upsert_comment(client, REPO, 3, MARKER, MARKER + "\nnew")
    assert result.action == "updated" and result.comment_id == target
    gets = [r for r in github.requests if r.method == "GET"]
    assert [r.query.get("page", ["1"])[0] for r in gets] == ["1", "2", "3", "4"]
    patch = github.requests[-1]
    assert (patch.method, patch.path) == ("PATCH", f"/repos/{REPO}/issues/comments/{target}")
    assert patch.body == {"body": MARKER + "\nnew"}
    assert not any(r.method == "POST" for r in github.requests)
    bodies = [c["body"] for c in github.comments[(REPO, 3)]]
    assert bodies.count(MARKER + "\nnew") == 1 and f"> quoting {MARKER} in a reply" in bodies


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
