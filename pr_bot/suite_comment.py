"""The automated loop's comment: one per pull request and suite, one section per spec.

Each spec ended one of three ways: compared with a baseline run (the verdict of the suite's
policy, the metric table, the per-helper deltas, findings), measured without a baseline (the
head's findings alone, and why there was none), or failed (the reason and the log's tail). The
suite's state is the worst of its specs; the commit status says the same in one line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from analyzers.manifest import FailureRecord
from analyzers.report import ComparisonReport, Finding
from pr_bot.comment import (
    LOG_TAIL_LINES,
    CommentContext,
    cap_length,
    comparison_lines,
    failure_lines,
    fenced,
    finding_lines,
    host_time_headline,
    md_code,
    md_text,
    suite_marker,
)
from pr_bot.deltas import HostTimeRow
from pr_bot.github import StatusState as GitHubState
from pr_bot.policy import StatusState, Thresholds, Verdict, combine, method_text

_STATE_TEXT = {
    StatusState.SUCCESS: (":white_check_mark:", "no regression"),
    StatusState.FAILURE: (":x:", "regression"),
    StatusState.INCONCLUSIVE: (":warning:", "inconclusive"),
    StatusState.NEUTRAL: (":grey_question:", "no baseline"),
    StatusState.ERROR: (":boom:", "a job failed"),
}


@dataclass(frozen=True, slots=True)
class Baseline:
    """The base-branch run a head run was compared with, and how it was chosen."""

    run_id: int
    label: str
    how: Literal["merge-base", "newest"]
    merge_base: str | None = None
    base_ref: str = "main"

    def sentence(self) -> str:
        if self.how == "merge-base":
            return (
                f"Baseline: {md_code(self.label)}, measured at the merge base "
                f"{md_code((self.merge_base or '')[:12])} of {md_code(self.base_ref)}."
            )
        missing = (
            f"the merge base {md_code(self.merge_base[:12])} has not been measured"
            if self.merge_base
            else "the merge base is unknown"
        )
        return (
            f"Baseline: {md_code(self.label)}, the newest measured run of "
            f"{md_code(self.base_ref)} ({missing})."
        )


@dataclass(frozen=True, slots=True)
class ComparedSpec:
    spec: str
    report: ComparisonReport
    verdict: Verdict
    context: CommentContext
    baseline: Baseline
    host_rows: list[HostTimeRow] | None = None
    """Per-helper host time when a run has no GPU activity (``pr_bot.deltas.host_time_rows``)."""
    arm: str | None = None
    """The variant's window group ("arm:fixed") when a spec run is compared arm by arm."""
    history: list[str] = field(default_factory=list)
    """What the base branch's history says: the runs pooled, change points found."""

    @property
    def title(self) -> str:
        return self.spec if self.arm is None else f"{self.spec} {self.arm}"


@dataclass(frozen=True, slots=True)
class UnbaselinedSpec:
    spec: str
    head_name: str
    reason: str
    findings: list[Finding] = field(default_factory=list)
    head_url: str | None = None


@dataclass(frozen=True, slots=True)
class FailedSpec:
    spec: str
    reason: str
    log_tail: str = ""
    failure: FailureRecord | None = None
    """The run's failure record when the failed job left a bundle (which rank raised what
    where, or each rank's stack of a hung job)."""


SpecResult = ComparedSpec | UnbaselinedSpec | FailedSpec


def spec_state(result: SpecResult) -> StatusState:
    if isinstance(result, ComparedSpec):
        return result.verdict.state
    if isinstance(result, UnbaselinedSpec):
        return StatusState.NEUTRAL
    return StatusState.ERROR


def suite_state(results: Sequence[SpecResult]) -> StatusState:
    return combine([spec_state(r) for r in results])


def github_state(state: StatusState) -> GitHubState:
    """Commit statuses know error/failure/pending/success only. No baseline passes (nothing to
    judge; the description says "no baseline"). Inconclusive is ``pending``: yellow, never
    green, and a required check stays unmet until a push with more samples decides (or a
    maintainer overrides); the description starts with "inconclusive"."""
    return {
        StatusState.SUCCESS: "success",
        StatusState.NEUTRAL: "success",
        StatusState.INCONCLUSIVE: "pending",
        StatusState.FAILURE: "failure",
        StatusState.ERROR: "failure",  # a job failed or hung: red, like a regression
    }[state]  # type: ignore[return-value]


