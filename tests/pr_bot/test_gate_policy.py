"""The gate's rules on real iteration samples (the ABBA-timed iterations of H200 demo bundles and
of the CPU gloo bundle) and on a real CPU comparison without iteration times.

Pinned (issue 23): 4x slower with the default thresholds fails; identical code passes; +10% at
n=50 fails; n=3 vs 3 at 4x is inconclusive and says the n needed; a helper whose host time
grows 150% fails with no iteration times at all; a comparison that refuses a time verdict is
inconclusive with the reason; inconclusive is never green on GitHub.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from testkit import DATA_DIR

from analyzers import analyze, compare_reports
from analyzers.bundle import read_bundle
from analyzers.report import AnalysisReport, ComparabilityAspect, ComparabilityIssue
from pr_bot.deltas import host_rows_for
from pr_bot.policy import SEVERITY, StatusState, Thresholds, TimeOutcome, combine, judge, time_gate
from pr_bot.suite_comment import github_state
from service.github_loop.commit_state import CHECK_CONCLUSION

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "demo" / "bundles" / "bundled-fixed-vs-broken-h200x2.tar.gz"
CPU = DATA_DIR / "cpu-gloo" / "cpu_smoke.tar.gz"


@pytest.fixture(scope="module")
def fixed_ms() -> list[float]:
    """The bundled fixed arm's 50 timed iterations on 2x H200 (a step ends with its slowest
    rank: the all-ranks sample is the per-iteration maximum, as the analysis takes it)."""
    with read_bundle(H200) as bundle:
        (arm,) = [v for v in bundle.manifest.variants if v.name == "fixed"]
    per_rank = np.array([arm.iteration_ms[r] for r in sorted(arm.iteration_ms)])
    return [float(x) for x in per_rank.max(axis=0)]


def test_four_times_slower_fails_at_the_default_step_count(fixed_ms: list[float]) -> None:
    """n=20 per side (a command entry's default step count after warm-up): distinct iterations
    of the same code, the head's four times as long."""
    base, head = fixed_ms[:20], [4 * x for x in fixed_ms[20:40]]
    gate = time_gate(base, head, Thresholds())
    assert gate.outcome == TimeOutcome.REGRESSION
    assert gate.low_pct is not None and gate.low_pct > 250
    assert gate.text.startswith("iteration time +") and "n=20 vs 20" in gate.text


def test_identical_code_passes(fixed_ms: list[float]) -> None:
    """The arm's first 25 iterations against its last 25: the same code, interleaved with the
    other arms (ABBA), so no drift between them."""
    gate = time_gate(fixed_ms[:25], fixed_ms[25:], Thresholds())
    assert gate.outcome == TimeOutcome.WITHIN, gate.text
    assert gate.low_pct is not None and gate.low_pct < 0 < (gate.high_pct or 0)


def test_ten_percent_at_n50_fails(fixed_ms: list[float]) -> None:
    rng = np.random.default_rng(23)
    base = rng.choice(fixed_ms, 50).tolist()
    head = (1.10 * rng.choice(fixed_ms, 50)).tolist()
    gate = time_gate(base, head, Thresholds())
    assert gate.outcome == TimeOutcome.REGRESSION, gate.text


def test_three_vs_three_at_four_times_is_inconclusive_with_the_n_needed(
    fixed_ms: list[float],
) -> None:
    gate = time_gate(fixed_ms[:3], [4 * x for x in fixed_ms[3:6]], Thresholds())
    assert gate.outcome == TimeOutcome.INCONCLUSIVE and gate.low_pct is None
    assert gate.point_pct > 250
    assert "3 vs 3 samples can never reach p < 0.05 (smallest possible p 0.1;" in gate.text
    assert gate.text.startswith("iteration time +")
    assert "(n=3 vs 3): needs n >= 4 per side, or 5 head samples against these 3;" in gate.text
    # Pooled from the base branch's history (5 runs of 3), the same 3 head samples decide.
    pooled = time_gate(fixed_ms[:15], [4 * x for x in fixed_ms[15:18]], Thresholds())
    assert pooled.outcome == TimeOutcome.REGRESSION, pooled.text


def test_an_estimate_beyond_the_threshold_that_the_ci_cannot_confirm_is_inconclusive(
    fixed_ms: list[float],
) -> None:
    gate = time_gate(fixed_ms[:5], [1.08 * x for x in fixed_ms[5:10]], Thresholds())
    assert gate.outcome == TimeOutcome.INCONCLUSIVE, gate.text
    assert gate.point_pct > 5 and gate.low_pct is not None and gate.low_pct < 5
    assert "the estimate crosses ±5%, the CI does not" in gate.text
    faster = time_gate(fixed_ms[:25], [0.5 * x for x in fixed_ms[25:]], Thresholds())
    assert faster.outcome == TimeOutcome.IMPROVEMENT


@pytest.fixture(scope="module")
def cpu_report() -> AnalysisReport:
    with read_bundle(CPU) as bundle:
        return analyze(bundle.analysis_paths(), manifest=bundle.manifest)


def _without_iterations(report: AnalysisReport, grow: str | None = None) -> AnalysisReport:
    """A copy with no iteration times; ``grow``: that helper's host time x2.5 (+150%)."""
    copy = report.model_copy(deep=True)
    copy.iterations = []
    assert copy.host_time is not None
    for row in copy.host_time.helpers:
        if row.helper == grow:
            row.self_ns, row.inclusive_ns = int(row.self_ns * 2.5), int(row.inclusive_ns * 2.5)
    return copy


def test_a_helper_whose_host_time_grows_150_percent_fails_without_iteration_times(
    cpu_report: AnalysisReport,
) -> None:
    arm = "arm:fixed"
    base = _without_iterations(cpu_report)
    assert base.host_time is not None
    rows = [r for r in base.host_time.helpers if r.window == arm and r.self_ns > 5_000_000]
    helper = max(rows, key=lambda r: r.self_ns).helper
    head = _without_iterations(cpu_report, grow=helper)
    same = compare_reports(base, base, base_window=arm, head_window=arm)
    grown = compare_reports(base, head, base_window=arm, head_window=arm)
    assert grown.iterations is None and not grown.gpu_observed
    passed = judge(same, Thresholds(), host_rows=host_rows_for(base, base, same))
    assert passed.state == StatusState.SUCCESS and passed.time is None
    assert "no comparable iteration times" in passed.notes[0]
    failed = judge(grown, Thresholds(), host_rows=host_rows_for(base, head, grown))
    assert failed.state == StatusState.FAILURE
    (reason,) = failed.reasons
    assert reason.startswith(f"{helper} self host time ")
    assert "(+150%; the suite allows +100%)" in reason


def test_a_refused_comparison_is_inconclusive_with_the_reason(cpu_report: AnalysisReport) -> None:
    report = compare_reports(cpu_report, cpu_report, base_window="arm:fixed",
                             head_window="arm:broken")  # fmt: skip
    message = "different workloads: base seqlens [16, 8, 8], head [32]"
    report.comparability = [
        ComparabilityIssue(aspect=ComparabilityAspect.WORKLOAD, base="a", head="b",
                           message=message, refuses_time_verdict=True)
    ]  # fmt: skip
    verdict = judge(report, Thresholds())
    assert verdict.state == StatusState.INCONCLUSIVE and verdict.reasons == []
    assert verdict.inconclusive == [f"no time verdict: {message}"] and verdict.time is None
    # The exact gates still apply: the broken arm's findings are new.
    exact = judge(report, Thresholds(fail_on_new_findings="info"))
    assert exact.state == StatusState.FAILURE and "new finding(s)" in exact.reasons[0]


def test_inconclusive_is_never_green_and_ranks_between_failure_and_no_baseline() -> None:
    assert github_state(StatusState.INCONCLUSIVE) == "pending"
    assert CHECK_CONCLUSION[StatusState.INCONCLUSIVE] == "neutral"
    assert github_state(StatusState.NEUTRAL) == "success"  # no baseline: nothing judged
    assert set(SEVERITY) == set(StatusState)
    assert combine([StatusState.SUCCESS, StatusState.INCONCLUSIVE]) == StatusState.INCONCLUSIVE
    assert combine([StatusState.NEUTRAL, StatusState.INCONCLUSIVE]) == StatusState.INCONCLUSIVE
    assert combine([StatusState.FAILURE, StatusState.INCONCLUSIVE]) == StatusState.FAILURE


def test_the_old_threshold_name_still_reads() -> None:
    assert Thresholds.model_validate({"min_effect_pct": 7}).threshold_pct == 7
    assert Thresholds().threshold_pct == 5 and Thresholds().baseline_runs == 5


def test_the_one_shot_pr_comment_posts_the_gate_not_the_rank_test(
    cpu_report: AnalysisReport,
) -> None:
    """``cptrace pr-comment --status`` (``pr_bot.publish``) posts the gate's state: 3 vs 3 real
    CPU iterations, the head four times slower, is pending (inconclusive), never success (the
    rank test's "no significant change" alone was posted as success)."""
    from fake_github import FakeGitHubServer

    from analyzers.stats import iteration_stats
    from pr_bot.comment import CommentContext
    from pr_bot.github import GitHubConfig
    from pr_bot.publish import publish

    arm = "arm:fixed"
    head = cpu_report.model_copy(deep=True)
    head.iterations = [
        iteration_stats(it.label, [4 * x for x in it.samples_ms][:3], rank=it.rank,
                        source=it.source) if it.label == arm else it
        for it in cpu_report.iterations
    ]  # fmt: skip
    base = cpu_report.model_copy(deep=True)
    base.iterations = [
        iteration_stats(it.label, it.samples_ms[:3], rank=it.rank, source=it.source)
        if it.label == arm else it
        for it in cpu_report.iterations
    ]  # fmt: skip
    report = compare_reports(base, head, base_window=arm, head_window=arm)
    assert report.iterations is not None and report.iterations.head.n == 3
    assert report.iterations.verdict == "no significant change"  # what was posted as success
    context = CommentContext(suite="smoke", base_name="#1", head_name="#2")
    with FakeGitHubServer() as github:
        config = GitHubConfig(token=github.token, api_url=github.url, login="cptrace-bot")
        posted = publish(report, context, repo="octo/model", pr=3, config=config,
                         head_sha="c" * 40)  # fmt: skip
    assert posted.status_state == "pending"


def test_every_threshold_is_documented_with_its_default() -> None:
    doc = (ROOT / "docs" / "github.md").read_text(encoding="utf-8")
    for name, field in Thresholds.model_fields.items():
        default = "" if field.default is None else f"{field.default:g}"
        assert f"      {name}: " in doc, f"thresholds.{name} is not in docs/github.md"
        line = next(x for x in doc.splitlines() if x.startswith(f"      {name}: "))
        assert default == "" or f"{name}: {default} " in line, line
