"""A suite's gate: turn a comparison into success / failure / inconclusive, with reasons.

Rules (defaults in :class:`Thresholds`; docs/github.md lists them for users):

* **Iteration time** (the time gate). The relative shift head/base - 1 of the iteration times,
  its Hodges-Lehmann estimate and its exact distribution-free 95% CI
  (:func:`analyzers.stats.relative_shift`). *Regression* when the CI's lower bound is above
  ``threshold_pct``; *improvement* when its upper bound is below ``-threshold_pct``;
  *inconclusive* when the estimate is beyond the threshold but the CI does not decide, or when
  the samples are too few for any CI at this ``alpha`` (the gate says how many are needed).
  The base samples may be pooled from the base branch's last K runs (``baseline_runs``).
* **Per-helper GPU and host time.** The report holds one per-step figure per helper (summed
  over the profiled steps and ranks), not one per step, so no interval exists: the *aggregate
  rule* applies: a regression when the per-step time grew by more than ``gpu_threshold_pct``
  and ``helper_floor_ms`` (host: ``host_threshold_pct`` and ``host_floor_ms``; a helper that
  appears counts when it is above the floor). Host time is the steady state (each rank's first
  call of a helper, where compiled helpers compile, left out). It applies with or without
  iteration times.
  Communication helpers' GPU time is not gated: NCCL kernels spin while they wait for the peer,
  so their duration measures the other rank, not the helper (their host time is). Unattributed
  activity is no helper and is not gated (the iteration time and Total GPU show it). Host time
  under a profiler varies far more than kernel time: two captures of the same TE workload on
  2x H200 differ by up to +83% in a 5 ms helper's host time per step and +118% in a 0.26 ms one,
  hence the 100% and 0.5 ms defaults.
* **Exact gates.** Launch counts and findings are deterministic: ``max_launch_increase`` and
  ``fail_on_new_findings`` fail on any excess.
* **Comparability.** A comparability issue that refuses a time verdict (another workload) makes
  the time gates inconclusive with its message; the exact gates still apply.

A suite's state is the worst of its specs (and arms): error, failure, inconclusive, neutral (no
baseline), success. Inconclusive is never success: ``pr_bot.suite_comment.github_state``.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from enum import StrEnum

from pydantic import AliasChoices, BaseModel, ConfigDict, Field

from analyzers.report import UNATTRIBUTED, Category, ComparisonReport, Severity
from analyzers.stats import relative_shift, samples_needed, smallest_p
from pr_bot.deltas import HostTimeRow
from pr_bot.labels import LAUNCHES_PER_STEP

NS_PER_MS = 1e6
MAX_HELPER_REASONS = 3
"""Helpers named one by one in the reasons; the rest are counted."""


class StatusState(StrEnum):
    """The gate's answer for a spec, an arm or a suite (worst first in :data:`SEVERITY`)."""

    SUCCESS = "success"
    FAILURE = "failure"
    INCONCLUSIVE = "inconclusive"
    """The data cannot decide (too few samples, a CI across the threshold, runs that are not
    comparable): never green (a pending commit status, a neutral check run)."""
    NEUTRAL = "neutral"  # no baseline: nothing to judge (posted as GitHub's "success")
    ERROR = "error"  # a job failed: no measurement


SEVERITY = (
    StatusState.ERROR,
    StatusState.FAILURE,
    StatusState.INCONCLUSIVE,
    StatusState.NEUTRAL,
    StatusState.SUCCESS,
)


class TimeOutcome(StrEnum):
    """What the time gate found."""

    REGRESSION = "regression"
    IMPROVEMENT = "improvement"
    INCONCLUSIVE = "inconclusive"
    WITHIN = "within threshold"


class Thresholds(BaseModel):
    """Per-suite policy (``thresholds:`` in ``.cptrace.yml``)."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    threshold_pct: float = Field(
        default=5.0,
        ge=0,
        validation_alias=AliasChoices("threshold_pct", "min_effect_pct"),
        description="relative change (%) of the iteration time that counts, at the CI's bound "
        "(min_effect_pct: its old name)",
    )
    alpha: float = Field(
        default=0.05, gt=0, lt=1, description="1 - the confidence of the interval (0.05: 95%)"
    )
    gpu_threshold_pct: float = Field(
        default=10.0, ge=0, description="per-helper GPU time growth (%) that counts (aggregate)"
    )
    host_threshold_pct: float = Field(
        default=100.0, ge=0, description="per-helper host time growth (%) that counts (aggregate)"
    )
    helper_floor_ms: float = Field(
        default=0.05, ge=0, description="a helper's per-step GPU time growth must exceed this (ms)"
    )
    host_floor_ms: float = Field(
        default=0.5, ge=0, description="a helper's per-step host time growth must exceed this (ms)"
    )
    baseline_runs: int = Field(
        default=5, ge=1, le=50, description="K: base-branch runs whose iteration times are pooled"
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


class TimeGate(BaseModel):
    """The iteration-time gate's figures (percent of the base)."""

    outcome: TimeOutcome
    n_base: int
    n_head: int
    point_pct: float
    low_pct: float | None
    high_pct: float | None
    p_value: float
    text: str


