"""Compare two analysis reports (two runs, or two window groups of one run).

Why per step: two windows rarely hold the same number of steps; per-step numbers (summed over
ranks) make them comparable. Kernel counts are deterministic, so launch and kernel-count deltas
are exact and need no statistics; iteration times go through
:func:`analyzers.stats.compare_samples`. A GPU or host time is "changed" when it moves by more
than ``TIME_NOISE_FRACTION`` (host time: ``HOST_NOISE_FRACTION``) of the base and
``TIME_NOISE_NS`` per step (kernel durations of one binary on one GPU repeat within a few
percent; host time under a profiler far less).

Whole-trace windows are not steps: their numbers are totals and ``basis`` says so. Before
anything is compared, ``analyzers.comparability`` checks what the two sides ran and how they
were captured: each difference is a typed issue in ``comparability`` and a line of ``notes``;
one that refuses a time verdict (another workload, implementation, world size or GPU model)
turns the iteration verdict into "inconclusive" and the summary says why. Kernels are matched
by ``analyzers.kernel_names.kernel_key`` (nsys and Kineto spell them differently).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from analyzers.account.compare import account_deltas
from analyzers.comparability import comparability, refusal
from analyzers.kernel_names import kernel_key
from analyzers.report import (
    AnalysisReport,
    Category,
    ComparisonReport,
    GpuTotal,
    HelperDelta,
    HelperStat,
    IterationComparison,
    IterationStats,
    KernelDelta,
    RankDelta,
    RankSummary,
)
from analyzers.stats import compare_samples
from analyzers.windows import WHOLE_TRACE

TIME_NOISE_FRACTION = 0.05
"""A GPU time change smaller than this share of the base value is noise."""
HOST_NOISE_FRACTION = 0.25
"""The same for host time: measured under the profiler, it varies far more between steps."""
TIME_NOISE_NS = 10_000
"""... and so is one smaller than this many ns per step (timer and launch jitter)."""
MIN_SAMPLES = 5
"""Below this many iterations per side, Mann-Whitney cannot reach p < 0.05: say so."""
TOO_FEW = ": too few iterations for a significant difference"
INCONCLUSIVE = "inconclusive"
"""The verdict when the iteration times exist but a comparability issue refuses a time verdict
(``analyzers.comparability``: another workload, implementation, world size or GPU model)."""


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
    activities: float = 0.0
    gpu_ns: float = 0.0
    host_ns: float = 0.0
    category: Category = Category.OTHER


def _per_step(stats: Sequence[HelperStat]) -> dict[str, _Side]:
    out: dict[str, _Side] = {}
    for s in stats:
        side = out.setdefault(s.helper, _Side(category=s.category))
        steps = max(s.steps, 1)
        side.launches += s.launches / steps
        side.activities += s.activities / steps
        side.gpu_ns += s.gpu_time_ns / steps
        # steady state: the first call (a compiled helper compiles on it) is left out
        side.host_ns += (s.host_time_ns - s.first_call_host_ns) / steps
    return out


@dataclass(slots=True)
class _KernelSide:
    """One kernel key's figures on one side of a comparison, summed over ranks."""

    name: str  # as the trace spells it (the first of the names sharing the key)
    per_step_count: float = 0.0
    per_step_ns: float = 0.0
    count: int = 0
    total_ns: int = 0


def time_changed(base_ns: float, head_ns: float, fraction: float = TIME_NOISE_FRACTION) -> bool:
    """Whether a per-step time moved beyond the noise (see the module docstring)."""
    delta = abs(head_ns - base_ns)
    return delta > TIME_NOISE_NS and delta > fraction * abs(base_ns)


def _kernel_side(report: AnalysisReport, window: str) -> dict[str, _KernelSide]:
    """kernel key (``analyzers.kernel_names.kernel_key``) -> per-step and total figures summed
    over ranks, with the first name seen for display."""
    out: dict[str, _KernelSide] = {}
    for k in report.kernels:
        if k.window == window and k.rank is None:
            side = out.setdefault(kernel_key(k.name), _KernelSide(k.name))
            steps = max(k.steps, 1)
            side.per_step_count += k.count / steps
            side.per_step_ns += k.total_ns / steps
            side.count += k.count
            side.total_ns += k.total_ns
    return out


