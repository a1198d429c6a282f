"""compare_reports on small hand-made reports: deltas, statuses, windows, errors."""

from __future__ import annotations

import pytest

from analyzers.compare import CompareError, compare_reports, default_window
from analyzers.report import (
    AnalysisReport,
    Category,
    HelperStat,
    KernelStat,
    RankSummary,
    RunEnvironment,
)
from analyzers.stats import iteration_stats


def _kernel(group: str, name: str, count: int, total: int, rank: int | None) -> KernelStat:
    return KernelStat(
        rank=rank, window=group, steps=2, name=name, count=count, total_ns=total,
        average_ns=total / count, median_ns=total / count, min_ns=total // count,
        max_ns=total // count, stddev_ns=0.0, time_pct=0.0,
    )  # fmt: skip


def _report(
    group: str,
    helpers: dict[str, int],
    iterations: list[float] | None = None,
    span_ms: float = 10.0,
    gpu_scale: int = 1,
    ranks: tuple[int, ...] = (0, 1),
    kernels: dict[str, tuple[int, int]] | None = None,
    environment: RunEnvironment | None = None,
) -> AnalysisReport:
    stats = [
        HelperStat(
            rank=r,
            window=group,
            steps=2,
            helper=name,
            category=Category.METADATA,
            launches=2 * n,
            activities=2 * n,
            kernels=2 * n,
            gpu_time_ns=2 * n * 1000 * gpu_scale,
            matched_by="range",
            calls=2 * n,
            host_time_ns=2 * n * 10_000,
        )
        for r in ranks
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
        for r in ranks
    ]
    table = [
        _kernel(group, name, count, total, rank)
        for name, (count, total) in (kernels or {}).items()
        for rank in (*ranks, None)
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
        kernels=table,
        environment=environment or RunEnvironment(),
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


def test_time_change_beyond_noise_is_changed_although_launches_are_not() -> None:
    base = _report("ProfilerStep", {"attn": 10, "steady": 10})
    head = base.model_copy(deep=True)
    for s in head.helpers:
        if s.helper == "attn":
            s.gpu_time_ns *= 50  # 10 us -> 500 us per step per rank
        else:
            s.gpu_time_ns += 10  # 10 ns: noise
    by_name = {d.helper: d for d in compare_reports(base, head).helpers}
    assert by_name["attn"].delta_launches == 0 and by_name["attn"].status == "changed"
    assert by_name["steady"].status == "unchanged"


def test_kernel_deltas_total_gpu_and_per_rank_rows() -> None:
    # per rank and all ranks rows; the all-ranks rows (rank None) feed the deltas, per step
    base = _report("s", {"x": 1}, kernels={"gemm": (8, 8_000_000), "old": (2, 20_000)})
    head = _report("s", {"x": 1}, kernels={"gemm": (8, 4_000_000), "new": (4, 40_000)})
    result = compare_reports(base, head)
    by_name = {k.name: k for k in result.kernel_deltas}
    gemm = by_name["gemm"]
    assert (gemm.base_count, gemm.head_count, gemm.delta_count) == (4, 4, 0)
    assert (gemm.base_total_ns, gemm.delta_total_ns) == (4_000_000, -2_000_000)
    assert (gemm.base_mean_ns, gemm.head_mean_ns) == (1_000_000, 500_000)
    assert gemm.status == "changed"
    assert by_name["old"].status == "disappeared" and by_name["new"].status == "appeared"
    assert result.kernel_deltas[0].name == "gemm"  # the largest time change first
    assert result.basis == "per step, summed over ranks"
    # Total GPU: helper x has 2 activities x 1000 ns per rank over 2 steps, 2 ranks
    assert result.total_gpu is not None
    assert (result.total_gpu.base_ns, result.total_gpu.delta_ns) == (2000.0, 0.0)
    # kernel-only time per step summed over the per-rank rows: (8 ms + 20 us) / 2 steps x 2
    assert result.total_gpu.base_kernel_ns == 8_020_000
    assert [r.rank for r in result.ranks] == [0, 1]
    assert result.ranks[0].base_span_ns == 10e6 and result.notes == []


def test_comparability_warnings_go_into_notes() -> None:
    h200 = RunEnvironment(
        gpu_models=["NVIDIA H200"], world_size=2, torch="2.11", transformer_engine="2.20.2"
    )
    a100 = RunEnvironment(
        gpu_models=["NVIDIA A100"], world_size=4, torch="2.9", transformer_engine="2.20.2"
    )
    base = _report("s", {"x": 1}, [1.0] * 8, environment=h200)
    head = _report("s", {"x": 1}, [2.0] * 8, ranks=(0, 1, 2, 3), environment=a100)
    result = compare_reports(base, head)
    text = " | ".join(result.notes)
    assert "different GPU models: base NVIDIA H200; head NVIDIA A100" in text
    assert "different world sizes: base 2, head 4" in text
    assert "different rank sets: base [0, 1], head [0, 1, 2, 3]" in text
    assert "different torch versions" in text and "Transformer Engine" not in text
    assert "comparability warning" in result.summary
    assert result.model_dump(mode="json")["notes"] == result.notes


def test_whole_trace_comparison_says_so() -> None:
    report = _report("whole trace", {"x": 1})
    report.groups = ["whole trace"]
    result = compare_reports(report, report)
    assert result.basis == "whole trace, summed over ranks"
    assert "per step" not in result.summary
