"""``POST /api/v1/comparisons/{base_id}/{head_id}/pr-comment``: render, and optionally post.

The one place a comparison becomes a pull-request comment for a caller: the comparison page's
preview and the PR loop build theirs with the same ``pr_bot.comment.comment_context``, and
``cptrace pr-comment`` calls this endpoint. Rendering only needs read access; posting to GitHub
needs a runner (or admin) token, because it writes somewhere in the service's name. The GitHub
token and API URL come from the service's environment (``GITHUB_TOKEN``, ``GITHUB_API_URL``),
never from the request.
"""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from pr_bot.comment import CommentError, CommentRun, comment_context, render_comment
from pr_bot.deltas import host_rows_for
from pr_bot.github import GitHubError, GitHubInputError, StatusState
from pr_bot.publish import commit_status, post_comment
from service.api.deps import DbDep, ReadAccess, TokenRole, require_role
from service.api.routes.github import GitHubDep
from service.api.schemas import RunId
from service.auth import Role
from service.core.errors import ApiError, BadRequest, Conflict
from service.store import RunDetail, get_comparison, get_run

router = APIRouter(prefix="/comparisons", tags=["github"])


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
    link_root: str | None = Field(
        default=None,
        max_length=2000,
        pattern=r"^https?://\S+$",
        description="server URL for the comment's link (default: this server's)",
    )


class CommitStatusBody(BaseModel):
    """The commit status this comparison gets (the gate's state; red for a failed job)."""

    state: StatusState
    description: str
    target_url: str | None = None


class PrCommentResponse(BaseModel):
    body: str
    suite: str
    posted: bool
    head_commit: str | None = None
    commit_status: CommitStatusBody
    """What ``status`` sets (or would set) on ``head_commit``."""
    action: str | None = None  # "created" | "updated"
    comment_id: int | None = None
    comment_url: str | None = None
    status_state: str | None = None
    """The state set on GitHub, when one was."""


def _side(run: RunDetail) -> CommentRun:
    return CommentRun(run.id, run.name, run.commit, run.manifest)


@router.post("/{base_id}/{head_id}/pr-comment", response_model=PrCommentResponse)
def pr_comment(
    base_id: RunId,
    head_id: RunId,
    body: PrCommentRequest,
    request: Request,
    db: DbDep,
    role: TokenRole,
    _: ReadAccess,
    config: GitHubDep,
) -> PrCommentResponse:
    """Render the comparison as a PR comment; with ``post``, create or update it on GitHub."""
    windows = {"base_window": body.base_window, "head_window": body.head_window}
    report = get_comparison(db, base_id, head_id, **windows)
    base, head = get_run(db, base_id), get_run(db, head_id)
    context = comment_context(
        suite=body.suite, base=_side(base), head=_side(head), **windows,
        link_root=body.link_root or str(request.base_url),
    )  # fmt: skip
    host_rows = host_rows_for(base.report, head.report, report)
    try:
        text = render_comment(report, context, host_rows=host_rows)
    except CommentError as exc:
        raise BadRequest(str(exc)) from exc
    status = commit_status(report, context, host_rows=host_rows)
    answer = PrCommentResponse(
        body=text, suite=body.suite, posted=False, head_commit=head.commit,
        commit_status=CommitStatusBody(
            state=status.state, description=status.description, target_url=status.target_url
        ),
    )  # fmt: skip
    if not body.post:
        return answer
    require_role(Role.RUNNER, role, action="posting to GitHub")
    if not body.repo or body.pr is None:
        raise BadRequest("posting needs both repo (OWNER/NAME) and pr")
    if body.status and not head.commit:
        raise Conflict(f"run {head_id} has no commit sha to set a status on")
    if config is None:
        raise GitHubNotConfigured("the service has no GITHUB_TOKEN, so it cannot post")
    try:
        published = post_comment(
            text, suite=body.suite, repo=body.repo, pr=body.pr, config=config,
            head_sha=head.commit if body.status else None, status=status,
        )  # fmt: skip
    except GitHubInputError as exc:
        raise BadRequest(str(exc)) from exc
    except GitHubError as exc:
        raise GitHubFailed(str(exc)) from exc
    return answer.model_copy(
        update={
            "posted": True,
            "action": published.comment.action,
            "comment_id": published.comment.comment_id,
            "comment_url": published.comment.url,
            "status_state": published.status_state,
        }
    )
