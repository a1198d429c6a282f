"""Runs stored before the failure verdict (migration m025) read ``failed`` after it, never
``clean``: the backfill reads each stored manifest's ``failure`` record once."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import sqlite_utils

from service.storage import runs
from service.storage.migrations import apply_migrations, migrations


def test_runs_stored_before_the_migration_get_their_failed_verdict(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "old.db")
    conn.row_factory = sqlite3.Row
    migrations.apply(sqlite_utils.Database(conn), stop_before="m025_run_job_failed")
    for name, manifest in (
        ("raised", {"run": {"name": "raised"}, "failure": {"summary": "rank 1 raised"}}),
        ("ended-well", {"run": {"name": "ended-well"}, "failure": None}),
        ("no-manifest", None),
    ):
        conn.execute(
            "INSERT INTO runs (name, source, status, manifest_json, created_at)"
            " VALUES (?, 'upload', 'analysed', ?, '2026-12-01')",
            (name, None if manifest is None else json.dumps(manifest)),
        )
        conn.execute(
            "INSERT INTO run_metrics (run_id, metric, label, value)"
            " VALUES (last_insert_rowid(), 'findings', '', 0)"
        )
    conn.commit()
    applied = apply_migrations(conn)
    assert applied[0] == "m025_run_job_failed" and "m025_run_job_failed" not in applied[1:]
    listed = runs.list_runs(conn, filters=runs.RunFilters(), limit=10, offset=0, sort="name")
    assert {r["name"]: r["verdict"] for r in listed} == {
        "raised": "failed", "ended-well": "clean", "no-manifest": "clean"}  # fmt: skip
    failed = runs.RunFilters(verdict="failed")
    assert runs.count_runs(conn, filters=failed) == 1
    new = runs.create_run(conn, name="new", source="upload", status="analysed",
                          manifest={"failure": {"summary": "hung"}})  # fmt: skip
    assert conn.execute("SELECT job_failed FROM runs WHERE id = ?", (new,)).fetchone()[0] == 1
