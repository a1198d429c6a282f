"""Compare two analysis reports (two runs, or two window groups of one run).

Why per step: two windows rarely hold the same number of steps; per-step numbers (summed over
ranks) make them comparable. Kernel counts are deterministic, so launch deltas are exact and
need no statistics; times go through :func:`analyzers.stats.compare_samples`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from analyzers.account.compare import account_deltas
from analyzers.report import (
    AnalysisReport,
    Category,
    ComparisonReport,
    HelperDelta,
    HelperStat,
    IterationComparison,
    IterationStats,
    RankSummary,
)
from analyzers.stats import compare_samples
from analyzers.windows import WHOLE_TRACE

MIN_SAMPLES = 5
"""Below this many iterations per side, Mann-Whitney cannot reach p < 0.05: say so."""
TOO_FEW = ": too few iterations for a significant difference"


class CompareError(ValueError):
    """A requested window group is not in a report."""


def default_window(report: AnalysisReport) -> str:
    """The single step/variant group of a report, else "whole trace"."""
    groups = [g for g in _groups(report) if g != WHOLE_TRACE]
    return groups[0] if len(groups) == 1 else WHOLE_TRACE


def _groups(report: AnalysisReport) -> list[str]:
    return report.groups or sorted({s.window for s in report.rank_summaries})


def _check(report: AnalysisReport, window: str, side: str) -> None:
    groups = _groups(report)
    if window not in groups:
        raise CompareError(
            f"{side} window {window!r} not in the report; available: {', '.join(groups)}"
        )


@dataclass(slots=True)
class _Side:
    """One helper's per-step totals (summed over ranks) on one side of a comparison."""

    launches: float = 0.0
    gpu_ns: float = 0.0
    host_ns: float = 0.0
    category: Category = Category.OTHER


def _per_step(stats: Sequence[HelperStat]) -> dict[str, _Side]:
    out: dict[str, _Side] = {}
    for s in stats:
        side = out.setdefault(s.helper, _Side(category=s.category))
        steps = max(s.steps, 1)
        side.launches += s.launches / steps
        side.gpu_ns += s.gpu_time_ns / steps
        side.host_ns += s.host_time_ns / steps
    return out


def helper_deltas(
    base: AnalysisReport, head: AnalysisReport, base_window: str, head_window: str
) -> list[HelperDelta]:
    """Per-helper launches, GPU and host time per step (summed over ranks), head minus base."""
    b = _per_step([s for s in base.helpers if s.window == base_window])
    h = _per_step([s for s in head.helpers if s.window == head_window])
    out = []
    for name in sorted(set(b) | set(h)):
        bs, hs = b.get(name, _Side()), h.get(name, _Side())
        if name not in b:
            status = "appeared"
        elif name not in h:
            status = "disappeared"
        else:
            status = "changed" if abs(hs.launches - bs.launches) > 1e-9 else "unchanged"
        out.append(
            HelperDelta(
                helper=name,
                category=(b.get(name) or hs).category,
                base_launches=bs.launches,
                head_launches=hs.launches,
                delta_launches=hs.launches - bs.launches,
                base_gpu_time_ns=bs.gpu_ns,
                head_gpu_time_ns=hs.gpu_ns,
                delta_gpu_time_ns=hs.gpu_ns - bs.gpu_ns,
                status=status,
                base_host_time_ns=bs.host_ns,
                head_host_time_ns=hs.host_ns,
                delta_host_time_ns=hs.host_ns - bs.host_ns,
            )
        )
    return sorted(
        out,
        key=lambda d: (
            -abs(d.delta_launches),
            -abs(d.delta_host_time_ns),
            -abs(d.delta_gpu_time_ns),
            d.helper,
        ),
    )


def _rank_mean(rows: Sequence[RankSummary], attr: str) -> float:
    return sum(getattr(r, attr) / max(r.steps, 1) for r in rows) / len(rows) if rows else 0.0


