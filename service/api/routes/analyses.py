"""Analyses: status and result of a run's analysis, re-analysis, metric history."""

from __future__ import annotations

import sqlite3
from typing import Annotated, Any

from fastapi import APIRouter, Query

from analyzers.report import AnalysisReport
from service.analysis import enqueue_analysis
from service.api.deps import AdminAccess, DbDep, ReadAccess
from service.api.schemas import RunId
from service.core.errors import Conflict
from service.storage import runs
from service.storage.runs import Metric
from service.store import (
    AnalysisStatus,
    HistoryPoint,
    get_analysis_status,
    get_report,
    metric_history,
)

router = APIRouter(tags=["analyses"])


@router.get("/runs/{run_id}/analysis", response_model=AnalysisStatus)
def read_analysis(run_id: RunId, db: DbDep, _: ReadAccess) -> AnalysisStatus:
    """Where the run's analysis stands: queued, running (with progress), done or failed."""
    return get_analysis_status(db, run_id)


@router.get("/runs/{run_id}/analysis/result", response_model=AnalysisReport)
def read_analysis_result(run_id: RunId, db: DbDep, _: ReadAccess) -> Any:
    """The analysis report; 409 while the analysis has not finished."""
    status = get_analysis_status(db, run_id)
    report = get_report(db, run_id)
    if report is None:
        detail = f": {status.error}" if status.error else ""
        raise Conflict(f"run {run_id} has no analysis result (analysis {status.status}){detail}")
    return report


@router.post("/runs/{run_id}/analysis", response_model=AnalysisStatus, status_code=202)
def reanalyse(run_id: RunId, db: DbDep, _: AdminAccess) -> AnalysisStatus:
    """Queue the run for analysis again (e.g. after a catalog update)."""

    def queue(conn: sqlite3.Connection) -> None:
        runs.require_run(conn, run_id=run_id)
        if not runs.has_traces(conn, run_id=run_id):
            raise Conflict(f"run {run_id} has no traces to analyse")
        enqueue_analysis(conn, run_id)

    db.write_tx(queue)
    return get_analysis_status(db, run_id)


@router.get("/metrics/history", response_model=list[HistoryPoint])
def read_history(
    db: DbDep,
    _: ReadAccess,
    config_key: Annotated[str, Query(max_length=64)],
    metric: Annotated[Metric | str, Query(max_length=100)] = Metric.ITERATION_MEDIAN_MS,
    label: Annotated[str | None, Query(max_length=200)] = None,
) -> list[HistoryPoint]:
    """One metric across the runs of one workload configuration, oldest first."""
    return metric_history(db, config_key=config_key, metric=metric, label=label)
