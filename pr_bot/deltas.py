"""The base-vs-head metric table, shared by the comparison page and the PR comment.

One function decides which metrics are shown and what their significance is, so the dashboard
and the pull-request comment never disagree about a number.
"""

from __future__ import annotations

from pydantic import BaseModel

from analyzers.report import ComparisonReport

NS_PER_MS = 1e6


class MetricRow(BaseModel):
    """One row: a metric's base and head values (None when only the delta is known)."""

    metric: str
    unit: str
    base: float | None
    head: float | None
    delta: float
    delta_pct: float | None  # percent of base, None when base is 0 or unknown
    significance: str  # "significant" | "not significant" | "exact" | "descriptive"
    detail: str  # how the significance was judged, e.g. "p=1.2e-09, 95% CI [-2.8, -2.6] ms"


def _pct(delta: float, base: float | None) -> float | None:
    return 100.0 * delta / base if base else None


def metric_rows(report: ComparisonReport) -> list[MetricRow]:
    """Iteration time (with its test), launches and GPU time (exact), span and busy deltas."""
    rows: list[MetricRow] = []
    it = report.iterations
    if it is not None:
        rows.append(
            MetricRow(
                metric="iteration time, median",
                unit="ms",
                base=it.base.median_ms,
                head=it.head.median_ms,
                delta=it.delta_median_ms,
                delta_pct=it.delta_median_pct,
                significance=(
                    "not significant" if it.verdict == "no significant change" else "significant"
                ),
                detail=(
                    f"p={it.p_value:.3g}, {it.confidence:.0%} CI "
                    f"[{it.ci_low_ms:+.2f}, {it.ci_high_ms:+.2f}] ms; n={it.base.n} vs {it.head.n}"
                ),
            )
        )
        rows.append(
            MetricRow(
                metric="iteration time, p90",
                unit="ms",
                base=it.base.p90_ms,
                head=it.head.p90_ms,
                delta=it.head.p90_ms - it.base.p90_ms,
                delta_pct=_pct(it.head.p90_ms - it.base.p90_ms, it.base.p90_ms),
                significance="descriptive",
                detail="tail of the distribution; no test",
            )
        )
    base_launches = sum(d.base_launches for d in report.helpers)
    head_launches = sum(d.head_launches for d in report.helpers)
    rows.append(
        MetricRow(
            metric="launches per step",
            unit="",
            base=base_launches,
            head=head_launches,
            delta=head_launches - base_launches,
            delta_pct=_pct(head_launches - base_launches, base_launches),
            significance="exact",
            detail="launch counts are deterministic",
        )
    )
    base_gpu = sum(d.base_gpu_time_ns for d in report.helpers) / NS_PER_MS
    head_gpu = sum(d.head_gpu_time_ns for d in report.helpers) / NS_PER_MS
    rows.append(
        MetricRow(
            metric="GPU time per step",
            unit="ms",
            base=base_gpu,
            head=head_gpu,
            delta=head_gpu - base_gpu,
            delta_pct=_pct(head_gpu - base_gpu, base_gpu),
            significance="descriptive",
            detail="summed over helpers and ranks, from the profiled steps",
        )
    )
    for metric, delta_ns in (
        ("step span", report.span_delta_ns),
        ("GPU busy per step (clipped to the window)", report.busy_delta_ns),
    ):
        rows.append(
            MetricRow(
                metric=metric,
                unit="ms",
                base=None,
                head=None,
                delta=delta_ns / NS_PER_MS,
                delta_pct=None,
                significance="descriptive",
                detail="mean over ranks",
            )
        )
    return rows
