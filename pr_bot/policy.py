"""A suite's threshold policy: turn a comparison into success / failure / neutral, with reasons.

The statistics are the comparison's own (``analyzers.stats``: difference of medians, a
percentile-bootstrap confidence interval of it, and a two-sided Mann-Whitney U test). The policy
adds what a merge gate needs on top: a *minimum effect size*, so a significant but negligible
slowdown (0.3 % on a quiet machine) does not block a merge, and optional exact gates on launch
counts (deterministic: any increase is real) and on findings that appeared (also
deterministic: a helper that starts running, a rule that starts firing).

A regression of the iteration time needs all three: p below ``alpha``, the whole confidence
interval of the median difference above zero, and the median slower by at least
``min_effect_pct``.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field

from analyzers.report import ComparisonReport, Severity
from pr_bot.labels import LAUNCHES_PER_STEP


class StatusState(StrEnum):
    """The commit status the verdict maps to."""

    SUCCESS = "success"
    FAILURE = "failure"
    NEUTRAL = "neutral"  # no baseline: nothing to judge (posted as GitHub's "success")
    ERROR = "error"  # a job failed: no measurement


class Thresholds(BaseModel):
    """Per-suite policy (``thresholds:`` in ``.cptrace.yml``)."""

    model_config = ConfigDict(extra="forbid")

    alpha: float = Field(default=0.05, gt=0, lt=1, description="significance level of the test")
    min_effect_pct: float = Field(
        default=3.0, ge=0, description="smallest median slowdown (%) that counts as a regression"
    )
    max_launch_increase: float | None = Field(
        default=None,
        ge=0,
        description="fail when launches per step (CPU launch calls) grow by more (None: off)",
    )
    fail_on_new_findings: Severity | None = Field(
        default=None,
        description="fail when the head has a finding of at least this severity that the base "
        "lacks (info, warning, error; None: off)",
    )


class Verdict(BaseModel):
    """The policy's answer for one comparison."""

    state: StatusState
    reasons: list[str]
    """Why it failed (empty when it passed)."""
    method: str


_SEVERITY_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.ERROR: 2}


def launch_delta(report: ComparisonReport) -> float:
    """Launches per step (CPU launch calls), head minus base, summed over helpers and ranks."""
    return sum(d.delta_launches for d in report.helpers)


def judge(report: ComparisonReport, thresholds: Thresholds) -> Verdict:
    """Apply ``thresholds`` to ``report``."""
    reasons: list[str] = []
    it = report.iterations
    method = (
        f"regression = p < {thresholds.alpha:g} (Mann-Whitney U, two-sided) and the "
        f"{it.confidence:.0%} bootstrap CI of the median difference above 0 and the median "
        f"{thresholds.min_effect_pct:g}% or more slower"
        if it is not None
        else "no iteration times in one of the runs: only the exact gates apply"
    )
    if (
        it is not None
        and it.p_value < thresholds.alpha
        and it.ci_low_ms > 0
        and it.delta_median_pct >= thresholds.min_effect_pct
    ):
        reasons.append(
            f"iteration time median {it.base.median_ms:.2f} -> {it.head.median_ms:.2f} ms "
            f"({it.delta_median_pct:+.1f}%, p={it.p_value:.2g}, CI [{it.ci_low_ms:+.2f}, "
            f"{it.ci_high_ms:+.2f}] ms)"
        )
    delta = launch_delta(report)
    if thresholds.max_launch_increase is not None and delta > thresholds.max_launch_increase:
        reasons.append(
            f"{LAUNCHES_PER_STEP} {delta:+.0f} (the suite allows "
            f"+{thresholds.max_launch_increase:g})"
        )
    if thresholds.fail_on_new_findings is not None:
        floor = _SEVERITY_RANK[thresholds.fail_on_new_findings]
        base_keys = {(f.rule, f.helper) for f in report.findings_base}
        new = [
            f.title
            for f in report.findings_head
            if (f.rule, f.helper) not in base_keys and _SEVERITY_RANK[f.severity] >= floor
        ]
        if new:
            reasons.append(f"{len(new)} new finding(s): " + "; ".join(new))
    state = StatusState.FAILURE if reasons else StatusState.SUCCESS
    return Verdict(state=state, reasons=reasons, method=method)


def combine(states: list[StatusState]) -> StatusState:
    """One status for a suite of several specs: the worst of them."""
    for worst in (StatusState.ERROR, StatusState.FAILURE, StatusState.NEUTRAL):
        if worst in states:
            return worst
    return StatusState.SUCCESS