class Verdict(BaseModel):
    """The gate's answer for one comparison."""

    state: StatusState
    reasons: list[str]
    """Why it failed (empty when it did not)."""
    method: str
    inconclusive: list[str] = Field(default_factory=list)
    """Why the data cannot decide (the state is inconclusive when ``reasons`` is empty)."""
    notes: list[str] = Field(default_factory=list)
    """What passed but is worth saying (an improvement, the rule that applied)."""
    time: TimeGate | None = None


_SEVERITY_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.ERROR: 2}


def launch_delta(report: ComparisonReport) -> float:
    """Launches per step (CPU launch calls), head minus base, summed over helpers and ranks."""
    return sum(d.delta_launches for d in report.helpers)


def method_text(thresholds: Thresholds) -> str:
    """The rules in one sentence (the comment's "Policy:" line)."""
    conf = f"{1 - thresholds.alpha:.0%}"
    return (
        f"iteration time: regression when the lower bound of the {conf} CI of the relative shift "
        f"(Hodges-Lehmann, exact distribution-free CI from the Mann-Whitney order statistics) is "
        f"above +{thresholds.threshold_pct:g}%, improvement when the upper bound is below "
        f"-{thresholds.threshold_pct:g}%, inconclusive when the estimate crosses the threshold "
        f"but the CI does not or n is too small; per-helper time (one figure per helper, no CI): "
        f"GPU +{thresholds.gpu_threshold_pct:g}% and +{thresholds.helper_floor_ms:g} ms per step, "
        f"host +{thresholds.host_threshold_pct:g}% and +{thresholds.host_floor_ms:g} ms per step"
    )


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{100 * x:+.1f}%"


def time_gate(base: Sequence[float], head: Sequence[float], thresholds: Thresholds) -> TimeGate:
    """The iteration-time rule on two samples (ms)."""
    shift = relative_shift(base, head, confidence=1.0 - thresholds.alpha)
    t = thresholds.threshold_pct / 100.0
    pct = f"{thresholds.threshold_pct:g}%"
    m, n = shift.n_base, shift.n_head
    medians = f"median {statistics.median(base):.2f} -> {statistics.median(head):.2f} ms"
    where = f"{_pct(shift.point)} ({medians}, n={m} vs {n}"
    if not shift.decidable:
        equal, more = samples_needed(m, n, thresholds.alpha)
        outcome = TimeOutcome.INCONCLUSIVE
        # the n needed first: a commit status keeps 140 characters
        text = (
            f"iteration time {_pct(shift.point)} (n={m} vs {n}): needs n >= {equal} per side, or "
            f"{more} head samples against these {m}; {m} vs {n} samples can never reach p < "
            f"{thresholds.alpha:g} (smallest possible p {smallest_p(m, n):.2g}; {medians})"
        )
    else:
        assert shift.low is not None and shift.high is not None
        ci = f"{1 - thresholds.alpha:.0%} CI [{_pct(shift.low)}, {_pct(shift.high)}]"
        detail = f"{where}, {ci}, p={shift.p_value:.2g})"
        if shift.low > t:
            outcome, text = TimeOutcome.REGRESSION, f"iteration time {detail}: above +{pct}"
        elif shift.high < -t:
            outcome, text = TimeOutcome.IMPROVEMENT, f"iteration time {detail}: below -{pct}"
        elif abs(shift.point) > t:
            outcome = TimeOutcome.INCONCLUSIVE
            text = f"iteration time {detail}: the estimate crosses ±{pct}, the CI does not"
        else:
            outcome, text = TimeOutcome.WITHIN, f"iteration time {detail}: within ±{pct}"
    return TimeGate(
        outcome=outcome,
        n_base=m,
        n_head=n,
        point_pct=100 * shift.point,
        low_pct=None if shift.low is None else 100 * shift.low,
        high_pct=None if shift.high is None else 100 * shift.high,
        p_value=shift.p_value,
        text=text,
    )


