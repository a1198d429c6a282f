"""A small GitHub REST client: comments, commit statuses, and the reads the PR loop needs.

Only what the pull-request bot needs, over ``httpx``. The token comes from the environment
(``GITHUB_TOKEN``) and the API root from ``GITHUB_API_URL`` (default ``https://api.github.com``;
GitHub Enterprise Server uses ``https://HOST/api/v3``). Pagination follows the ``Link`` header,
but only to the configured API origin, so a forged ``next`` link cannot make the client send the
token elsewhere.

Transient answers are retried with a bounded, jittered backoff (:class:`RetryPolicy`): 5xx and
GitHub's secondary rate limits (403/429 with ``Retry-After``, or ``x-ratelimit-remaining: 0``).
Creating a comment is not retried on its own (a 502 after GitHub stored it would duplicate it):
:func:`upsert_comment` retries the whole list-then-write, so a comment that did get created is
found by the next listing and updated instead.
"""

from __future__ import annotations

import base64
import os
import random
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar
from urllib.parse import quote, urlsplit

import httpx

DEFAULT_API_URL = "https://api.github.com"
_REPO_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})/[A-Za-z0-9._-]{1,100}$")
_SHA_RE = re.compile(r"^[0-9a-fA-F]{7,64}$")
_LINK_RE = re.compile(r'<([^>]+)>\s*;\s*rel="([^"]+)"')
MAX_PAGES = 100  # 10,000 comments at 100 per page: far beyond any real pull request
StatusState = Literal["error", "failure", "pending", "success"]
CheckConclusion = Literal["failure", "neutral", "success"]
"""The Checks API's conclusions cptrace uses (unlike commit statuses, it has "neutral")."""
WRITE_PERMISSIONS = frozenset({"admin", "maintain", "write"})
_T = TypeVar("_T")


