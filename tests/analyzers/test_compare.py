"""compare_reports on small hand-made reports: deltas, statuses, windows, errors."""

from __future__ import annotations

import pytest

from analyzers.compare import CompareError, compare_reports, default_window
from analyzers.report import AnalysisReport, Category, HelperStat, RankSummary
from analyzers.stats import iteration_stats


def _report(
    group: str,
    helpers: dict[str, int],
    iterations: list[float] | None = None,
    span_ms: float = 10.0,
) -> AnalysisReport:
    stats = [
        HelperStat(
            rank=r,
            window=group,
            steps=2,
            helper=name,
            category=Category.METADATA,
            launches=2 * n,
            kernels=2 * n,
            gpu_time_ns=2 * n * 1000,
            matched_by="range",
            calls=2 * n,
            host_time_ns=2 * n * 10_000,
        )
        for r in (0, 1)
        for name, n in helpers.items()
    ]
    summaries = [
        RankSummary(
            rank=r,
            window=group,
            steps=2,
            span_ns=int(2 * span_ms * 1e6),
            gpu_busy_ns=int(2e6),
            kernels=0,
            launches=0,
            attributed_fraction=1.0,
        )
        for r in (0, 1)
    ]
    its = [iteration_stats(group, iterations)] if iterations else []
    return AnalysisReport(
        catalog_version="t",
        sources=[],
        ranks=[0, 1],
        windows=[],
        helpers=stats,
        streams=[],
        rank_summaries=summaries,
        imbalance=[],
        iterations=its,
        findings=[],
        groups=[group, "whole trace"],
    )


def test_deltas_statuses_and_summary() -> None:
    base = _report(
        "ProfilerStep",
        {"get_cu_seqlens_on_cp_rank": 16, "attn": 10, "gone": 1},
        [21.3, 21.2, 21.4, 21.3, 21.1, 21.5, 21.2, 21.3],
    )
    head = _report(
        "ProfilerStep",
        {"attn": 10, "new": 3},
        [18.6, 18.5, 18.7, 18.6, 18.4, 18.8, 18.5, 18.6],
        span_ms=8.0,
    )
    result = compare_reports(base, head)
    by_name = {d.helper: d for d in result.helpers}
    assert by_name["get_cu_seqlens_on_cp_rank"].status == "disappeared"
    assert by_name["get_cu_seqlens_on_cp_rank"].delta_launches == -32  # 16 per rank x 2 ranks
    assert by_name["new"].status == "appeared" and by_name["new"].head_launches == 6
    assert by_name["attn"].status == "unchanged"
    assert result.helpers[0].helper == "get_cu_seqlens_on_cp_rank"
    assert result.span_delta_ns == pytest.approx(-2e6)
    assert result.verdict == "faster" and result.iterations is not None
    assert "get_cu_seqlens_on_cp_rank -32" in result.summary and "faster" in result.summary
    assert "-28 launches per step" in result.summary


def test_same_report_two_windows_and_defaults() -> None:
    report = _report("arm:a", {"x": 1})
    assert default_window(report) == "arm:a"
    unchanged = compare_reports(report, report)
    assert unchanged.verdict == "no change" and "same launches" in unchanged.summary
    with pytest.raises(CompareError, match="'arm:zz' not in the report; available: arm:a"):
        compare_reports(report, report, head_window="arm:zz")
