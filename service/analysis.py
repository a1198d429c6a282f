"""Analysis tasks: a queue table the worker process drains, with leases like the job queue.

The API only inserts tasks (``enqueue_analysis``); the worker claims one inside
``BEGIN IMMEDIATE``, analyses it off the request path, and records the report, the metrics the
trend charts use, and progress/errors on the run. A worker killed mid-analysis leaves a running
task whose lease expires; the next claim requeues it (bounded attempts, then the run fails with
the reason).
"""

from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass
from typing import Any

from analyzers.report import REPORT_SCHEMA_VERSION, AnalysisReport, IterationStats
from service.auth import now_iso
from service.page_summary import PAGE_SUMMARY_VERSION, page_summary
from service.storage import runs
from service.storage.database import immediate, one
from service.storage.runs import Metric


def enqueue_analysis(conn: sqlite3.Connection, run_id: int) -> int:
    """Queue an analysis of ``run_id`` (call inside the caller's transaction)."""
    now = now_iso()
    conn.execute(
        "UPDATE analysis_tasks SET status = 'superseded', updated_at = ? "
        "WHERE run_id = ? AND status = 'queued'",
        (now, run_id),
    )
    cur = conn.execute(
        "INSERT INTO analysis_tasks (run_id, status, attempts, created_at, updated_at) "
        "VALUES (?, 'queued', 0, ?, ?)",
        (run_id, now, now),
    )
    runs.set_run_state(
        conn, run_id=run_id, status="queued", progress="queued for analysis", error=None
    )
    return int(cur.lastrowid or 0)


@dataclass(frozen=True, slots=True)
class ClaimedTask:
    """A task this worker holds until ``lease_expires_at``."""

    id: int
    run_id: int
    attempt: int


def _expire_leases(conn: sqlite3.Connection, now: float, max_attempts: int) -> None:
    stale = conn.execute(
        "SELECT id, run_id, attempts FROM analysis_tasks WHERE status = 'running' "
        "AND lease_expires_at < ?",
        (now,),
    ).fetchall()
    for task_id, run_id, attempts in stale:
        if attempts >= max_attempts:
            reason = (
                f"analysis worker lost its lease {attempts} time(s) (killed or hung); giving up"
            )
            _finish(conn, task_id, run_id, status="failed", error=reason)
        else:
            conn.execute(
                "UPDATE analysis_tasks SET status = 'queued', updated_at = ? WHERE id = ?",
                (now_iso(), task_id),
            )
            runs.set_run_state(
                conn,
                run_id=run_id,
                status="queued",
                progress="requeued after a lost worker",
                touch=False,
            )


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def expire_orphaned_leases(conn: sqlite3.Connection, *, host: str) -> list[int]:
    """End now the leases of running tasks whose worker (``host:pid``) was on this host and
    is gone (a SIGKILLed API takes its worker along): the next claim requeues them at once
    instead of after the whole lease. Returns the task ids; other hosts' tasks keep theirs.
    """
    with immediate(conn):
        running = conn.execute(
            "SELECT id, worker FROM analysis_tasks WHERE status = 'running'"
        ).fetchall()
        gone = []
        for task_id, worker in running:
            name, sep, pid = str(worker or "").rpartition(":")
            if sep and name == host and pid.isdigit() and not _pid_alive(int(pid)):
                gone.append(int(task_id))
        for task_id in gone:
            conn.execute(
                "UPDATE analysis_tasks SET lease_expires_at = 0 WHERE id = ?", (task_id,)
            )
    return gone