def _iterations(report: AnalysisReport, window: str) -> IterationStats | None:
    for it in report.iterations:
        if it.label == window and it.rank is None:
            return it
    return None


def _summary(
    deltas: Sequence[HelperDelta], iterations: IterationComparison | None, labels: tuple[str, str]
) -> str:
    """One line: the iteration verdict, then the helpers behind the launch difference."""
    total = sum(d.delta_launches for d in deltas)
    base_total = sum(d.base_launches for d in deltas)
    movers = [d for d in deltas if abs(d.delta_launches) >= 0.5][:4]
    parts = []
    if iterations is not None:
        parts.append(
            f"{labels[1]} vs {labels[0]}: {iterations.verdict} (median "
            f"{iterations.base.median_ms:.2f} -> {iterations.head.median_ms:.2f} ms, "
            f"{iterations.delta_median_pct:+.1f}%, p={iterations.p_value:.3g}, "
            f"n={iterations.base.n} vs {iterations.head.n}"
            f"{TOO_FEW if min(iterations.base.n, iterations.head.n) < MIN_SAMPLES else ''})"
        )
    else:
        parts.append(f"{labels[1]} vs {labels[0]}")
    if movers:
        pct = f" ({100 * total / base_total:+.1f}%)" if base_total else ""
        named = ", ".join(
            (
                f"{d.helper} {d.delta_launches:+g} ({d.status}, host "
                f"{d.delta_host_time_ns / 1e6:+.2f} ms)"
            )
            for d in movers
        )
        parts.append(f"{total:+g} launches per step{pct}, from {named}")
    else:
        parts.append("same launches per step for every helper")
    return "; ".join(parts)


def compare_reports(
    base: AnalysisReport,
    head: AnalysisReport,
    *,
    base_window: str | None = None,
    head_window: str | None = None,
) -> ComparisonReport:
    """Base vs head: helper deltas, span/busy deltas, iteration statistics and findings.

    :raises CompareError: when a named window group is not in its report.
    """
    base_window = base_window or default_window(base)
    head_window = head_window or default_window(head)
    _check(base, base_window, "base")
    _check(head, head_window, "head")
    deltas = helper_deltas(base, head, base_window, head_window)
    b_rows = [r for r in base.rank_summaries if r.window == base_window]
    h_rows = [r for r in head.rank_summaries if r.window == head_window]
    b_it, h_it = _iterations(base, base_window), _iterations(head, head_window)
    # Timed (CUDA events, no profiler) and profiled (window durations under the profiler)
    # iterations are not comparable: the profiler inflates the latter several-fold.
    mixed = bool(b_it and h_it and b_it.source and h_it.source and b_it.source != h_it.source)
    iterations = (
        compare_samples(b_it, h_it) if b_it and h_it and b_it.n and h_it.n and not mixed else None
    )
    labels = (base_window, head_window)
    summary = _summary(deltas, iterations, labels)
    if mixed and b_it and h_it:
        summary += (
            f"; iterations not compared: {base_window} is {b_it.source}, {head_window} is "
            f"{h_it.source}"
        )
    launch_delta = sum(d.delta_launches for d in deltas)
    verdict = (
        iterations.verdict
        if iterations
        else (
            "fewer launches"
            if launch_delta < 0
            else "more launches"
            if launch_delta > 0
            else "no change"
        )
    )
    return ComparisonReport(
        base_label=base_window,
        head_label=head_window,
        helpers=deltas,
        span_delta_ns=_rank_mean(h_rows, "span_ns") - _rank_mean(b_rows, "span_ns"),
        busy_delta_ns=_rank_mean(h_rows, "gpu_busy_ns") - _rank_mean(b_rows, "gpu_busy_ns"),
        iterations=iterations,
        findings_base=[f for f in base.findings if f.window in (None, base_window)],
        findings_head=[f for f in head.findings if f.window in (None, head_window)],
        summary=summary,
        verdict=verdict,
        account=account_deltas(base, head, base_window, head_window),
    )


__all__ = ["CompareError", "compare_reports", "default_window", "helper_deltas"]
