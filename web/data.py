"""Page data: one function per page, returning the model both the HTML and the ``.json`` twin use.

Datasette's rule: a page is a renderer over a data function, so what the browser shows and what
a script reads from ``/runs/3.json`` cannot drift apart. Figures are part of the data (plain
plotly dicts from :mod:`web.figures`), which also makes the charts testable without a browser.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from typing import Any, Literal

import markupsafe
import numpy as np
from pydantic import BaseModel, Field, field_validator

from analyzers.catalog import Catalog
from analyzers.catalog.description import CatalogDescription, describe
from analyzers.changepoint import METHOD as CHANGE_POINT_METHOD
from analyzers.changepoint import change_points
from analyzers.compare import CompareError
from analyzers.failure import failure_headline, failure_of, rank_stacks
from analyzers.manifest import FailureRecord
from analyzers.report import (
    Action,
    ComparisonReport,
    Finding,
    GroupAccount,
    GroupTimeline,
    HelperDelta,
    HelperStat,
    TraceSummary,
)
from pr_bot.comment import CommentRun, comment_context, render_comment
from pr_bot.deltas import HostTimeRow, MetricRow, host_rows_for, metric_rows, sides_without_gpu
from pr_bot.labels import compare_url
from service.core.errors import BadRequest
from service.page_summary import RunPageSummary, TimelineColumns
from service.storage.runs import SORT_KEYS, SPREAD_METRICS, VERDICTS, Metric, Verdict
from service.store import HistoryPoint, RunDetail, RunFilters, RunSummary
from web import figures
from web.store import WebStore

Figure = dict[str, Any]

KNOWN_METRICS = tuple(
    m.value for m in Metric if m not in (Metric.ITERATION_P10_MS, Metric.ITERATION_P90_MS)
)
"""The metrics the history page offers (the p10/p90 ones are the median's spread bars)."""
WHOLE_TRACE = "whole trace"  # the window group analyzers use for the entire trace
MAIN_BRANCH = "main"  # the branch whose history series is searched for change points
NOISE_WINDOW = 10  # previous points that define the noise band of the history chart
NOISE_MIN_POINTS = 3


class PageError(ValueError):
    """A query parameter of a page is unusable (the message names it and what was expected)."""


# ----------------------------------------------------------------------------------- runs list


RunRow = RunSummary
"""A run-list row: the store's summary (implementation and verdict included)."""


class RunsQuery(BaseModel):
    """The run list's filters, sort and page, exactly as given in the query string."""

    implementation: str | None = None
    config_key: str | None = None
    branch: str | None = None
    commit: str | None = None
    status: str | None = None
    verdict: str | None = None  # one of VERDICTS; "" (the form's "any") means no filter
    date_from: str | None = Field(default=None, description="ISO date, inclusive")
    date_to: str | None = Field(default=None, description="ISO date, inclusive")
    repo: str | None = Field(default=None, max_length=200, description="the loop's repository")
    pr: int | None = Field(default=None, ge=1, le=2**31, description="the loop's pull request")
    suite: str | None = Field(default=None, max_length=200, description="the loop's suite")
    sort: str = "created_at"
    order: Literal["asc", "desc"] = "desc"
    page: int = Field(default=1, ge=1)
    per_page: int = Field(default=50, ge=1, le=500)

    @field_validator(
        "implementation", "config_key", "branch", "commit", "status", "verdict", "date_from",
        "date_to", "repo", "pr", "suite", mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        """The filter form submits every field; an empty one means 'any', not an invalid value."""
        return None if value == "" else value


class RunsPage(BaseModel):
    query: RunsQuery
    runs: list[RunRow]
    total: int  # matching runs
    scanned: int  # = total: the store filters, sorts and pages in SQL
    truncated: bool  # always False (kept for the template and the JSON twin)
    options: dict[str, list[str]]  # values offered by the filter drop-downs


def runs_page(store: WebStore, query: RunsQuery) -> RunsPage:
    """Filter, sort and page in the store (SQL, the same list the API serves)."""
    if query.sort not in SORT_KEYS:
        raise PageError(f"sort must be one of {', '.join(SORT_KEYS)}; got {query.sort!r}")
    verdict: Verdict | None = None
    for known in VERDICTS:
        if query.verdict == known:
            verdict = known
    if query.verdict and verdict is None:
        raise PageError(f"verdict must be one of {', '.join(VERDICTS)}; got {query.verdict!r}")
    filters = RunFilters(
        branch=query.branch or None, config_key=query.config_key or None,
        commit=query.commit or None, status=query.status or None,
        implementation=query.implementation or None, verdict=verdict,
        date_from=query.date_from or None, date_to=query.date_to or None,
        repo=query.repo or None, pr=query.pr, suite=query.suite or None,
    )  # fmt: skip
    start = (query.page - 1) * query.per_page
    rows = store.list_runs(filters, query.per_page, start, query.sort, query.order)
    total = store.count_runs(filters)
    return RunsPage(
        query=query,
        runs=rows,
        total=total,
        scanned=total,
        truncated=False,
        options={**store.run_list_options(), "verdict": list(VERDICTS)},
    )


# ------------------------------------------------------------------------------------ run page


class HelperRow(BaseModel):
    """Per-helper totals over ranks for one window group, per step."""

    window: str
    helper: str
    category: str
    launches_per_step: float
    gpu_ms_per_step: float
    matched_by: str


class ArmComparison(BaseModel):
    """A link to compare two window groups (arms) of this run."""

    base_window: str
    head_window: str
    url: str


class RankStackView(BaseModel):
    """One rank's Python stack from the watchdog's ``faulthandler`` dump."""

    rank: str
    waiting_at: str | None  # "train.py:30 in step": the innermost frame of user code
    text: str


class FailureView(BaseModel):
    """How the run's job failed or hung: the headline every surface leads with, the record."""

    headline: str
    record: FailureRecord
    stacks: list[RankStackView]


def run_caveat(manifest: dict[str, Any] | None) -> str | None:
    """The manifest's ``run.caveat`` (``analyzers.bundle.RunInfo``), None without one."""
    run = (manifest or {}).get("run")
    caveat = run.get("caveat") if isinstance(run, dict) else None
    return caveat if isinstance(caveat, str) and caveat else None


def failure_view(manifest: dict[str, Any] | None) -> FailureView | None:
    """The run's failure (manifest ``failure``), None for a run whose job ended cleanly."""
    record = failure_of(manifest)
    if record is None:
        return None
    stacks = [
        RankStackView(rank=s.rank, waiting_at=s.waiting_at.where() if s.waiting_at else None,
                      text=s.text)
        for s in rank_stacks(record)
    ]  # fmt: skip
    return FailureView(headline=failure_headline(record), record=record, stacks=stacks)


class RunPageParts(BaseModel):
    """What the run page shows of its report: built from the page summary alone (and the run's
    id, in links), so it is built once, when the worker stores the report (``web.page_parts``),
    not at a view."""

    report: RunPageSummary | None = None
    """What the page shows of the stored report (``service.page_summary``); None until the
    run is analysed. The whole report: ``/api/v1/runs/{id}/analysis/result``."""
    helpers: list[HelperRow] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list)
    arm_comparisons: list[ArmComparison] = Field(default_factory=list)
    figures: dict[str, Figure] = Field(default_factory=dict)
    idle_causes: list[IdleCause] = Field(default_factory=list)
    timelines: list[tuple[str, str]] = Field(default_factory=list)
    """(figure name, window group) of each drawn step timeline, the first group's first."""
    gpu_observed: bool = True
    """False for a trace without GPU activity: the GPU timeline and the step account are not
    drawn (they would show nothing but "idle"), the page says "not observed" instead."""
    do_first: list[Action] = Field(default_factory=list)
    """The report's "do this first" (at most three actions), shown at the top of the page."""
    summary: TraceSummary | None = None
    """The report's whole-trace summary, :data:`SUMMARY_ROWS` rows per table (the full one is
    in ``report.summary``)."""
    figure_json: dict[str, Any] = Field(default_factory=dict, exclude=True)
    """``figures`` already written as the page embeds them (``figures.html_json``), built
    with them; not part of the ``.json`` twin."""


class RunPageHead(BaseModel):
    """What the run page shows of the run's row, read at every view (its status, progress and
    error move while the report stays)."""

    run: RunDetail
    """The run's row (its ``report`` is None: the page reads the page summary)."""
    failure: FailureView | None = None
    """Set when the run's job failed or hung (then ``verdict`` is "failed")."""
    implementation: str | None
    verdict: str
    caveat: str | None = None
    """The manifest's ``run.caveat``: what to know before trusting the figures."""


class RunPage(RunPageHead, RunPageParts):
    """The run page's data, its ``.json`` twin: the report's parts, then the run's (the served
    twin joins the stored parts' JSON and the head's in that order, ``web.page_parts``)."""


SUMMARY_ROWS = 5
"""Rows per table of the run page's compact summary."""


def compact_summary(summary: TraceSummary | None) -> TraceSummary | None:
    """``summary`` with :data:`SUMMARY_ROWS` rows per table (None for a report without one)."""
    if summary is None:
        return None
    return summary.model_copy(
        update={
            "families": summary.families[:SUMMARY_ROWS],
            "cpu_ops": summary.cpu_ops[:SUMMARY_ROWS],
            "ranges": summary.ranges[:SUMMARY_ROWS],
            "sync_pointers": summary.sync_pointers[:SUMMARY_ROWS],
        }
    )


class TimelineZoom(BaseModel):
    """Where an idle-cause link zooms the drawn timeline: the cause's longest gap there."""

    chart: str  # the timeline figure's name ("timeline", "timeline_1", ...)
    row: str  # the y row, "rank 0 · idle gaps"
    x0_ms: float  # the gap, ms from the window start
    x1_ms: float
    range_ms: tuple[float, float]  # the x range to show (the gap with a margin)
    text: str  # the gap's label on the timeline

    @property
    def fragment(self) -> str:
        """``timeline_1@x0-x1``: the page's script zooms that chart on load and on click."""
        return f"{self.chart}@{self.range_ms[0]:.4f}-{self.range_ms[1]:.4f}"


class IdleCause(BaseModel):
    """One idle line of the step account, for the run page's "top idle causes" table."""

    window: str
    rank: int
    part: str
    label: str
    ms_per_step: float
    gaps: int
    largest_ms: float | None
    largest_at: str | None  # "+12.345 ms in arm:auto_clone#1"
    thread: str | None
    detail: str | None
    zoom: TimelineZoom | None = None
    """The cause's longest gap in the drawn timeline window (None when the timeline draws
    another group, or the cause has no gap in its step)."""
    drawn_window: str | None = None  # the window the timeline draws for this rank


def drawn_timelines(report: RunPageSummary) -> dict[str, tuple[str, TimelineColumns]]:
    """window group -> (figure name, timeline) of every step timeline the run page draws."""
    names = ["timeline"] + [f"timeline_{i}" for i in range(1, len(report.timelines))]
    return {
        t.window: (name, t)
        for name, t in zip(names, report.timelines, strict=False)
        if t.event_count
    }


def timeline_zoom(
    drawn: dict[str, tuple[str, TimelineColumns]], window: str, rank: int, part: str, label: str
) -> tuple[TimelineZoom | None, str | None]:
    """The longest drawn gap of one idle cause, and the window drawn for that rank."""
    if window not in drawn:
        return None, None
    chart, timeline = drawn[window]
    drawn_window = next((s.window for s in timeline.steps if s.rank == rank), None)
    code = {text: i for i, text in enumerate(timeline.strings)}
    if part not in code or label not in code:
        return None, drawn_window
    g = figures.longest_gap(
        timeline,
        (np.asarray(timeline.gap_rank) == rank)
        & (np.asarray(timeline.gap_part) == code[part])
        & (np.asarray(timeline.gap_label) == code[label]),
    )
    if g is None:
        return None, drawn_window
    x0, x1 = g.start_ns / 1e6, g.end_ns / 1e6
    margin = max(x1 - x0, 0.01) * 4  # the gap and the kernels around it
    return (
        TimelineZoom(
            chart=chart,
            row=figures.gap_row(rank),
            x0_ms=x0,
            x1_ms=x1,
            # 0.1 µs steps, outward, so the link, its fragment and the range hold the gap
            range_ms=(
                math.floor(max(x0 - margin, 0.0) * 1e4) / 1e4,
                math.ceil((x1 + margin) * 1e4) / 1e4,
            ),
            text=figures.gap_text(g),
        ),
        drawn_window,
    )


def idle_causes(
    accounts: Sequence[GroupAccount],
    limit: int = 5,
    drawn: dict[str, tuple[str, TimelineColumns]] | None = None,
) -> list[IdleCause]:
    """The largest idle lines (ms per step) of each step group, over its ranks, each with a
    link to its longest gap in the drawn timeline when the timeline draws its group."""
    rows = []
    for a in accounts:
        if a.window == WHOLE_TRACE:
            continue
        steps = max(a.steps, 1)
        for p in a.parts:
            if not p.part.value.startswith("idle"):
                continue
            g = p.largest[0] if p.largest else None
            zoom, window = timeline_zoom(drawn or {}, a.window, a.rank, p.part.value, p.label)
            rows.append(
                IdleCause(
                    zoom=zoom,
                    drawn_window=window,
                    window=a.window,
                    rank=a.rank,
                    part=p.part.value,
                    label=p.label,
                    ms_per_step=p.time_ns / steps / 1e6,
                    gaps=p.gaps,
                    largest_ms=g.duration_ns / 1e6 if g else None,
                    largest_at=(
                        f"+{g.offset_ns / 1e6:.3f} ms in "
                        + (g.window if g.window != a.window else f"{g.window}#{g.index}")
                        if g
                        else None
                    ),
                    thread=p.thread,
                    detail=p.detail,
                )
            )
    order = list(dict.fromkeys(a.window for a in accounts))
    rows.sort(key=lambda r: (order.index(r.window), -r.ms_per_step))
    out: list[IdleCause] = []
    for r in rows:
        if sum(1 for o in out if o.window == r.window) < limit:
            out.append(r)
    return out


def helper_rows(stats: Sequence[HelperStat]) -> list[HelperRow]:
    """Sum ranks per (window, helper); divide by steps so windows compare directly."""
    acc: dict[tuple[str, str], list[Any]] = {}
    for s in stats:
        steps = max(s.steps, 1)
        row = acc.setdefault((s.window, s.helper), [s.category.value, 0.0, 0.0, s.matched_by])
        row[1] += s.launches / steps
        row[2] += s.gpu_time_ns / steps / figures.NS_PER_MS
    out = [
        HelperRow(window=w, helper=h, category=c, launches_per_step=n, gpu_ms_per_step=t,
                  matched_by=m)
        for (w, h), (c, n, t, m) in acc.items()
    ]  # fmt: skip
    out.sort(key=lambda r: (r.window, -r.gpu_ms_per_step, r.helper))
    return out


def windowed_helpers(stats: Sequence[HelperStat]) -> list[HelperStat]:
    """Helper stats of the step or arm windows; the "whole trace" group only when there is
    nothing else (it sums everything, warm-up included, and would dwarf the per-step bars)."""
    windowed = [s for s in stats if s.window != WHOLE_TRACE]
    return windowed or list(stats)


def report_parts(run_id: int, report: RunPageSummary | None) -> RunPageParts:
    """The run page's fields built from its page summary alone (figures, tables, links)."""
    if report is None:
        return RunPageParts()
    figs: dict[str, Figure] = {}
    drawn = drawn_timelines(report)
    gpu_observed = report.host_time is None or report.host_time.gpu_activity
    if report.iterations:
        figs["iterations"] = figures.iteration_distribution(report.iterations)
    shown = windowed_helpers(report.helpers)
    if shown:
        figs["helper_launches"] = figures.helper_bars(shown, "launches")
        figs["helper_time"] = figures.helper_bars(shown, "gpu_time_ms")
        figs["category_time"] = figures.category_bars(shown, "gpu_time_ms")
    for name, timeline in drawn.values():
        figs[name] = figures.timeline_figure(timeline)
    if gpu_observed:  # without GPU activity both would be one "idle" bar per window
        figs.update(gpu_timeline_figures(report.gpu_timeline))
        if report.accounts:
            figs["account"] = figures.account_bars(report.accounts)
    severity_order = {"error": 0, "warning": 1, "info": 2}
    groups = sorted({s.window for s in report.helpers} - {WHOLE_TRACE})
    return RunPageParts(
        report=report,
        figures=figs,
        figure_json={name: markupsafe.Markup(figures.html_json(f)) for name, f in figs.items()},
        gpu_observed=gpu_observed,
        helpers=helper_rows(report.helpers),
        findings=sorted(report.findings, key=lambda f: severity_order.get(f.severity.value, 3)),
        arm_comparisons=[
            ArmComparison(base_window=a, head_window=b, url=compare_url(run_id, run_id, a, b))
            for a in groups
            for b in groups
            if a < b
        ],
        idle_causes=idle_causes(report.accounts, drawn=drawn) if "account" in figs else [],
        timelines=[(name, group) for group, (name, _) in drawn.items()],
        do_first=list(report.summary.do_first) if report.summary else [],
        summary=compact_summary(report.summary),
    )


def run_page_head(run: RunDetail) -> RunPageHead:
    """The run page's fields read from the run's row."""
    return RunPageHead(
        run=run,
        caveat=run_caveat(run.manifest),
        failure=failure_view(run.manifest),
        implementation=run.implementation,
        verdict=run.verdict,
    )


def gpu_timeline_figures(timeline: Sequence[GroupTimeline]) -> dict[str, Figure]:
    """The run page's stacked GPU-timeline bars (none for a report without a timeline: one
    stored before the timeline existed)."""
    if not timeline:
        return {}
    return {"gpu_timeline": figures.run_timeline_breakdown(list(timeline))}


def comparison_timeline_figures(report: ComparisonReport) -> dict[str, Figure]:
    """Base and head GPU-timeline bars per rank for the comparison page."""
    if not (report.timeline_base or report.timeline_head):
        return {}
    return {
        "gpu_timeline": figures.comparison_timeline_breakdown(
            report.timeline_base, report.timeline_head
        )
    }


# ------------------------------------------------------------------------------ comparison page


class ComparisonHostTime(BaseModel):
    """What a comparison with a side without GPU activity shows instead of the GPU tables."""

    sides_without_gpu: list[str]  # "base", "head" or both
    rows: list[HostTimeRow]  # ``pr_bot.deltas.host_rows_for``: the PR comment's rows too


class ComparePage(BaseModel):
    base: RunSummary
    head: RunSummary
    base_window: str | None
    head_window: str | None
    report: ComparisonReport
    metrics: list[MetricRow]
    changed_helpers: list[HelperDelta]
    unchanged_helpers: int
    markdown: str  # the PR comment this comparison would post
    figures: dict[str, Figure]
    host: ComparisonHostTime | None = None
    """Per-helper host time when a side has no GPU activity (None: the GPU tables apply)."""
    base_failure: FailureView | None = None
    """How the base run's job failed or hung (its verdict: failed), None when it ended well."""
    head_failure: FailureView | None = None


def comparison_host_time(
    store: WebStore, base_id: int, head_id: int, report: ComparisonReport
) -> ComparisonHostTime | None:
    """The host-time rows of a comparison, for the page and the PR-comment endpoint alike.

    ``pr_bot.deltas.host_rows_for`` decides; the two reports are read only when the comparison
    says a side has no GPU activity (a GPU comparison never pays for reading them again).
    """
    if report.gpu_observed:
        return None
    base = store.get_run(base_id).report
    head = base if head_id == base_id else store.get_run(head_id).report
    rows = host_rows_for(base, head, report)
    if rows is None or base is None or head is None:
        return None
    return ComparisonHostTime(sides_without_gpu=sides_without_gpu(base, head), rows=rows)


def compare_page(
    store: WebStore,
    base_id: int,
    head_id: int,
    base_window: str | None = None,
    head_window: str | None = None,
    *,
    link_root: str | None = None,
) -> ComparePage:
    base = store.get_run(base_id, include_report=False)
    head = store.get_run(head_id, include_report=False)
    try:
        report = store.get_comparison(base_id, head_id, base_window, head_window)
    except CompareError as exc:  # e.g. a window name the reports do not have
        raise BadRequest(str(exc)) from exc
    changed = [d for d in report.helpers if d.status != "unchanged"]
    changed.sort(key=lambda d: (abs(d.delta_gpu_time_ns), abs(d.delta_launches)), reverse=True)
    figs: dict[str, Figure] = {}
    if report.iterations is not None:
        figs["distributions"] = figures.comparison_distributions(report.iterations)
    if changed:
        figs["helper_deltas"] = figures.helper_delta_bars(report.helpers)
    if report.gpu_observed:  # else every GPU figure would read 0 or "idle: other"
        figs.update(comparison_timeline_figures(report))
        if report.account:
            figs["account_delta"] = figures.account_delta_bars(report.account)
    context = comment_context(
        suite="preview",
        base=CommentRun(base.id, base.name, base.commit, base.manifest),
        head=CommentRun(head.id, head.name, head.commit, head.manifest),
        base_window=base_window,
        head_window=head_window,
        link_root=link_root,
    )
    host = comparison_host_time(store, base_id, head_id, report)
    base_failure, head_failure = failure_view(base.manifest), failure_view(head.manifest)
    return ComparePage(
        base_failure=base_failure,
        head_failure=head_failure,
        base=RunSummary(**base.model_dump(include=set(RunSummary.model_fields))),
        head=RunSummary(**head.model_dump(include=set(RunSummary.model_fields))),
        base_window=base_window,
        head_window=head_window,
        report=report,
        metrics=metric_rows(report),
        changed_helpers=changed,
        unchanged_helpers=len(report.helpers) - len(changed),
        markdown=render_comment(report, context, host_rows=host.rows if host else None),
        figures=figs,
        host=host,
    )


# --------------------------------------------------------------------------------- history page


class HistoryRow(BaseModel):
    point: HistoryPoint
    band_low: float | None
    band_high: float | None
    outside_band: bool
    change_point: str | None = None  # "+10.1% (20.01 -> 22.04, p=0.0013)" at a new level


class HistoryGroup(BaseModel):
    """One series the history page offers: the runs of one configuration hash that ran the
    same implementation(s)."""

    config_key: str
    implementation: str | None
    name: str  # readable: implementation, run names and workload, the hash last
    runs: int
    commits: int  # distinct commits among the runs


class HistoryPage(BaseModel):
    config_key: str | None
    metric: str
    label: str | None
    labels: list[str]
    options: dict[str, list[str]]
    points: list[HistoryRow]
    figures: dict[str, Figure]
    change_point_branch: str = MAIN_BRANCH
    change_point_method: str = CHANGE_POINT_METHOD
    implementation: str | None = None
    groups: list[HistoryGroup] = Field(default_factory=list)
    """Every series, grouped by implementation then configuration (the selector's options)."""
    title: str = "History"
    """What the page shows: the metric, the window, the implementation and the configuration."""
    series: str | None = None
    """The shown series' readable name (``HistoryGroup.name``)."""


_WORKLOAD_WORDS = (
    ("cp_comm", "{}"),
    ("strategy", "{}"),
    ("cp_size", "cp {}"),
    ("heads", "{} heads"),
    ("head_dim", "x {}"),
    ("dtype", "{}"),
    ("layers", "{} layers"),
    ("metadata", "metadata {}"),
)


def configuration_name(
    config_key: str, implementation: str | None, workload: dict[str, Any] | None, names: set[str]
) -> str:
    """A configuration people can read: "te · te-reference-3arms · p2p dual_chunk_swap cp 2
    16 heads x 128 bf16 4 layers seqlens 8192/4096/2048/2048 · 9899d0ce"."""
    work = workload or {}
    words = [text.format(work[key]) for key, text in _WORKLOAD_WORDS if work.get(key) is not None]
    seqlens = work.get("seqlens")
    if isinstance(seqlens, list) and seqlens:
        shown = "/".join(str(n) for n in seqlens[:6]) + ("/..." if len(seqlens) > 6 else "")
        words.append(f"seqlens {shown}")
    parts = [implementation or "implementation not recorded", ", ".join(sorted(names)[:3])]
    return " · ".join(p for p in [*parts, " ".join(words), config_key[:8]] if p)


def history_groups(store: WebStore, configs: Sequence[str]) -> list[HistoryGroup]:
    """The series of every configuration hash, split by the implementation(s) its runs ran,
    sorted by implementation then name (every analysed run has a findings count)."""
    groups = []
    for config in configs:
        by_impl: dict[str | None, list[HistoryPoint]] = {}
        for p in store.metric_history(config, Metric.FINDINGS, ""):
            by_impl.setdefault(p.implementation, []).append(p)
        for impl, points in by_impl.items():
            newest = points[-1]
            names = {p.name for p in points}
            groups.append(
                HistoryGroup(
                    config_key=config,
                    implementation=impl,
                    name=configuration_name(config, impl, newest.workload, names),
                    runs=len(points),
                    commits=len({p.commit for p in points if p.commit}),
                )
            )
    return sorted(groups, key=lambda g: (g.implementation or "~", g.name))


IMPLEMENTATION_NOT_RECORDED = "(not recorded)"
"""The implementation selector's value for runs whose manifest names no implementation."""


def _pick_group(
    groups: Sequence[HistoryGroup], config_key: str | None, implementation: str | None
) -> HistoryGroup | None:
    """The series asked for: configuration and implementation; else the implementation's first
    (the implementation selector changed); else the configuration's first; else the first."""
    def impl(g: HistoryGroup) -> str:
        return g.implementation or IMPLEMENTATION_NOT_RECORDED

    tests = (
        lambda g: g.config_key == config_key and impl(g) == implementation,
        lambda g: impl(g) == implementation,
        lambda g: g.config_key == config_key,
        lambda g: True,
    )
    return next((g for test in tests for g in groups if test(g)), None)


def _history_title(metric: str, label: str | None, group: HistoryGroup | None) -> str:
    window = f" ({label})" if label else ""
    if group is None:
        return f"History of {metric}{window}"
    runs = f"{group.implementation} runs" if group.implementation else "runs"
    return f"History of {metric}{window}: {runs} of configuration {group.config_key[:8]}"


def mark_history_change_points(rows: list[HistoryRow], branch: str = MAIN_BRANCH) -> None:
    """Set ``change_point`` on the rows where ``branch``'s series moved to a new level.

    Only one branch's runs form the series: pull-request runs interleaved with main's would
    make every experiment look like a regression of main.
    """
    on_branch = [i for i, r in enumerate(rows) if r.point.branch == branch]
    found = change_points([rows[i].point.value for i in on_branch])
    for cp in found:
        rows[on_branch[cp.index]].change_point = (
            f"{cp.shift_pct:+.1f}% ({cp.before_median:.3g} -> {cp.after_median:.3g}, "
            f"p={cp.p_value:.2g})"
        )


def noise_band(values: Sequence[float]) -> list[tuple[float, float] | None]:
    """For each point, median ± 3 robust sigma (1.4826 MAD) of the ``NOISE_WINDOW`` points
    before it; None until ``NOISE_MIN_POINTS`` earlier points exist.

    Robust statistics because one slow outlier run must not widen the band for the next ten.
    """
    bands: list[tuple[float, float] | None] = []
    for i in range(len(values)):
        prior = values[max(0, i - NOISE_WINDOW) : i]
        if len(prior) < NOISE_MIN_POINTS:
            bands.append(None)
            continue
        centre = statistics.median(prior)
        sigma = 1.4826 * statistics.median(abs(v - centre) for v in prior)
        sigma = max(sigma, abs(centre) * 0.005)  # a perfectly flat history still has a band
        bands.append((centre - 3 * sigma, centre + 3 * sigma))
    return bands


def history_page(
    store: WebStore,
    config_key: str | None,
    metric: str,
    label: str | None,
    implementation: str | None = None,
) -> HistoryPage:
    """One metric over the runs of one series: a configuration hash and the implementation(s)
    its runs ran (``implementation`` None: the configuration's first series)."""
    configs = store.run_list_options()["config_key"]
    groups = history_groups(store, configs)
    group = _pick_group(groups, config_key, implementation)
    config_key = group.config_key if group else config_key or (configs[0] if configs else None)
    all_points = store.metric_history(config_key, metric, None) if config_key else []
    if group is not None:
        all_points = [p for p in all_points if p.implementation == group.implementation]
    labels = sorted({p.label for p in all_points})
    if label is None and labels:
        label = "" if "" in labels else labels[0]
    points = [p for p in all_points if p.label == label]
    bands = noise_band([p.value for p in points])
    rows = [
        HistoryRow(
            point=p,
            band_low=b[0] if b else None,
            band_high=b[1] if b else None,
            outside_band=bool(b and not b[0] <= p.value <= b[1]),
        )
        for p, b in zip(points, bands, strict=True)
    ]
    mark_history_change_points(rows)
    spread = _spreads(store, config_key, metric, label) if rows else {}
    series = [
        figures.SeriesPoint(
            x=(r.point.commit or "")[:8] or r.point.name,
            value=r.point.value,
            low=r.band_low,
            high=r.band_high,
            hover=f"run #{r.point.run_id} {r.point.name} ({r.point.branch or 'no branch'}) "
            f"{r.point.created_at}" + (f"; caveat: {r.point.caveat}" if r.point.caveat else ""),
            link=f"/runs/{r.point.run_id}",
            spread_low=spread.get(r.point.run_id, (None, None))[0],
            spread_high=spread.get(r.point.run_id, (None, None))[1],
        )
        for r in rows
    ]
    unit = "ms" if metric.endswith("_ms") or "_ms_" in metric else ""
    figs = {}
    if rows:
        marks = [(i, f"change {r.change_point.split(' ')[0]}") for i, r in enumerate(rows)
                 if r.change_point]  # fmt: skip
        figs["history"] = figures.mark_change_points(
            figures.history_figure(series, metric, unit), marks
        )
    return HistoryPage(
        config_key=config_key,
        metric=metric,
        label=label,
        labels=labels,
        options={"config_key": configs, "metric": sorted({*KNOWN_METRICS, metric})},
        points=rows,
        figures=figs,
        implementation=group.implementation if group else None,
        groups=groups,
        title=_history_title(metric, label, group),
        series=group.name if group else None,
    )


def _spreads(
    store: WebStore, config_key: str | None, metric: str, label: str | None
) -> dict[int, tuple[float, float]]:
    """run id -> (low, high) of the run's own spread, for metrics that have one stored."""
    if config_key is None or metric not in SPREAD_METRICS:
        return {}
    low_name, high_name = SPREAD_METRICS[Metric(metric)]
    lows = {p.run_id: p.value for p in store.metric_history(config_key, low_name, label)}
    highs = {p.run_id: p.value for p in store.metric_history(config_key, high_name, label)}
    return {run: (lows[run], highs[run]) for run in lows.keys() & highs.keys()}


# --------------------------------------------------------------------------------- catalog page


def catalog_page(catalog: Catalog) -> CatalogDescription:
    """The catalog page and its twin: the one shape the API and ``cptrace catalog --json`` give."""
    return describe(catalog)
