"""The base-vs-head metric table, shared by the comparison page and the PR comment.

One function decides which metrics are shown and what their significance is, so the dashboard
and the pull-request comment never disagree about a number; their names are in
``pr_bot.labels``. ``host_time_rows`` is the per-helper host-time table of a CPU-only comparison
(no GPU launches or kernels to compare there).
"""

from __future__ import annotations

from pydantic import BaseModel

from analyzers.report import AnalysisReport, ComparisonReport
from pr_bot import labels

NS_PER_MS = 1e6


class MetricRow(BaseModel):
    """One row: a metric's base and head values (None when only the delta is known)."""

    metric: str
    """Stable short name (``launches per step``), the row's key on pages and in tests."""
    label: str
    """What a reader sees: the name with its unit and basis (``pr_bot.labels``)."""
    unit: str
    base: float | None
    head: float | None
    delta: float
    delta_pct: float | None  # percent of base, None when base is 0 or unknown
    significance: str  # "significant" | "not significant" | "exact" | "descriptive"
    detail: str  # how the significance was judged, e.g. "p=1.2e-09, 95% CI [-2.8, -2.6] ms"


def _pct(delta: float, base: float | None) -> float | None:
    return 100.0 * delta / base if base else None


def _row(
    metric: str,
    label: str,
    unit: str,
    base: float | None,
    head: float | None,
    *,
    significance: str = "descriptive",
    detail: str,
    delta: float | None = None,
) -> MetricRow:
    """One row; the delta is head - base unless only the delta is known."""
    if delta is None:
        delta = (head or 0.0) - (base or 0.0)
    return MetricRow(
        metric=metric,
        label=label,
        unit=unit,
        base=base,
        head=head,
        delta=delta,
        delta_pct=_pct(delta, base),
        significance=significance,
        detail=detail,
    )


def metric_rows(report: ComparisonReport) -> list[MetricRow]:
    """Iteration time (with its test), launches and GPU time (exact), span and busy deltas."""
    rows: list[MetricRow] = []
    it = report.iterations
    if it is not None:
        significant = it.verdict != "no significant change"
        rows.append(
            _row(
                "iteration time, median",
                labels.ITERATION_MEDIAN,
                "ms",
                it.base.median_ms,
                it.head.median_ms,
                delta=it.delta_median_ms,
                significance="significant" if significant else "not significant",
                detail=(
                    f"p={it.p_value:.3g}, {it.confidence:.0%} CI "
                    f"[{it.ci_low_ms:+.2f}, {it.ci_high_ms:+.2f}] ms; n={it.base.n} vs {it.head.n}"
                ),
            )
        )
        rows.append(
            _row(
                "iteration time, p90",
                labels.ITERATION_P90,
                "ms",
                it.base.p90_ms,
                it.head.p90_ms,
                detail="tail of the distribution; no test",
            )
        )
    rows.append(
        _row(
            "launches per step",
            labels.LAUNCHES_PER_STEP,
            "",
            sum(d.base_launches for d in report.helpers),
            sum(d.head_launches for d in report.helpers),
            significance="exact",
            detail=f"{labels.LAUNCHES_BASIS}; launch counts are deterministic",
        )
    )
    rows.append(
        _row(
            "GPU time per step",
            labels.GPU_TIME_PER_STEP,
            "ms",
            sum(d.base_gpu_time_ns for d in report.helpers) / NS_PER_MS,
            sum(d.head_gpu_time_ns for d in report.helpers) / NS_PER_MS,
            detail="from the profiled steps",
        )
    )
    for metric, label, delta_ns in (
        ("span per step", labels.SPAN_PER_STEP, report.span_delta_ns),
        ("busy per step", labels.BUSY_PER_STEP, report.busy_delta_ns),
    ):
        delta = delta_ns / NS_PER_MS
        rows.append(_row(metric, label, "ms", None, None, delta=delta, detail="delta only"))
    return rows


class HostTimeRow(BaseModel):
    """One helper's host-side calls and time per step, base vs head (summed over ranks).

    From the annotation ranges alone (``analyzers.host_time``), so it exists on a CPU-only
    trace, where no GPU launch or kernel row does. Call counts are exact; host time is a
    measurement (noisy on a shared machine), reported without a test.
    """

    helper: str
    base_calls: float
    head_calls: float
    base_ms: float
    head_ms: float
    status: str  # "appeared" | "disappeared" | "calls changed" | "same calls"

    @property
    def delta_calls(self) -> float:
        return self.head_calls - self.base_calls

    @property
    def delta_ms(self) -> float:
        return self.head_ms - self.base_ms


def _host_per_step(report: AnalysisReport, group: str) -> dict[str, tuple[float, float]]:
    """helper -> (calls, self host ms) per step of ``group``, summed over ranks. Self time
    (nested catalogued helpers' ranges left out) puts a growth on the helper that does the
    work, not also on every helper around it."""
    out: dict[str, tuple[float, float]] = {}
    if report.host_time is None:
        return out
    for row in report.host_time.helpers:
        if row.window != group:
            continue
        steps = max(row.steps, 1)
        calls, ms = out.get(row.helper, (0.0, 0.0))
        out[row.helper] = (calls + row.calls / steps, ms + row.self_ns / steps / NS_PER_MS)
    return out


def host_time_rows(
    base: AnalysisReport, head: AnalysisReport, base_group: str, head_group: str
) -> list[HostTimeRow]:
    """Every helper with host ranges on either side, largest host-time growth first."""
    b, h = _host_per_step(base, base_group), _host_per_step(head, head_group)
    rows = []
    for helper in sorted(b.keys() | h.keys()):
        (bc, bms), (hc, hms) = b.get(helper, (0.0, 0.0)), h.get(helper, (0.0, 0.0))
        status = (
            "appeared" if not bc and hc
            else "disappeared" if bc and not hc
            else "calls changed" if abs(hc - bc) > 1e-9
            else "same calls"
        )  # fmt: skip
        rows.append(HostTimeRow(helper=helper, base_calls=bc, head_calls=hc, base_ms=bms,
                                head_ms=hms, status=status))  # fmt: skip
    rows.sort(key=lambda r: r.delta_ms, reverse=True)
    return rows


def host_only(base: AnalysisReport, head: AnalysisReport) -> bool:
    """Whether a side has no GPU activity: its host times are the only per-helper figures."""
    return any(r.host_time is not None and not r.host_time.gpu_activity for r in (base, head))


def host_rows_for(
    base: AnalysisReport | None, head: AnalysisReport | None, comparison: ComparisonReport
) -> list[HostTimeRow] | None:
    """The host-time table of ``comparison`` when a side has no GPU activity (None: the
    launch table applies, or a report is missing). What the comment's ``host_rows`` take."""
    if base is None or head is None or not host_only(base, head):
        return None
    return host_time_rows(base, head, comparison.base_label, comparison.head_label)