class GitHubError(RuntimeError):
    """GitHub refused a request or answered something unusable; ``status`` is the HTTP code."""

    def __init__(
        self, message: str, status: int | None = None, retry_after_s: float | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.retry_after_s = retry_after_s

    @property
    def retryable(self) -> bool:
        """5xx, a network failure (no status), or a rate limit that says when to come back."""
        if self.status is None or self.status >= 500:
            return True
        return self.status in (403, 429) and self.retry_after_s is not None


class GitHubInputError(GitHubError):
    """The request cannot be made as asked (bad OWNER/NAME, SHA or comment); nothing was sent."""


@dataclass(frozen=True, slots=True)
class GitHubConfig:
    """Where and as whom to talk to GitHub."""

    token: str
    api_url: str = DEFAULT_API_URL
    login: str | None = None
    """The token's own user (``GITHUB_BOT_LOGIN``); None: asked from ``GET /user``. A GitHub
    App installation token cannot call ``/user``: set it to the app's ``NAME[bot]`` login."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> GitHubConfig:
        """Read ``GITHUB_TOKEN``, ``GITHUB_API_URL`` and ``GITHUB_BOT_LOGIN``; a missing token
        is an error."""
        env = os.environ if env is None else env
        token = env.get("GITHUB_TOKEN", "").strip()
        if not token:
            raise GitHubError("GITHUB_TOKEN is not set: it is needed to post pull-request comments")
        api_url = env.get("GITHUB_API_URL", "").strip() or DEFAULT_API_URL
        if urlsplit(api_url).scheme not in ("http", "https"):
            raise GitHubError(f"GITHUB_API_URL must be an http(s) URL, got {api_url!r}")
        login = env.get("GITHUB_BOT_LOGIN", "").strip() or None
        return cls(token=token, api_url=api_url.rstrip("/"), login=login)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Bounded exponential backoff with jitter; a server's ``Retry-After`` is honoured up to
    ``max_s`` (a longer wait fails now rather than holding a worker for minutes)."""

    attempts: int = 4
    base_s: float = 1.0
    max_s: float = 30.0
    sleep: Callable[[float], None] = field(default=time.sleep, compare=False)

    def delay(self, attempt: int, error: GitHubError) -> float | None:
        """Seconds to wait before attempt ``attempt + 1``; None: give up."""
        if attempt >= self.attempts or not error.retryable:
            return None
        if error.retry_after_s is not None:
            return None if error.retry_after_s > self.max_s else error.retry_after_s
        backoff = min(self.max_s, self.base_s * 2 ** (attempt - 1))
        return backoff * (0.5 + random.random() / 2)

    def run(self, call: Callable[[], _T]) -> _T:
        """``call()`` until it succeeds, fails for good, or the attempts are used up."""
        attempt = 1
        while True:
            try:
                return call()
            except GitHubError as exc:
                wait = self.delay(attempt, exc)
                if wait is None:
                    raise
                self.sleep(wait)
                attempt += 1


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
        retry: RetryPolicy | None = None,
    ) -> None:
        self.config = config
        self.retry = retry or RetryPolicy()
        self._login = config.login
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

    def _request(
        self, method: str, url: str, *, retry: bool = True, **kwargs: Any
    ) -> httpx.Response:
        if _origin(url) != self._origin:
            raise GitHubError(f"refusing to send the token to {url!r}: not under {self._origin}")
        if not retry:
            return self._send(method, url, **kwargs)
        return self.retry.run(lambda: self._send(method, url, **kwargs))

    def _send(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, url, **kwargs)
        except httpx.HTTPError as exc:
            raise GitHubError(f"{method} {url} failed: {exc}") from exc
        if response.status_code >= 400:
            try:
                detail = str(response.json().get("message", response.text))
            except (ValueError, AttributeError):
                detail = response.text
            raise GitHubError(
                f"{method} {url} answered {response.status_code}: {detail[:500]}",
                status=response.status_code,
                retry_after_s=_rate_limit_wait(response, detail),
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
        """Not retried here: see :func:`upsert_comment`."""
        path = f"/repos/{check_repo(repo)}/issues/{int(number)}/comments"
        response = self._request("POST", self._url(path), json={"body": body}, retry=False)
        return dict(response.json())

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

    def create_check_run(
        self,
        repo: str,
        sha: str,
        *,
        name: str,
        conclusion: CheckConclusion | None,
        title: str,
        summary: str,
        details_url: str | None = None,
    ) -> dict[str, Any]:
        """A check run on ``sha``: completed with ``conclusion``, or in progress (None).

        Only GitHub App installation tokens may create check runs (``checks: write``); a
        personal access token gets 403, which the caller turns into a commit status."""
        if not _SHA_RE.match(sha):
            raise GitHubInputError(f"check run needs a hex commit SHA, got {sha!r}")
        payload: dict[str, Any] = {
            "name": name,
            "head_sha": sha,
            "status": "completed" if conclusion else "in_progress",
            "output": {"title": title[:255], "summary": summary[:65_535]},
        }
        if conclusion:
            payload["conclusion"] = conclusion
        if details_url:
            payload["details_url"] = details_url
        path = f"/repos/{check_repo(repo)}/check-runs"
        return dict(self._request("POST", self._url(path), json=payload).json())

    def viewer_login(self) -> str:
        """The login of the token's own user: only its comments may be updated in place."""
        if self._login is None:
            user = self._request("GET", self._url("/user")).json()
            login = user.get("login") if isinstance(user, dict) else None
            if not isinstance(login, str) or not login:
                raise GitHubError("GET /user answered no login; set GITHUB_BOT_LOGIN")
            self._login = login
        return self._login

    def get_file(self, repo: str, path: str, ref: str) -> str | None:
        """A file's text at ``ref`` (contents API); None when it does not exist there."""
        url = self._url(f"/repos/{check_repo(repo)}/contents/{quote(path.lstrip('/'))}")
        try:
            data = self._request("GET", url, params={"ref": ref}).json()
        except GitHubError as exc:
            if exc.status == 404:
                return None
            raise
        if not isinstance(data, dict) or data.get("type") != "file":
            raise GitHubError(f"{repo}:{path}@{ref} is not a file")
        if data.get("encoding") != "base64":
            raise GitHubError(f"{repo}:{path}@{ref}: unexpected encoding {data.get('encoding')!r}")
        try:
            return base64.b64decode(str(data.get("content", ""))).decode("utf-8")
        except (ValueError, UnicodeDecodeError) as exc:
            raise GitHubError(f"{repo}:{path}@{ref} is not UTF-8 text: {exc}") from exc

    def get_pull(self, repo: str, number: int) -> dict[str, Any]:
        """One pull request (head/base refs and SHAs, the head repository)."""
        url = self._url(f"/repos/{check_repo(repo)}/pulls/{int(number)}")
        return dict(self._request("GET", url).json())

    def merge_base(self, repo: str, base: str, head: str) -> str | None:
        """The merge-base SHA of ``base`` and ``head`` (compare API); None when unknown."""
        for ref in (base, head):
            if not _SHA_RE.match(ref):
                raise GitHubInputError(f"merge base needs hex commit SHAs, got {ref!r}")
        url = self._url(f"/repos/{check_repo(repo)}/compare/{base}...{head}")
        try:
            data = self._request("GET", url).json()
        except GitHubError as exc:
            if exc.status == 404:
                return None
            raise
        sha = (data.get("merge_base_commit") or {}).get("sha") if isinstance(data, dict) else None
        return sha if isinstance(sha, str) and _SHA_RE.match(sha) else None

    def permission(self, repo: str, user: str) -> str:
        """``admin`` / ``maintain`` / ``write`` / ``triage`` / ``read`` / ``none``."""
        url = self._url(f"/repos/{check_repo(repo)}/collaborators/{quote(user)}/permission")
        try:
            data = self._request("GET", url).json()
        except GitHubError as exc:
            if exc.status == 404:
                return "none"
            raise
        role = data.get("role_name") or data.get("permission") if isinstance(data, dict) else None
        return str(role or "none")

    def can_write(self, repo: str, user: str) -> bool:
        """Whether ``user`` may push to ``repo`` (what approving a fork's run requires)."""
        return self.permission(repo, user) in WRITE_PERMISSIONS


def _rate_limit_wait(response: httpx.Response, detail: str) -> float | None:
    """How long GitHub asks us to wait, for a 403/429 that is a rate limit; else None.

    Secondary limits send ``Retry-After``; primary limits ``x-ratelimit-remaining: 0`` with the
    reset time. A 403 without either is a permission problem, not worth retrying.
    """
    if response.status_code not in (403, 429):
        return None
    headers = response.headers
    try:
        if "retry-after" in headers:
            return max(0.0, float(headers["retry-after"]))
        if headers.get("x-ratelimit-remaining") == "0" and "x-ratelimit-reset" in headers:
            return max(0.0, float(headers["x-ratelimit-reset"]) - time.time())
    except ValueError:
        return None
    if "secondary rate limit" in detail.lower():
        return 60.0
    return None


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


def find_marked_comment(
    comments: list[dict[str, Any]], marker: str, author: str
) -> dict[str, Any] | None:
    """The first comment by ``author`` whose body starts with ``marker`` (our suite comment).

    Starting-with rather than containing: a human quoting our comment in a reply must not become
    the comment we overwrite. Only ``author``'s comments (the token's own user) count: anyone
    can paste the marker into a comment, and we must neither edit it (we could not, without
    admin rights) nor skip our real one because of it.
    """
    for comment in comments:
        user = comment.get("user") or {}
        if not isinstance(user, dict) or user.get("login") != author:
            continue
        body = comment.get("body") or ""
        if body.lstrip().startswith(marker):
            return comment
    return None


def upsert_comment(
    client: GitHubClient, repo: str, number: int, marker: str, body: str
) -> CommentResult:
    """Update this suite's comment in place, or create it when the pull request has none.

    A transient failure of the create is retried by listing again first (see the module
    docstring), so a create that GitHub did store is updated, not duplicated.
    """
    if not body.lstrip().startswith(marker):
        raise GitHubInputError("the comment body must start with its suite marker")
    author = client.viewer_login()
    attempt = 1
    while True:
        existing = find_marked_comment(client.list_issue_comments(repo, number), marker, author)
        if existing is not None:
            updated = client.update_issue_comment(repo, int(existing["id"]), body)
            cid = int(updated.get("id", existing["id"]))
            return CommentResult("updated", cid, updated.get("html_url"))
        try:
            created = client.create_issue_comment(repo, number, body)
        except GitHubError as exc:
            wait = client.retry.delay(attempt, exc)
            if wait is None:
                raise
            client.retry.sleep(wait)  # then list again: the failed create may have landed
            attempt += 1
            continue
        return CommentResult("created", int(created["id"]), created.get("html_url"))


def status_for_verdict(verdict: str) -> StatusState:
    """A slower head fails the status; anything else passes (noise is not a failure)."""
    return "failure" if verdict == "slower" else "success"