def kernel_deltas(
    base: AnalysisReport, head: AnalysisReport, base_window: str, head_window: str
) -> list[KernelDelta]:
    """Per kernel: count and total time per step (summed over ranks) and mean duration, head
    minus base; largest total-time change first. Kernels are matched by
    :func:`~analyzers.kernel_names.kernel_key`, so nsys and Kineto spellings of one kernel are
    one row (named as the base spells it)."""
    b, h = _kernel_side(base, base_window), _kernel_side(head, head_window)
    out = []
    for key in set(b) | set(h):
        bs, hs = b.get(key), h.get(key)
        name = (bs or hs or _KernelSide(key)).name
        bs, hs = bs or _KernelSide(name), hs or _KernelSide(name)
        bc, bt, bn, btot = bs.per_step_count, bs.per_step_ns, bs.count, bs.total_ns
        hc, ht, hn, htot = hs.per_step_count, hs.per_step_ns, hs.count, hs.total_ns
        b_mean, h_mean = (btot / bn if bn else 0.0), (htot / hn if hn else 0.0)
        if key not in b:
            status = "appeared"
        elif key not in h:
            status = "disappeared"
        else:
            moved = abs(hc - bc) > 1e-9 or time_changed(bt, ht)
            status = "changed" if moved else "unchanged"
        out.append(
            KernelDelta(
                name=name,
                base_count=bc,
                head_count=hc,
                delta_count=hc - bc,
                base_total_ns=bt,
                head_total_ns=ht,
                delta_total_ns=ht - bt,
                base_mean_ns=b_mean,
                head_mean_ns=h_mean,
                delta_mean_ns=h_mean - b_mean,
                status=status,
            )
        )
    return sorted(out, key=lambda d: (-abs(d.delta_total_ns), -abs(d.delta_count), d.name))


