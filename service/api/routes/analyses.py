"""Analyses: status and result of a run's analysis, re-analysis, metric history."""

from __future__ import annotations

import tempfile
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from analyzers.report import AnalysisReport
from service.analysis import enqueue_analysis
from service.api.deps import AdminAccess, DbDep, ReadAccess, SettingsDep
from service.api.schemas import RunId
from service.core.errors import Conflict
from service.storage import runs
from service.storage.engine import Conn
from service.storage.runs import Metric
from service.store import (
    AnalysisStatus,
    HistoryPoint,
    get_analysis_status,
    metric_history,
)

router = APIRouter(tags=["analyses"])


@router.get("/runs/{run_id}/analysis", response_model=AnalysisStatus)
def read_analysis(run_id: RunId, db: DbDep, _: ReadAccess) -> AnalysisStatus:
    """Where the run's analysis stands: queued, running (with progress), done or failed."""
    return get_analysis_status(db, run_id)


REPORT_IN_MEMORY_BYTES = 1024 * 1024
"""A report up to this size is answered from memory; a larger one from a temp file."""


# the declared model documents the contract in /openapi.json; the body is the stored text
@router.get("/runs/{run_id}/analysis/result", response_model=AnalysisReport)
def read_analysis_result(
    run_id: RunId, db: DbDep, settings: SettingsDep, _: ReadAccess
) -> StreamingResponse:
    """The analysis report; 409 while the analysis has not finished.

    The stored text is streamed as it was stored (``AnalysisReport.model_dump_json()``): a
    100 MB report is never one string, a parsed model and a second string in memory. It is
    copied out of the database first (one short read; the largest in a temp file), so a slow
    client holds no database snapshot.
    """
    status = get_analysis_status(db, run_id)
    settings.tmp_dir.mkdir(parents=True, exist_ok=True)  # where a large report is spooled
    # closed by the response once sent (or here on an error): it outlives this function
    spool = tempfile.SpooledTemporaryFile(  # noqa: SIM115
        max_size=REPORT_IN_MEMORY_BYTES, mode="w+b", dir=str(settings.tmp_dir)
    )
    try:
        size = db.read(lambda c: runs.copy_report(c, run_id=run_id, into=spool))
    except BaseException:
        spool.close()
        raise
    if size is None:
        spool.close()
        detail = f": {status.error}" if status.error else ""
        raise Conflict(f"run {run_id} has no analysis result (analysis {status.status}){detail}")
    spool.seek(0)
    return StreamingResponse(
        iter(lambda: spool.read(runs.REPORT_CHUNK_BYTES), b""),
        media_type="application/json",
        headers={"Content-Length": str(size)},
        background=BackgroundTask(spool.close),
    )


@router.post("/runs/{run_id}/analysis", response_model=AnalysisStatus, status_code=202)
def reanalyse(run_id: RunId, db: DbDep, _: AdminAccess) -> AnalysisStatus:
    """Queue the run for analysis again (e.g. after a catalog update)."""

    def queue(conn: Conn) -> None:
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
