"""What the run page shows of a report, stored beside it when the analysis is stored.

A stored report of the reference workload is 2.7-3.6 MB, 90% of it the drawn step timelines as
one JSON object per kernel; parsing it took ~100-320 ms per page view before a figure was drawn.
The page needs a fraction of it: no per-step accounts or per-window timelines, the kernel
table of the whole trace only, and the timelines as columns (every string once, then integer
columns) that load without a model per event. :func:`page_summary` builds it once, in the
analysis's transaction (``service.analysis.complete_analysis``); the pages read only it
(``service.store.get_page_summary``, which also builds it once for a run stored before it
existed).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from pydantic import BaseModel, Field, model_validator

from analyzers.report import (
    AccountPartKind,
    AnalysisReport,
    Category,
    DeviceFigures,
    Finding,
    GroupAccount,
    GroupTimeline,
    HelperStat,
    HostTimeReport,
    Imbalance,
    IterationStats,
    KernelStat,
    RankSummary,
    Timeline,
    TimelineStep,
    TraceSummary,
)

PAGE_SUMMARY_VERSION = 1
"""Bumped when :class:`RunPageSummary` changes: a stored summary of another version is rebuilt
from its report on the next view."""
WHOLE_TRACE = "whole trace"
KERNEL_ROWS = 500
"""Rows of the run page's kernel table (the most GPU time first); the report keeps them all."""


class TimelineColumns(BaseModel):
    """A drawn step timeline (``analyzers.report.Timeline``) as columns: ``strings`` holds
    every kernel name, helper, category, gap cause and gap label once, and the ``*_name``,
    ``helper``, ``category``, ``gap_part`` and ``gap_label`` columns index it. Event ``i`` is
    ``rank[i], stream[i], start_ns[i], ...`` in the timeline's order."""

    window: str
    limit: int
    dropped: int
    gaps_dropped: int = 0
    steps: list[TimelineStep] = Field(default_factory=list)
    strings: list[str] = Field(default_factory=list)
    rank: list[int] = Field(default_factory=list)
    stream: list[int] = Field(default_factory=list)
    start_ns: list[int] = Field(default_factory=list)
    end_ns: list[int] = Field(default_factory=list)
    name: list[int] = Field(default_factory=list)
    helper: list[int] = Field(default_factory=list)
    category: list[int] = Field(default_factory=list)
    gap_rank: list[int] = Field(default_factory=list)
    gap_start_ns: list[int] = Field(default_factory=list)
    gap_end_ns: list[int] = Field(default_factory=list)
    gap_part: list[int] = Field(default_factory=list)
    gap_label: list[int] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> TimelineColumns:
        """Columns of one length, indices into ``strings``, causes and categories known."""
        events = (self.rank, self.stream, self.start_ns, self.end_ns, self.name, self.helper,
                  self.category)  # fmt: skip
        gaps = (self.gap_rank, self.gap_start_ns, self.gap_end_ns, self.gap_part, self.gap_label)
        for group in (events, gaps):
            if len({len(column) for column in group}) > 1:
                raise ValueError("timeline columns of different lengths")
        refs = (*events[4:], *gaps[3:])
        if any(column and not 0 <= min(column) <= max(column) < len(self.strings)
               for column in refs):  # fmt: skip
            raise ValueError("a timeline column points outside its strings")
        parts = {p.value for p in AccountPartKind}
        kinds = {c.value for c in Category}
        if not {self.strings[i] for i in set(self.gap_part)} <= parts or not {
            self.strings[i] for i in set(self.category)
        } <= kinds:
            raise ValueError("a timeline gap cause or category is not a known one")
        return self

    @property
    def event_count(self) -> int:
        """How many events the timeline draws (0: nothing to draw)."""
        return len(self.rank)


