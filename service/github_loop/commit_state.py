"""The commit's cptrace state on GitHub: a commit status, or a check run where the token may.

Commit statuses know success / failure / error / pending only, so "no baseline" is posted as
success with "no baseline" in the description, and "inconclusive" (the data cannot decide) as
pending: yellow, never green, so a required check stays unmet until a push decides. Check runs
(Checks API) have a ``neutral`` conclusion, used for both (the title says which), which branch
protection treats as passing while the checks list shows it apart from success; but only a
GitHub App installation token may create them. With ``CPTRACE_GITHUB_CHECK_RUNS``
set, the loop posts check runs and falls back to a commit status when GitHub refuses (403/404:
a personal access token, or an App without ``checks: write``), so the gate never goes silent.

Pending (jobs queued) and the result go through the same channel: a pending status left next
to a final check run would block a merge forever.
"""

from __future__ import annotations

import logging

from pr_bot.github import CheckConclusion, GitHubClient, GitHubError
from pr_bot.policy import StatusState
from pr_bot.suite_comment import github_state
from service.github_loop.config import LoopSettings

log = logging.getLogger("cptrace.github_loop")

CHECK_CONCLUSION: dict[StatusState, CheckConclusion] = {
    StatusState.SUCCESS: "success",
    StatusState.NEUTRAL: "neutral",
    StatusState.INCONCLUSIVE: "neutral",  # grey, apart from success; its title says why
    StatusState.FAILURE: "failure",
    StatusState.ERROR: "failure",  # a job failed: nothing was measured, the gate must not pass
}


def post_commit_state(
    client: GitHubClient,
    loop: LoopSettings,
    repo: str,
    sha: str,
    *,
    context: str,
    state: StatusState | None,
    description: str,
    target_url: str | None = None,
) -> str:
    """Post ``state`` (None: pending) as a check run or a commit status; returns which."""
    if loop.check_runs:
        try:
            client.create_check_run(
                repo,
                sha,
                name=context,
                conclusion=None if state is None else CHECK_CONCLUSION[state],
                title=description[:255],
                summary=description + (f"\n\n{target_url}" if target_url else ""),
                details_url=target_url,
            )
            return "check run"
        except GitHubError as exc:
            if exc.status not in (403, 404):
                raise
            log.warning("check runs refused (%s); posting a commit status instead", exc)
    client.create_commit_status(
        repo,
        sha,
        "pending" if state is None else github_state(state),
        context=context,
        description=description,
        target_url=target_url,
    )
    return "status"