def _gpu_per_rank(report: AnalysisReport, window: str, attr: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for s in report.helpers:
        if s.window == window:
            out[s.rank] = out.get(s.rank, 0.0) + getattr(s, attr) / max(s.steps, 1)
    return out


def _kernel_time_per_rank(report: AnalysisReport, window: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for k in report.kernels:
        if k.window == window and k.rank is not None:
            out[k.rank] = out.get(k.rank, 0.0) + k.total_ns / max(k.steps, 1)
    return out


def total_gpu(
    base: AnalysisReport, head: AnalysisReport, base_window: str, head_window: str
) -> GpuTotal:
    """Total GPU time and kernel-only time per step, summed over ranks, both sides.

    Every activity of a window group belongs to exactly one helper row (unattributed included),
    so the helper rows sum to the group's total GPU time.
    """
    b = sum(_gpu_per_rank(base, base_window, "gpu_time_ns").values())
    h = sum(_gpu_per_rank(head, head_window, "gpu_time_ns").values())
    bk = sum(_kernel_time_per_rank(base, base_window).values())
    hk = sum(_kernel_time_per_rank(head, head_window).values())
    return GpuTotal(
        base_ns=b,
        head_ns=h,
        delta_ns=h - b,
        base_kernel_ns=bk,
        head_kernel_ns=hk,
        delta_kernel_ns=hk - bk,
    )


def rank_deltas(
    base: AnalysisReport, head: AnalysisReport, base_window: str, head_window: str
) -> list[RankDelta]:
    """Per rank: span, clipped busy and total GPU time per step on each side."""

    def rows(report: AnalysisReport, window: str) -> dict[int, RankSummary]:
        return {r.rank: r for r in report.rank_summaries if r.window == window}

    b, h = rows(base, base_window), rows(head, head_window)
    bg = _gpu_per_rank(base, base_window, "gpu_time_ns")
    hg = _gpu_per_rank(head, head_window, "gpu_time_ns")

    def per_step(row: RankSummary | None, attr: str) -> float | None:
        return None if row is None else getattr(row, attr) / max(row.steps, 1)

    return [
        RankDelta(
            rank=rank,
            base_span_ns=per_step(b.get(rank), "span_ns"),
            head_span_ns=per_step(h.get(rank), "span_ns"),
            base_busy_ns=per_step(b.get(rank), "gpu_busy_ns"),
            head_busy_ns=per_step(h.get(rank), "gpu_busy_ns"),
            base_gpu_time_ns=bg.get(rank, 0.0) if rank in b else None,
            head_gpu_time_ns=hg.get(rank, 0.0) if rank in h else None,
        )
        for rank in sorted(set(b) | set(h))
    ]


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
            moved = (
                abs(hs.launches - bs.launches) > 1e-9
                or abs(hs.activities - bs.activities) > 1e-9
                or time_changed(bs.gpu_ns, hs.gpu_ns)
                or time_changed(bs.host_ns, hs.host_ns, HOST_NOISE_FRACTION)
            )
            status = "changed" if moved else "unchanged"
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
                base_activities=bs.activities,
                head_activities=hs.activities,
                delta_activities=hs.activities - bs.activities,
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
    deltas: Sequence[HelperDelta],
    iterations: IterationComparison | None,
    labels: tuple[str, str],
    per: str = "per step",
    verdict: str | None = None,
) -> str:
    """One line: the iteration verdict, then the helpers behind the launch difference."""
    total = sum(d.delta_launches for d in deltas)
    base_total = sum(d.base_launches for d in deltas)
    movers = [d for d in deltas if abs(d.delta_launches) >= 0.5][:4]
    parts = []
    if iterations is not None:
        parts.append(
            f"{labels[1]} vs {labels[0]}: {verdict or iterations.verdict} (median "
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
        parts.append(f"{total:+g} launches {per}{pct}, from {named}")
    else:
        parts.append(f"same launches {per} for every helper")
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
    whole = WHOLE_TRACE in (base_window, head_window)
    per = "in the whole trace" if whole else "per step"
    issues = comparability(base, head, base_window, head_window, (b_it, h_it))
    refused = refusal(issues)
    summary = _summary(deltas, iterations, labels, per, INCONCLUSIVE if refused else None)
    notes = [issue.message for issue in issues]
    without_gpu = [
        side
        for side, r in (("base", base), ("head", head))
        if r.host_time is not None and not r.host_time.gpu_activity
    ]
    if without_gpu:
        notes.append(
            f"no GPU activity in the {' and '.join(without_gpu)} trace: helper, kernel, Total "
            "GPU, GPU busy and account figures are not observed"
        )
    if notes and iterations is not None:
        summary += f"; {len(notes)} comparability warning(s): see notes"
    if mixed and b_it and h_it:
        summary += (
            f"; iterations not compared: {base_window} is {b_it.source}, {head_window} is "
            f"{h_it.source}"
        )
    launch_delta = sum(d.delta_launches for d in deltas)
    if refused:
        summary += f"; no time verdict: {refused} (see notes)"
    verdict = (
        (INCONCLUSIVE if refused else iterations.verdict)
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
        do_first_head=list(head.summary.do_first) if head.summary is not None else [],
        summary=summary,
        verdict=verdict,
        account=account_deltas(base, head, base_window, head_window),
        basis=f"{'whole trace' if whole else 'per step'}, summed over ranks",
        kernel_deltas=kernel_deltas(base, head, base_window, head_window),
        total_gpu=total_gpu(base, head, base_window, head_window),
        ranks=rank_deltas(base, head, base_window, head_window),
        notes=notes,
        comparability=issues,
        gpu_observed=not without_gpu,
        timeline_base=[t for t in base.gpu_timeline if t.window == base_window],
        timeline_head=[t for t in head.gpu_timeline if t.window == head_window],
    )


__all__ = [
    "HOST_NOISE_FRACTION",
    "INCONCLUSIVE",
    "TIME_NOISE_FRACTION",
    "TIME_NOISE_NS",
    "CompareError",
    "compare_reports",
    "default_window",
    "helper_deltas",
    "kernel_deltas",
    "rank_deltas",
    "time_changed",
    "total_gpu",
]
