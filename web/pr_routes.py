"""``POST /api/v1/comparisons/{base_id}/{head_id}/pr-comment``: render, and optionally post.

Rendering only needs read access; posting to GitHub needs a runner (or admin) token, because it
writes somewhere in the service's name. The GitHub token and API URL come from the service's
environment (``GITHUB_TOKEN``, ``GITHUB_API_URL``), never from the request.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, Field

from analyzers.compare import CompareError
from analyzers.failure import failure_of
from pr_bot.comment import CommentContext, CommentError, render_comment
from pr_bot.github import GitHubConfig, GitHubError, GitHubInputError
from pr_bot.labels import compare_url, run_label
from pr_bot.publish import publish
from service.api.deps import ReadAccess, TokenRole, require_role
from service.auth import Role
from service.core.errors import ApiError, BadRequest, Conflict
from web.data import comparison_host_time
from web.store import RunId, StoreDep

router = APIRouter(prefix="/api/v1/comparisons", tags=["github"])


class GitHubFailed(ApiError):
    """GitHub refused or could not be reached (a bad gateway from the client's view)."""

    status = 502


class GitHubNotConfigured(ApiError):
    """The service has no GitHub token, so it cannot post."""

    status = 503


class PrCommentRequest(BaseModel):
    """Where the comment goes and what it compares."""

    repo: str | None = Field(default=None, description="OWNER/NAME; required with post")
    pr: int | None = Field(default=None, ge=1, description="pull-request number; with post")
    suite: str = Field(default="default", description="one comment per pull request and suite")
    post: bool = Field(default=False, description="post (create or update) the comment")
    status: bool = Field(default=False, description="also set a commit status on the head sha")
    base_window: str | None = Field(default=None, max_length=200)
    head_window: str | None = Field(default=None, max_length=200)


class PrCommentResponse(BaseModel):
    body: str
    posted: bool
    action: str | None = None  # "created" | "updated"
    comment_id: int | None = None
    comment_url: str | None = None
    status_state: str | None = None


def github_config() -> GitHubConfig | None:
    """GitHub credentials from the environment; None when unset (a dependency, so tests can
    point it at a fake GitHub)."""
    try:
        return GitHubConfig.from_env()
    except GitHubError:
        return None


GitHubConfigDep = Annotated[GitHubConfig | None, Depends(github_config)]


@router.post("/{base_id}/{head_id}/pr-comment", response_model=PrCommentResponse)
def pr_comment(
    base_id: RunId,
    head_id: RunId,
    body: PrCommentRequest,
    request: Request,
    store: StoreDep,
    role: TokenRole,
    _: ReadAccess,
    config: GitHubConfigDep,
) -> PrCommentResponse:
    """Render the comparison as a PR comment; with ``post``, create or update it on GitHub."""
    try:
        report = store.get_comparison(base_id, head_id, body.base_window, body.head_window)
    except CompareError as exc:
        raise BadRequest(str(exc)) from exc
    head = store.get_run(head_id, include_report=False)
    base = store.get_run(base_id, include_report=False)
    path = compare_url(base_id, head_id, body.base_window, body.head_window)
    context = CommentContext(
        suite=body.suite,
        base_name=run_label(base.id, base.name, base.commit, body.base_window),
        head_name=run_label(head.id, head.name, head.commit, body.head_window),
        comparison_url=str(request.base_url).rstrip("/") + path,
        base_failure=failure_of(base.manifest),
        head_failure=failure_of(head.manifest),
    )
    host = comparison_host_time(store, base_id, head_id, report)
    host_rows = host.rows if host else None
    try:
        if not body.post:
            return PrCommentResponse(
                body=render_comment(report, context, host_rows=host_rows), posted=False
            )
        require_role(Role.RUNNER, role, action="posting to GitHub")
        if not body.repo or body.pr is None:
            raise BadRequest("posting needs both repo (OWNER/NAME) and pr")
        if body.status and not head.commit:
            raise Conflict(f"run {head_id} has no commit sha to set a status on")
        if config is None:
            raise GitHubNotConfigured("the service has no GITHUB_TOKEN, so it cannot post")
        published = publish(
            report,
            context,
            repo=body.repo,
            pr=body.pr,
            config=config,
            head_sha=head.commit if body.status else None,
            host_rows=host_rows,
        )
    except (CommentError, GitHubInputError) as exc:
        raise BadRequest(str(exc)) from exc
    except GitHubError as exc:
        raise GitHubFailed(str(exc)) from exc
    return PrCommentResponse(
        body=published.body,
        posted=True,
        action=published.comment.action,
        comment_id=published.comment.comment_id,
        comment_url=published.comment.url,
        status_state=published.status_state,
    )
