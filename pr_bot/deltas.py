"""The base-vs-head metric table, shared by the comparison page and the PR comment.

One function decides which metrics are shown and what their significance is, so the dashboard
and the pull-request comment never disagree about a number; their names are in
``pr_bot.labels``. ``host_time_rows`` is the per-helper host-time table of a CPU-only comparison
(no GPU launches or kernels to compare there).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, computed_field

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
    """Iteration time (with its test), launches and GPU time (exact), span and busy deltas.

    Without GPU activity on a side (``report.gpu_observed`` false) launches, GPU time and busy
    are not observed, so their rows are left out rather than shown as zeros."""
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
    if report.gpu_observed:
        rows += _gpu_rows(report)
    delta_only = [("span per step", labels.SPAN_PER_STEP, report.span_delta_ns)]
    if report.gpu_observed:
        delta_only.append(("busy per step", labels.BUSY_PER_STEP, report.busy_delta_ns))
    for metric, label, delta_ns in delta_only:
        delta = delta_ns / NS_PER_MS
        rows.append(_row(metric, label, "ms", None, None, delta=delta, detail="delta only"))
    return rows


def _gpu_rows(report: ComparisonReport) -> list[MetricRow]:
    """Launches (exact) and GPU time of the helpers: rows only a trace with GPU activity has."""
    return [
        _row(
            "launches per step",
            labels.LAUNCHES_PER_STEP,
            "",
            sum(d.base_launches for d in report.helpers),
            sum(d.head_launches for d in report.helpers),
            significance="exact",
            detail=f"{labels.LAUNCHES_BASIS}; launch counts are deterministic",
        ),
        _row(
            "GPU time per step",
            labels.GPU_TIME_PER_STEP,
            "ms",
            sum(d.base_gpu_time_ns for d in report.helpers) / NS_PER_MS,
            sum(d.head_gpu_time_ns for d in report.helpers) / NS_PER_MS,
            detail="from the profiled steps",
        ),
    ]


class HostTimeRow(BaseModel):
    """One helper's host-side calls and time per step, base vs head (summed over ranks).

    From the annotation ranges alone (``analyzers.host_time``), so it exists on a CPU-only
    trace, where no GPU launch or kernel row does. Call counts are exact; host time is a
    measurement (noisy on a shared machine), reported without a test. Inclusive and self time
    per step are of every call, the first included (as ``cptrace analyze`` prints them); each
    rank's first call (compilation, warm-up) is shown apart in ``*_first_call_ms``, so a
    warm-up that lands on one side only can be told from a steady change. (The report has no
    self time of the first call alone, so a steady-state self time cannot be given exactly.)
    """

    helper: str
    base_calls: float
    head_calls: float
    base_ms: float
    """Self host ms per step (all calls), the figure the rows are sorted and judged by."""
    head_ms: float
    status: str  # "appeared" | "disappeared" | "calls changed" | "same calls"
    base_inclusive_ms: float = 0.0
    """Inclusive host ms per step (all calls; nested helpers' time included)."""
    head_inclusive_ms: float = 0.0
    base_first_call_ms: float = 0.0
    """The ranks' first calls of the helper in this group, ms, summed over ranks (not per step;
    0 when every rank's first call fell in another group)."""
    head_first_call_ms: float = 0.0

    @computed_field  # type: ignore[prop-decorator]
    @property
    def delta_calls(self) -> float:
        return self.head_calls - self.base_calls

    @computed_field  # type: ignore[prop-decorator]
    @property
    def delta_ms(self) -> float:
        """Self host ms per step, head - base."""
        return self.head_ms - self.base_ms

    @computed_field  # type: ignore[prop-decorator]
    @property
    def delta_inclusive_ms(self) -> float:
        return self.head_inclusive_ms - self.base_inclusive_ms


@dataclass(slots=True)
class _HostSums:
    """One helper's per-step figures of one side, summed over ranks (see ``HostTimeRow``)."""

    calls: float = 0.0
    self_ms: float = 0.0
    inclusive_ms: float = 0.0
    first_call_ms: float = 0.0


def _host_per_step(report: AnalysisReport, group: str) -> dict[str, _HostSums]:
    """helper -> its figures per step of ``group``, summed over ranks. Self time (nested
    catalogued helpers' ranges left out) puts a growth on the helper that does the work, not
    also on every helper around it."""
    out: dict[str, _HostSums] = {}
    if report.host_time is None:
        return out
    for row in report.host_time.helpers:
        if row.window != group:
            continue
        steps = max(row.steps, 1)  # the whole trace is one window per rank: totals
        sums = out.setdefault(row.helper, _HostSums())
        sums.calls += row.calls / steps
        sums.self_ms += row.self_ns / steps / NS_PER_MS
        sums.inclusive_ms += row.inclusive_ns / steps / NS_PER_MS
        sums.first_call_ms += row.first_call_ns / NS_PER_MS
    return out


def host_time_rows(
    base: AnalysisReport, head: AnalysisReport, base_group: str, head_group: str
) -> list[HostTimeRow]:
    """Every helper with host ranges on either side, largest host-time growth first."""
    b, h = _host_per_step(base, base_group), _host_per_step(head, head_group)
    rows = []
    for helper in sorted(b.keys() | h.keys()):
        bs, hs = b.get(helper, _HostSums()), h.get(helper, _HostSums())
        bc, hc = bs.calls, hs.calls
        status = (
            "appeared" if not bc and hc
            else "disappeared" if bc and not hc
            else "calls changed" if abs(hc - bc) > 1e-9
            else "same calls"
        )  # fmt: skip
        rows.append(
            HostTimeRow(
                helper=helper,
                base_calls=bc,
                head_calls=hc,
                base_ms=bs.self_ms,
                head_ms=hs.self_ms,
                status=status,
                base_inclusive_ms=bs.inclusive_ms,
                head_inclusive_ms=hs.inclusive_ms,
                base_first_call_ms=bs.first_call_ms,
                head_first_call_ms=hs.first_call_ms,
            )
        )
    rows.sort(key=lambda r: r.delta_ms, reverse=True)
    return rows


def sides_without_gpu(base: AnalysisReport, head: AnalysisReport) -> list[str]:
    """``["base"]``, ``["head"]``, both or none: the sides whose trace has no GPU activity
    (the same test as ``ComparisonReport.gpu_observed``), for the line that says why the GPU
    tables are empty."""
    return [
        side
        for side, r in (("base", base), ("head", head))
        if r.host_time is not None and not r.host_time.gpu_activity
    ]


def host_only(base: AnalysisReport, head: AnalysisReport) -> bool:
    """Whether a side has no GPU activity: its host times are the only per-helper figures."""
    return bool(sides_without_gpu(base, head))


def host_rows_for(
    base: AnalysisReport | None, head: AnalysisReport | None, comparison: ComparisonReport
) -> list[HostTimeRow] | None:
    """The host-time table of ``comparison`` when a side has no GPU activity (None: the
    launch table applies, or a report is missing). What the comment's ``host_rows`` take."""
    if base is None or head is None or not host_only(base, head):
        return None
    return host_time_rows(base, head, comparison.base_label, comparison.head_label)