def status_description(results: Sequence[SpecResult]) -> str:
    """One line for the commit status (GitHub shows at most 140 characters)."""
    state = suite_state(results)
    parts = []
    for r in results:
        if isinstance(r, ComparedSpec) and r.verdict.reasons:
            parts.append(f"{r.title}: {r.verdict.reasons[0]}")
        elif isinstance(r, ComparedSpec) and r.verdict.inconclusive and not r.verdict.reasons:
            if state == StatusState.INCONCLUSIVE:
                parts.append(f"{r.title}: {r.verdict.inconclusive[0]}")
        elif isinstance(r, FailedSpec):
            parts.append(f"{r.spec}: {r.reason}")
    if not parts:
        parts = [
            "nothing measured on the base branch to compare with (not judged)"
            if state == StatusState.NEUTRAL
            else "no regression beyond the suite's thresholds"
        ]
    return f"{_STATE_TEXT[state][1]}: " + "; ".join(parts)


def _section(result: SpecResult) -> list[str]:
    icon, text = _STATE_TEXT[spec_state(result)]
    heading = md_code(result.spec)
    if isinstance(result, ComparedSpec) and result.arm is not None:
        heading += f" {md_code(result.arm)}"
    lines = [f"#### {heading}: {icon} {text}", ""]
    if isinstance(result, ComparedSpec):
        verdict = result.verdict
        lines += [f"- {md_text(reason)}" for reason in verdict.reasons]
        lines += [f"- inconclusive: {md_text(why)}" for why in verdict.inconclusive]
        lines += [f"- {md_text(note)}" for note in verdict.notes]
        headline = host_time_headline(result.host_rows or [])
        if headline:
            lines.append(f"- {headline}")
        lines += [f"- {md_text(line)}" for line in result.history]
        if verdict.reasons or verdict.inconclusive or verdict.notes or headline or result.history:
            lines.append("")
        lines += [result.baseline.sentence(), ""]
        lines += comparison_lines(
            result.report, result.context, level=5, host_rows=result.host_rows
        )
    elif isinstance(result, UnbaselinedSpec):
        lines += [
            f"No baseline: {md_text(result.reason)}. The head's findings alone "
            f"({md_code(result.head_name)}):",
            "",
            *finding_lines(result.findings),
        ]
        if result.head_url:
            lines += ["", f"[Head run]({result.head_url})"]
    elif result.failure is not None:
        lines += failure_lines(result.failure, log_tail=result.log_tail.splitlines())
    else:
        lines += [f"The job failed: {md_text(result.reason)}", ""]
        if result.log_tail.strip():
            lines += fenced("log tail", result.log_tail.rstrip().splitlines(), LOG_TAIL_LINES)
    return [*lines, ""]


def render_suite_comment(
    suite: str,
    head_sha: str,
    results: Sequence[SpecResult],
    thresholds: Thresholds,
    *,
    link: str | None = None,
) -> str:
    """The whole comment; starts with the suite's marker so the next push updates it."""
    state = suite_state(results)
    icon, text = _STATE_TEXT[state]
    specs = len({r.spec for r in results})
    lines = [
        suite_marker(suite),
        f"### cptrace · {md_text(suite)}: {icon} {text}",
        "",
        f"Head {md_code(head_sha[:12])}; {specs} spec(s). Policy: "
        + md_text(method_text(thresholds))
        + (
            f"; launches per step may grow by at most {thresholds.max_launch_increase:g}"
            if thresholds.max_launch_increase is not None
            else ""
        )
        + ".",
        "",
    ]
    for result in results:
        lines += _section(result)
    return cap_length("\n".join(lines) + "\n", link)


SUITE_FILE_MARKER = "<!-- cptrace:suite-file -->"
"""The marker of the comment that reports an invalid suite file (one per pull request)."""


def render_suite_file_error(where: str, field: str, problem: str, fix: str) -> str:
    """The comment for an invalid ``.cptrace.yml``: the file, the field, what is wrong, the fix.

    Nothing ran: the suites could not be read, so there is no per-suite comment either.
    """
    lines = [
        SUITE_FILE_MARKER,
        f"### cptrace: {_STATE_TEXT[StatusState.ERROR][0]} invalid suite file",
        "",
        "Nothing was measured: the suite file could not be read.",
        "",
        f"- **File**: {md_code(where)}",
        f"- **Field**: {md_code(field)}",
        f"- **Problem**: {md_text(problem)}",
        f"- **Fix**: {md_text(fix)}",
        "",
        "Push a commit with the fix; its suites run then.",
    ]
    return cap_length("\n".join(lines) + "\n")


def suite_file_status(field: str, problem: str) -> str:
    """The commit status description (GitHub keeps 140 characters)."""
    return f"invalid .cptrace.yml: {field}: {problem}"[:140]
