"""Post a rendered comparison to a pull request: one comment per suite, plus an optional status.

Shared by ``cptrace pr-comment --post`` and the service endpoint, so both find and update the
same comment. Rendering is :mod:`pr_bot.comment` (pure); HTTP is :mod:`pr_bot.github`. The
status is the loop's gate (:func:`pr_bot.policy.judge` with the default thresholds), so a
slowdown too few samples cannot decide is never posted as success.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from analyzers.failure import failure_headline
from analyzers.report import ComparisonReport
from pr_bot.comment import CommentContext, render_comment, suite_marker
from pr_bot.deltas import HostTimeRow
from pr_bot.github import (
    CommentResult,
    GitHubClient,
    GitHubConfig,
    GitHubError,
    StatusState,
    upsert_comment,
)
from pr_bot.policy import Thresholds, judge
from pr_bot.suite_comment import github_state


@dataclass(frozen=True, slots=True)
class Published:
    """What was posted: the comment (created or updated) and the commit status, if any."""

    body: str
    comment: CommentResult
    status_state: str | None = None


def status_description(report: ComparisonReport) -> str:
    """A commit-status line (GitHub shows at most 140 characters)."""
    it = report.iterations
    if it is None:
        return f"cptrace: {report.verdict}"
    return (
        f"{report.verdict}: median {it.base.median_ms:.2f} -> {it.head.median_ms:.2f} ms "
        f"({it.delta_median_pct:+.1f}%, p={it.p_value:.2g})"
    )


@dataclass(frozen=True, slots=True)
class CommitStatus:
    """The commit status a comparison gets: the gate's state, red for a failed job."""

    state: StatusState
    description: str
    target_url: str | None = None


def commit_status(
    report: ComparisonReport,
    context: CommentContext,
    *,
    host_rows: Sequence[HostTimeRow] | None = None,
) -> CommitStatus:
    """The gate (:func:`pr_bot.policy.judge`, default thresholds) as a GitHub status."""
    state: StatusState = github_state(judge(report, Thresholds(), host_rows=host_rows).state)
    description = status_description(report)
    failure = context.head_failure or context.base_failure
    if failure is not None:  # a failed or hung job is red, whatever its figures say
        state, description = "failure", f"a job failed: {failure_headline(failure)}"
    return CommitStatus(state, description, context.comparison_url)


def post_comment(
    body: str,
    *,
    suite: str,
    repo: str,
    pr: int,
    config: GitHubConfig,
    head_sha: str | None = None,
    status: CommitStatus | None = None,
    transport: httpx.BaseTransport | None = None,
) -> Published:
    """Create or update the suite's comment with ``body``; set ``status`` on ``head_sha``.

    ``cptrace pr-comment --post`` posts what the service rendered with this, under its own
    ``GITHUB_TOKEN``; :func:`publish` renders and posts in one call.

    :raises GitHubError: GitHub refused a request, or the inputs are unusable.
    """
    marker = suite_marker(suite)
    with GitHubClient(config, transport=transport) as client:
        comment = upsert_comment(client, repo, pr, marker, body)
        if head_sha is None or status is None:
            return Published(body, comment)
        client.create_commit_status(
            repo,
            head_sha,
            status.state,
            context=f"cptrace/{suite}",
            description=status.description,
            target_url=status.target_url,
        )
    return Published(body, comment, status.state)


def publish(
    report: ComparisonReport,
    context: CommentContext,
    *,
    repo: str,
    pr: int,
    config: GitHubConfig,
    head_sha: str | None = None,
    transport: httpx.BaseTransport | None = None,
    host_rows: Sequence[HostTimeRow] | None = None,
) -> Published:
    """Render the comparison (:func:`render_comment`) and post it (:func:`post_comment`).

    ``host_rows`` (``pr_bot.deltas.host_rows_for``) is the per-helper host-time table of a
    comparison with a side without GPU activity, as :func:`render_comment` takes it.

    :raises GitHubError: GitHub refused a request, or the inputs are unusable.
    """
    body = render_comment(report, context, host_rows=host_rows)
    status = commit_status(report, context, host_rows=host_rows) if head_sha else None
    return post_comment(
        body, suite=context.suite, repo=repo, pr=pr, config=config, head_sha=head_sha,
        status=status, transport=transport,
    )  # fmt: skip


__all__ = [
    "CommitStatus",
    "GitHubError",
    "Published",
    "commit_status",
    "post_comment",
    "publish",
    "status_description",
]