def timeline_columns(timeline: Timeline) -> TimelineColumns:
    """``timeline`` as :class:`TimelineColumns` (same events, same order)."""
    index: dict[str, int] = {}

    def ref(text: str) -> int:
        return index.setdefault(text, len(index))

    events, gaps = timeline.events, timeline.gaps
    return TimelineColumns(
        window=timeline.window,
        limit=timeline.limit,
        dropped=timeline.dropped,
        gaps_dropped=timeline.gaps_dropped,
        steps=list(timeline.steps),
        rank=[e.rank for e in events],
        stream=[e.stream for e in events],
        start_ns=[e.start_ns for e in events],
        end_ns=[e.end_ns for e in events],
        name=[ref(e.name) for e in events],
        helper=[ref(e.helper) for e in events],
        category=[ref(e.category.value) for e in events],
        gap_rank=[g.rank for g in gaps],
        gap_start_ns=[g.start_ns for g in gaps],
        gap_end_ns=[g.end_ns for g in gaps],
        gap_part=[ref(g.part.value) for g in gaps],
        gap_label=[ref(g.label) for g in gaps],
        strings=list(index),
    )


class RunPageSummary(BaseModel):
    """The parts of an ``AnalysisReport`` the run page and its ``.json`` twin show; the field
    names are the report's (the full report: ``GET /api/v1/runs/{id}/analysis/result``)."""

    version: int = PAGE_SUMMARY_VERSION
    stamp: str | None = Field(default=None, exclude=True)
    """The stored row's stamp (new at every write; not part of the JSON): what caches of what
    is built from this summary are keyed by. None for a summary not read from the store."""
    ranks: list[int] = Field(default_factory=list)
    iterations: list[IterationStats] = Field(default_factory=list)
    helpers: list[HelperStat] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list)
    timelines: list[TimelineColumns] = Field(default_factory=list)
    """The report's ``timeline`` then its ``other_timelines``."""
    gpu_timeline: list[GroupTimeline] = Field(default_factory=list)
    accounts: list[GroupAccount] = Field(default_factory=list)
    host_time: HostTimeReport | None = None
    summary: TraceSummary | None = None
    devices: list[DeviceFigures] = Field(default_factory=list)
    kernels: list[KernelStat] = Field(default_factory=list)
    """The whole trace's kernels summed over ranks, the :data:`KERNEL_ROWS` with the most
    time, most first."""
    kernels_total: int = 0
    """How many kernel names that table has in the report."""
    rank_summaries: list[RankSummary] = Field(default_factory=list)
    imbalance: list[Imbalance] = Field(default_factory=list)
    notes: list[str] = Field(default_factory=list)


def whole_trace_kernels(kernels: Sequence[KernelStat]) -> list[KernelStat]:
    """The whole-trace rows summed over ranks, the most GPU time first."""
    rows = [k for k in kernels if k.window == WHOLE_TRACE and k.rank is None]
    return sorted(rows, key=lambda k: k.total_ns, reverse=True)


def page_summary(report: AnalysisReport) -> RunPageSummary:
    """What the run page shows of ``report``."""
    kernels = whole_trace_kernels(report.kernels)
    timelines = ([report.timeline] if report.timeline else []) + list(report.other_timelines)
    return RunPageSummary(
        ranks=list(report.ranks),
        iterations=list(report.iterations),
        helpers=list(report.helpers),
        findings=list(report.findings),
        timelines=[timeline_columns(t) for t in timelines],
        gpu_timeline=list(report.gpu_timeline),
        accounts=list(report.accounts),
        host_time=report.host_time,
        summary=report.summary,
        devices=list(report.devices),
        kernels=kernels[:KERNEL_ROWS],
        kernels_total=len(kernels),
        rank_summaries=list(report.rank_summaries),
        imbalance=list(report.imbalance),
        notes=list(report.notes),
    )


class BuiltPage(NamedTuple):
    """A run page as built from its :class:`RunPageSummary` (``web.page_parts``), stored when
    the worker stores the report so that a view builds nothing: the report's part of the HTML
    page, how many charts it draws, and the report's fields of its ``.json`` twin (one JSON
    object)."""

    charts: int
    html: str
    page_json: str