def claim_analysis(
    conn: sqlite3.Connection, *, worker: str, lease_s: float, max_attempts: int
) -> ClaimedTask | None:
    """Take the oldest queued task (conditional update inside ``BEGIN IMMEDIATE``)."""
    now = time.time()
    with immediate(conn):
        _expire_leases(conn, now, max_attempts)
        row = one(
            conn,
            "SELECT id, run_id, attempts FROM analysis_tasks WHERE status = 'queued' "
            "ORDER BY id LIMIT 1",
        )
        if row is None:
            return None
        cur = conn.execute(
            "UPDATE analysis_tasks SET status = 'running', attempts = attempts + 1, worker = ?, "
            "lease_expires_at = ?, updated_at = ? WHERE id = ? AND status = 'queued'",
            (worker, now + lease_s, now_iso(), row["id"]),
        )
        if cur.rowcount != 1:
            return None
        runs.set_run_state(
            conn, run_id=row["run_id"], status="analysing", progress="starting", error=None
        )
    return ClaimedTask(row["id"], row["run_id"], row["attempts"] + 1)


def record_progress(
    conn: sqlite3.Connection, task: ClaimedTask, message: str, *, lease_s: float
) -> None:
    """Show progress on the run and extend the task's lease (it is alive)."""
    with immediate(conn):
        conn.execute(
            "UPDATE analysis_tasks SET lease_expires_at = ?, updated_at = ? "
            "WHERE id = ? AND status = 'running'",
            (time.time() + lease_s, now_iso(), task.id),
        )
        runs.set_run_state(
            conn, run_id=task.run_id, progress=message[:500], only_if_status="analysing"
        )


def _finish(
    conn: sqlite3.Connection, task_id: int, run_id: int, *, status: str, error: str | None
) -> None:
    now = now_iso()
    conn.execute(
        "UPDATE analysis_tasks SET status = ?, error = ?, lease_expires_at = NULL, updated_at = ? "
        "WHERE id = ?",
        ("done" if status == "analysed" else status, error, now, task_id),
    )
    runs.set_run_state(
        conn,
        run_id=run_id,
        status=status,
        error=error,
        progress="done" if status == "analysed" else "failed",
    )


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
    conn: sqlite3.Connection, task: ClaimedTask, report: AnalysisReport, duration_s: float
) -> bool:
    """Store the report, its page summary and metrics; False when the task was taken away
    meanwhile."""
    page = (PAGE_SUMMARY_VERSION, page_summary(report).model_dump_json())  # outside the lock
    with immediate(conn):
        held = one(conn, "SELECT status FROM analysis_tasks WHERE id = ?", (task.id,))
        if held is None or held["status"] != "running":
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
        _finish(conn, task.id, task.run_id, status="analysed", error=None)
    return True


def fail_analysis(conn: sqlite3.Connection, task: ClaimedTask, error: str) -> None:
    """Record why the analysis failed (bad input is final: no retry)."""
    with immediate(conn):
        _finish(conn, task.id, task.run_id, status="failed", error=error[:4000])


def requeue_stale_reports(conn: sqlite3.Connection) -> list[int]:
    """Queue runs whose stored report predates this ``REPORT_SCHEMA_VERSION`` (reports are
    re-analysed, never patched). Runs already queued or running are left alone."""
    with immediate(conn):
        stale = runs.runs_with_reports_older_than(conn, schema_version=REPORT_SCHEMA_VERSION)
        for run_id in stale:
            enqueue_analysis(conn, run_id)
    return stale


def requeue_analysis(conn: sqlite3.Connection, task: ClaimedTask, error: str) -> None:
    """Put a task back after an internal error (its attempt stays counted)."""
    with immediate(conn):
        conn.execute(
            "UPDATE analysis_tasks SET status = 'queued', error = ?, lease_expires_at = NULL, "
            "updated_at = ? WHERE id = ? AND status = 'running'",
            (error[:4000], now_iso(), task.id),
        )
        runs.set_run_state(
            conn,
            run_id=task.run_id,
            status="queued",
            progress="retrying after an internal error",
            error=error[:4000],
        )


def task_inputs(conn: sqlite3.Connection, run_id: int) -> tuple[list[dict[str, Any]], Any]:
    """The trace files and the manifest of a run."""
    return runs.trace_files(conn, run_id=run_id), runs.manifest_json(conn, run_id=run_id)
