"""Runs: create, list with filters and paging, detail, delete."""

from __future__ import annotations

import json
import sqlite3
from typing import Annotated

from fastapi import APIRouter, Query

from service.api.deps import AdminAccess, DbDep, ReadAccess, RunnerAccess, SettingsDep
from service.api.schemas import Offset, OkBody, RunCreate, RunId, RunPage
from service.auth import now_iso
from service.core.errors import NotFound
from service.ingest import config_key
from service.store import RunDetail, RunFilters, RunSummary, count_runs, get_run, list_runs

router = APIRouter(prefix="/runs", tags=["runs"])


@router.post("", response_model=RunSummary, status_code=201)
def create_run(body: RunCreate, db: DbDep, _: RunnerAccess) -> RunSummary:
    """Create an empty run; add traces with `POST /uploads/traces?run_id=`."""
    if body.manifest is not None:
        from analyzers.manifest import parse_manifest

        parse_manifest(body.manifest, source="manifest")  # ManifestError -> 422

    def insert(conn: sqlite3.Connection) -> int:
        now = now_iso()
        cur = conn.execute(
            "INSERT INTO runs (name, branch, commit_sha, host, source, status, config_key, "
            "manifest_json, created_at, updated_at) VALUES (?,?,?,?, 'api', 'empty', ?,?,?,?)",
            (
                body.name,
                body.branch,
                body.commit,
                body.host,
                config_key(body.manifest),
                json.dumps(body.manifest) if body.manifest is not None else None,
                now,
                now,
            ),
        )
        return int(cur.lastrowid or 0)

    return get_run(db, db.write_tx(insert), include_report=False)


@router.get("", response_model=RunPage)
def read_runs(
    db: DbDep,
    settings: SettingsDep,
    _: ReadAccess,
    filters: Annotated[RunFilters, Query()],
    limit: Annotated[int, Query(ge=1)] = 50,
    offset: Offset = 0,
) -> RunPage:
    """Runs, newest first, filtered by status, branch, name, config key or commit prefix."""
    limit = min(limit, settings.max_page_size)
    items = list_runs(db, filters=filters, limit=limit, offset=offset)
    return RunPage(items=items, total=count_runs(db, filters=filters), limit=limit, offset=offset)


@router.get("/{run_id}", response_model=RunDetail)
def read_run(run_id: RunId, db: DbDep, _: ReadAccess) -> RunDetail:
    """One run: files, manifest, analysis status (the report is at `.../analysis/result`)."""
    return get_run(db, run_id, include_report=False)


@router.delete("/{run_id}", response_model=OkBody)
def delete_run(run_id: RunId, db: DbDep, _: AdminAccess) -> OkBody:
    """Delete a run with its files, report, metrics and comparisons (blobs stay: shared)."""

    def delete(conn: sqlite3.Connection) -> None:
        if conn.execute("SELECT id FROM runs WHERE id = ?", (run_id,)).fetchone() is None:
            raise NotFound(f"run {run_id} does not exist")
        for sql in (
            "DELETE FROM comparisons WHERE base_run_id = ?1 OR head_run_id = ?1",
            "DELETE FROM run_metrics WHERE run_id = ?1",
            "DELETE FROM reports WHERE run_id = ?1",
            "DELETE FROM analysis_tasks WHERE run_id = ?1",
            "DELETE FROM uploads WHERE run_id = ?1",
            "DELETE FROM run_files WHERE run_id = ?1",
            "UPDATE jobs SET run_id = NULL WHERE run_id = ?1",
            "DELETE FROM runs WHERE id = ?1",
        ):
            conn.execute(sql, (run_id,))

    db.write_tx(delete)
    return OkBody()