def _grew(base_ms: float, head_ms: float, pct: float, floor_ms: float) -> bool:
    delta = head_ms - base_ms
    return delta > floor_ms and (base_ms <= 0 or 100 * delta / base_ms > pct)


def helper_regressions(
    report: ComparisonReport,
    thresholds: Thresholds,
    host_rows: Sequence[HostTimeRow] | None = None,
) -> list[str]:
    """The aggregate rule on every helper's per-step GPU and host time (module docstring).

    Host time: the helper rows' steady-state host time (``HelperDelta``), or, for a trace
    without GPU activity, ``host_rows``' self host time per step (``pr_bot.deltas``)."""
    found: list[tuple[float, str]] = []

    def check(helper: str, what: str, b: float, h: float, pct: float) -> None:
        floor = thresholds.helper_floor_ms if what == "GPU time" else thresholds.host_floor_ms
        if _grew(b, h, pct, floor):
            growth = f"{100 * (h - b) / b:+.0f}%" if b > 0 else "appeared"
            found.append(
                (h - b, f"{helper} {what} {b:.3f} -> {h:.3f} ms per step ({growth}; the "
                 f"suite allows +{pct:g}%)")
            )  # fmt: skip

    host_pct = thresholds.host_threshold_pct
    for d in report.helpers:
        if d.helper == UNATTRIBUTED:
            continue
        if report.gpu_observed and d.category != Category.COMMUNICATION:
            check(d.helper, "GPU time", d.base_gpu_time_ns / NS_PER_MS,
                  d.head_gpu_time_ns / NS_PER_MS, thresholds.gpu_threshold_pct)  # fmt: skip
        if host_rows is None:
            check(d.helper, "host time", d.base_host_time_ns / NS_PER_MS,
                  d.head_host_time_ns / NS_PER_MS, host_pct)  # fmt: skip
    for row in host_rows or []:
        check(row.helper, "self host time", row.base_ms, row.head_ms, host_pct)
    found.sort(key=lambda f: -f[0])
    reasons = [text for _, text in found[:MAX_HELPER_REASONS]]
    if len(found) > MAX_HELPER_REASONS:
        reasons.append(f"{len(found) - MAX_HELPER_REASONS} more helper time regression(s)")
    return reasons


def _exact_gates(report: ComparisonReport, thresholds: Thresholds) -> list[str]:
    reasons = []
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
    return reasons


def judge(
    report: ComparisonReport,
    thresholds: Thresholds,
    *,
    base_samples: Sequence[float] | None = None,
    host_rows: Sequence[HostTimeRow] | None = None,
) -> Verdict:
    """Apply ``thresholds`` to ``report``.

    ``base_samples``: the base side's iteration times pooled from history (None: the report's
    own base samples). ``host_rows``: the per-helper host-time table of a comparison without
    GPU activity (``pr_bot.deltas.host_rows_for``), whose host time the rule then judges."""
    reasons: list[str] = []
    inconclusive: list[str] = []
    notes: list[str] = []
    refusals = [c.message for c in report.comparability if c.refuses_time_verdict]
    it = report.iterations
    gate: TimeGate | None = None
    if refusals:
        inconclusive += [f"no time verdict: {m}" for m in refusals]
    else:
        if it is not None:
            base = list(base_samples) if base_samples else it.base.samples_ms
            gate = time_gate(base, it.head.samples_ms, thresholds)
            if gate.outcome == TimeOutcome.REGRESSION:
                reasons.append(gate.text)
            elif gate.outcome == TimeOutcome.INCONCLUSIVE:
                inconclusive.append(gate.text)
            else:
                notes.append(gate.text)
        else:
            notes.append(
                "no comparable iteration times in one of the runs: the per-helper aggregate "
                "rules and the exact gates apply"
            )
        reasons += helper_regressions(report, thresholds, host_rows)
    reasons += _exact_gates(report, thresholds)
    state = (
        StatusState.FAILURE
        if reasons
        else StatusState.INCONCLUSIVE
        if inconclusive
        else StatusState.SUCCESS
    )
    return Verdict(
        state=state,
        reasons=reasons,
        method=method_text(thresholds),
        inconclusive=inconclusive,
        notes=notes,
        time=gate,
    )


def combine(states: list[StatusState]) -> StatusState:
    """One status for a suite of several specs (or a spec of several arms): the worst."""
    for worst in SEVERITY:
        if worst in states:
            return worst
    return StatusState.SUCCESS
