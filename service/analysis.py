"""Analysis tasks: a queue table the worker process drains, with leases like the job queue.

The queue itself (enqueue, claim, lease, requeue) is ``service.storage.tasks``, on either
backend; the API only inserts tasks (``enqueue_analysis``); the worker claims one inside
``BEGIN IMMEDIATE``, analyses it off the request path, and records the report, the metrics the
trend charts use, and progress/errors on the run. A worker killed mid-analysis leaves a running
task whose lease expires; the next claim requeues it (bounded attempts, then the run fails with
the reason).
"""

from __future__ import annotations

from typing import Any

from analyzers.report import REPORT_SCHEMA_VERSION, AnalysisReport, IterationStats
from service.page_summary import PAGE_SUMMARY_VERSION, page_summary
from service.storage import runs
from service.storage.engine import Conn, transaction
from service.storage.runs import Metric
from service.storage.tasks import (
    ClaimedTask,
    claim_analysis,
    enqueue_analysis,
    expire_orphaned_leases,
    fail_analysis,
    finish_task,
    holds,
    record_progress,
    requeue_analysis,
)

__all__ = [
    "ClaimedTask", "claim_analysis", "complete_analysis", "enqueue_analysis",
    "expire_orphaned_leases", "fail_analysis", "record_progress", "report_metrics",
    "requeue_analysis", "requeue_stale_reports", "task_inputs",
]  # fmt: skip


def report_metrics(report: AnalysisReport) -> list[tuple[Metric, str, float]]:
    """The ``(metric, label, value)`` rows trend charts and the run list read."""
    out: list[tuple[Metric, str, float]] = [(Metric.FINDINGS, "", float(len(report.findings)))]
    # Profiled-step durations carry the profiler's overhead: only timed iterations are an
    # iteration time a run list or a trend may show.
    timed = [s for s in report.iterations if s.source != "profiled"]
    overall = [s for s in timed if s.rank is None] or timed
    if overall:
        out += _iteration_rows("", overall[0])
    seen: set[str] = set()
    for stats in overall:
        if stats.label not in seen:
            seen.add(stats.label)
            out += _iteration_rows(stats.label, stats)
    per_window: dict[str, list[float]] = {}
    for summary in report.rank_summaries:
        steps = max(summary.steps, 1)
        acc = per_window.setdefault(summary.window, [0.0, 0.0, 0.0])
        acc[0] += summary.kernels / steps
        acc[1] += summary.gpu_busy_ns / steps / 1e6
        acc[2] += summary.span_ns / steps / 1e6
    for window, (kernels, busy_ms, span_ms) in per_window.items():
        out += [
            (Metric.KERNELS_PER_STEP, window, kernels),
            (Metric.GPU_BUSY_MS_PER_STEP, window, busy_ms),
            (Metric.SPAN_MS_PER_STEP, window, span_ms),
        ]
    return out


def _iteration_rows(label: str, stats: IterationStats) -> list[tuple[Metric, str, float]]:
    """The median and the run's own spread around it (p10/p90: the history's spread bars)."""
    return [
        (Metric.ITERATION_MEDIAN_MS, label, stats.median_ms),
        (Metric.ITERATION_P10_MS, label, stats.p10_ms),
        (Metric.ITERATION_P90_MS, label, stats.p90_ms),
    ]


def complete_analysis(
    conn: Conn, task: ClaimedTask, report: AnalysisReport, duration_s: float
) -> bool:
    """Store the report, its page summary and metrics; False when the task was taken away
    meanwhile."""
    page = (PAGE_SUMMARY_VERSION, page_summary(report).model_dump_json())  # outside the lock
    with transaction(conn):
        if not holds(conn, task):
            return False
        if not runs.run_exists(conn, run_id=task.run_id):
            return False  # deleted while analysing
        runs.record_report(
            conn,
            run_id=task.run_id,
            schema_version=report.schema_version,
            catalog_version=report.catalog_version,
            report_json=report.model_dump_json(),
            duration_s=duration_s,
            metrics=report_metrics(report),
            page=page,
        )
        finish_task(conn, task.id, task.run_id, status="analysed", error=None)
    return True


def requeue_stale_reports(conn: Conn) -> list[int]:
    """Queue runs whose stored report predates this ``REPORT_SCHEMA_VERSION`` (reports are
    re-analysed, never patched). Runs already queued or running are left alone."""
    with transaction(conn):
        stale = runs.runs_with_reports_older_than(conn, schema_version=REPORT_SCHEMA_VERSION)
        for run_id in stale:
            enqueue_analysis(conn, run_id)
    return stale


def task_inputs(conn: Conn, run_id: int) -> tuple[list[dict[str, Any]], Any]:
    """The trace files and the manifest of a run."""
    return runs.trace_files(conn, run_id=run_id), runs.manifest_json(conn, run_id=run_id)
