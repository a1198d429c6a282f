"""A small GitHub REST client: issue comments (list, create, update) and commit statuses.

Only what the pull-request comment needs, over ``httpx``. The token comes from the environment
(``GITHUB_TOKEN``) and the API root from ``GITHUB_API_URL`` (default ``https://api.github.com``;
GitHub Enterprise Server uses ``https://HOST/api/v3``). Pagination follows the ``Link`` header,
but only to the configured API origin, so a forged ``next`` link cannot make the client send the
token elsewhere.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlsplit

import httpx

DEFAULT_API_URL = "https://api.github.com"
_REPO_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})/[A-Za-z0-9._-]{1,100}$")
_SHA_RE = re.compile(r"^[0-9a-fA-F]{7,64}$")
_LINK_RE = re.compile(r'<([^>]+)>\s*;\s*rel="([^"]+)"')
MAX_PAGES = 100  # 10,000 comments at 100 per page: far beyond any real pull request
StatusState = Literal["error", "failure", "pending", "success"]


class GitHubError(RuntimeError):
    """GitHub refused a request or answered something unusable; ``status`` is the HTTP code."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class GitHubInputError(GitHubError):
    """The request cannot be made as asked (bad OWNER/NAME, SHA or comment); nothing was sent."""


@dataclass(frozen=True, slots=True)
class GitHubConfig:
    """Where and as whom to talk to GitHub."""

    token: str
    api_url: str = DEFAULT_API_URL

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> GitHubConfig:
        """Read ``GITHUB_TOKEN`` and ``GITHUB_API_URL``; a missing token is an error."""
        env = os.environ if env is None else env
        token = env.get("GITHUB_TOKEN", "").strip()
        if not token:
            raise GitHubError("GITHUB_TOKEN is not set: it is needed to post pull-request comments")
        api_url = env.get("GITHUB_API_URL", "").strip() or DEFAULT_API_URL
        if urlsplit(api_url).scheme not in ("http", "https"):
            raise GitHubError(f"GITHUB_API_URL must be an http(s) URL, got {api_url!r}")
        return cls(token=token, api_url=api_url.rstrip("/"))


def parse_link_header(value: str | None) -> dict[str, str]:
    """``Link: <url>; rel="next", <url>; rel="last"`` -> ``{"next": url, "last": url}``."""
    return {rel: url for url, rel in _LINK_RE.findall(value or "")}


def check_repo(repo: str) -> str:
    """Validate ``OWNER/NAME`` before it is pasted into a URL path."""
    if not _REPO_RE.match(repo):
        raise GitHubInputError(f"repository must look like OWNER/NAME, got {repo!r}")
    return repo


@dataclass(frozen=True, slots=True)
class CommentResult:
    """What :func:`upsert_comment` did."""

    action: Literal["created", "updated"]
    comment_id: int
    url: str | None


class GitHubClient:
    """Synchronous client; use as a context manager so the connection pool is closed."""

    def __init__(
        self,
        config: GitHubConfig,
        *,
        timeout: float = 15.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.config = config
        self._origin = _origin(config.api_url)
        self._http = httpx.Client(
            timeout=timeout,
            transport=transport,
            headers={
                "Accept": "application/vnd.github+json",
                "Authorization": f"Bearer {config.token}",
                "X-GitHub-Api-Version": "2022-11-28",
                "User-Agent": "cptrace",
            },
        )

    def __enter__(self) -> GitHubClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        if _origin(url) != self._origin:
            raise GitHubError(f"refusing to send the token to {url!r}: not under {self._origin}")
        try:
            response = self._http.request(method, url, **kwargs)
        except httpx.HTTPError as exc:
            raise GitHubError(f"{method} {url} failed: {exc}") from exc
        if response.status_code >= 400:
            try:
                detail = response.json().get("message", response.text)
            except ValueError:
                detail = response.text
            raise GitHubError(
                f"{method} {url} answered {response.status_code}: {detail[:500]}",
                status=response.status_code,
            )
        return response

    def _url(self, path: str) -> str:
        return f"{self.config.api_url}{path}"

    def list_issue_comments(self, repo: str, number: int) -> list[dict[str, Any]]:
        """Every comment on an issue or pull request, following ``Link: rel="next"``."""
        url: str | None = self._url(f"/repos/{check_repo(repo)}/issues/{int(number)}/comments")
        params: dict[str, Any] | None = {"per_page": 100}
        comments: list[dict[str, Any]] = []
        for _ in range(MAX_PAGES):
            if url is None:
                return comments
            response = self._request("GET", url, params=params)
            page = response.json()
            if not isinstance(page, list):
                raise GitHubError(f"GET {url}: expected a JSON list of comments")
            comments.extend(page)
            url = parse_link_header(response.headers.get("link")).get("next")
            params = None  # the next link already carries the query
        raise GitHubError(f"more than {MAX_PAGES} pages of comments on {repo}#{number}")

    def create_issue_comment(self, repo: str, number: int, body: str) -> dict[str, Any]:
        path = f"/repos/{check_repo(repo)}/issues/{int(number)}/comments"
        return dict(self._request("POST", self._url(path), json={"body": body}).json())

    def update_issue_comment(self, repo: str, comment_id: int, body: str) -> dict[str, Any]:
        path = f"/repos/{check_repo(repo)}/issues/comments/{int(comment_id)}"
        return dict(self._request("PATCH", self._url(path), json={"body": body}).json())

    def create_commit_status(
        self,
        repo: str,
        sha: str,
        state: StatusState,
        *,
        context: str,
        description: str,
        target_url: str | None = None,
    ) -> dict[str, Any]:
        """Set a commit status; GitHub caps the description at 140 characters."""
        if not _SHA_RE.match(sha):
            raise GitHubInputError(f"commit status needs a hex commit SHA, got {sha!r}")
        payload: dict[str, Any] = {
            "state": state,
            "context": context,
            "description": description[:140],
        }
        if target_url:
            payload["target_url"] = target_url
        path = f"/repos/{check_repo(repo)}/statuses/{sha}"
        return dict(self._request("POST", self._url(path), json=payload).json())


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


def find_marked_comment(comments: list[dict[str, Any]], marker: str) -> dict[str, Any] | None:
    """The first comment whose body starts with ``marker`` (our comment for this suite).

    Starting-with rather than containing: a human quoting our comment in a reply must not become
    the comment we overwrite.
    """
    for comment in comments:
        body = comment.get("body") or ""
        if body.lstrip().startswith(marker):
            return comment
    return None


def upsert_comment(
    client: GitHubClient, repo: str, number: int, marker: str, body: str
) -> CommentResult:
    """Update this suite's comment in place, or create it when the pull request has none."""
    if not body.lstrip().startswith(marker):
        raise GitHubInputError("the comment body must start with its suite marker")
    existing = find_marked_comment(client.list_issue_comments(repo, number), marker)
    if existing is None:
        created = client.create_issue_comment(repo, number, body)
        return CommentResult("created", int(created["id"]), created.get("html_url"))
    updated = client.update_issue_comment(repo, int(existing["id"]), body)
    return CommentResult("updated", int(updated.get("id", existing["id"])), updated.get("html_url"))


def status_for_verdict(verdict: str) -> StatusState:
    """A slower head fails the status; anything else passes (noise is not a failure)."""
    return "failure" if verdict == "slower" else "success"
