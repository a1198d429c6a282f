"""The runs tables, one module: every SQL statement on ``runs``, ``run_files``, ``run_metrics``,
``reports``, ``uploads`` and ``comparisons`` (the FastAPI template's ``crud.py``).

Functions take the connection they run on (writes: the caller's transaction, e.g. inside
``Database.write_tx`` or ``immediate``) and keyword-only arguments. The run list is filtered,
sorted and paged here in SQL, for the API (``GET /api/v1/runs``) and the pages (``/runs``) alike.
Metric names are the ``Metric`` enum, shared by the writer (``service.analysis``) and the readers
(``service.store``, ``web.data``).

Why plain SQL rather than sqlite-utils' ``insert``: sqlite-utils commits on its own
(``with conn:``), which would end the caller's ``BEGIN IMMEDIATE`` transaction half-way through an
upload or an analysis result; these statements must commit together.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, Field

from service.auth import now_iso
from service.core.errors import NotFound
from service.storage.database import rows


class Metric(StrEnum):
    """The per-run numbers stored in ``run_metrics`` (trend charts, the run list)."""

    FINDINGS = "findings"
    ITERATION_MEDIAN_MS = "iteration_median_ms"
    ITERATION_P10_MS = "iteration_p10_ms"
    ITERATION_P90_MS = "iteration_p90_ms"
    KERNELS_PER_STEP = "kernels_per_step"
    GPU_BUSY_MS_PER_STEP = "gpu_busy_ms_per_step"
    SPAN_MS_PER_STEP = "span_ms_per_step"


SPREAD_METRICS: dict[Metric, tuple[Metric, Metric]] = {
    Metric.ITERATION_MEDIAN_MS: (Metric.ITERATION_P10_MS, Metric.ITERATION_P90_MS)
}
"""metric -> the (low, high) metrics that give one run's own spread around it."""

Verdict = Literal["clean", "findings", "pending", "failed", "unknown"]
VERDICTS: tuple[Verdict, ...] = ("clean", "findings", "pending", "failed", "unknown")
SORT_KEYS = (
    "id", "name", "implementation", "config_key", "branch", "commit", "created_at", "verdict",
    "median_ms", "findings",
)  # fmt: skip


class RunFilters(BaseModel):
    """Filters of the run list; all optional, combined with AND."""

    status: str | None = None
    branch: str | None = None
    name: str | None = Field(default=None, description="substring of the run name")
    config_key: str | None = None
    commit: str | None = Field(default=None, description="prefix of the commit sha")
    implementation: str | None = Field(default=None, description="workload.implementation")
    verdict: Verdict | None = None
    date_from: str | None = Field(default=None, description="ISO date, inclusive")
    date_to: str | None = Field(default=None, description="ISO date, inclusive")


_METRIC = (
    "(SELECT value FROM run_metrics m WHERE m.run_id = r.id AND m.metric = '{}' AND m.label = '')"
)
_FINDINGS = _METRIC.format(Metric.FINDINGS.value)
_VERDICT = (
    "CASE WHEN r.status = 'failed' THEN 'failed' WHEN r.status != 'analysed' THEN 'pending' "
    f"WHEN {_FINDINGS} IS NULL THEN 'unknown' WHEN {_FINDINGS} > 0 THEN 'findings' "
    "ELSE 'clean' END"
)
_IMPLEMENTATION = (
    "CASE WHEN json_valid(r.manifest_json) "
    "THEN json_extract(r.manifest_json, '$.workload.implementation') END"
)
SUMMARY_COLUMNS = f"""
SELECT r.id, r.name, r.branch, r.commit_sha AS "commit", r.host, r.source, r.status, r.progress,
       r.error, r.config_key, r.created_at, r.updated_at,
       (SELECT count(*) FROM run_files f WHERE f.run_id = r.id AND f.role = 'trace') AS traces,
       {_FINDINGS} AS findings,
       {_METRIC.format(Metric.ITERATION_MEDIAN_MS.value)} AS median_ms,
       CAST({_IMPLEMENTATION} AS TEXT) AS implementation,
       {_VERDICT} AS verdict
"""
_SORT_SQL = {key: f"r.{key}" for key in ("id", "name", "config_key", "branch", "created_at")}
_SORT_SQL.update(commit="r.commit_sha", implementation=_IMPLEMENTATION, verdict=_VERDICT)
_SORT_SQL.update(median_ms=_METRIC.format(Metric.ITERATION_MEDIAN_MS.value), findings=_FINDINGS)


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _where(filters: RunFilters) -> tuple[str, list[Any]]:
    clauses: list[str] = []
    params: list[Any] = []
    for column, value in (
        ("r.status", filters.status),
        ("r.branch", filters.branch),
        ("r.config_key", filters.config_key),
        (_IMPLEMENTATION, filters.implementation),
        (_VERDICT, filters.verdict),
    ):
        if value:
            clauses.append(f"{column} = ?")
            params.append(value)
    if filters.name:
        clauses.append("instr(lower(r.name), lower(?)) > 0")
        params.append(filters.name)
    if filters.commit:
        clauses.append("r.commit_sha LIKE ? ESCAPE '\\'")
        params.append(_escape_like(filters.commit) + "%")
    if filters.date_from:
        clauses.append("substr(r.created_at, 1, 10) >= ?")
        params.append(filters.date_from)
    if filters.date_to:
        clauses.append("substr(r.created_at, 1, 10) <= ?")
        params.append(filters.date_to)
    return (" WHERE " + " AND ".join(clauses)) if clauses else "", params


def list_runs(
    conn: sqlite3.Connection,
    *,
    filters: RunFilters,
    limit: int,
    offset: int,
    sort: str = "id",
    order: Literal["asc", "desc"] = "desc",
) -> list[dict[str, Any]]:
    """One page of run summaries (``RunSummary`` fields); runs without the sort value last."""
    if sort not in _SORT_SQL:
        raise ValueError(f"sort must be one of {', '.join(SORT_KEYS)}; got {sort!r}")
    where, params = _where(filters)
    key = _SORT_SQL[sort]
    direction = "DESC" if order == "desc" else "ASC"
    tie = "" if sort == "id" else f", r.id {direction}"
    sql = (
        f"{SUMMARY_COLUMNS}FROM runs r{where} "
        f"ORDER BY ({key}) IS NULL, {key} {direction}{tie} LIMIT ? OFFSET ?"
    )
    found = rows(conn, sql, [*params, int(limit), int(offset)])
    for row in found:
        if row["findings"] is not None:  # metrics are stored as REAL
            row["findings"] = int(row["findings"])
    return found


def count_runs(conn: sqlite3.Connection, *, filters: RunFilters) -> int:
    """How many runs match ``filters``."""
    where, params = _where(filters)
    return int(conn.execute(f"SELECT count(*) FROM runs r{where}", params).fetchone()[0])


def distinct_values(conn: sqlite3.Connection, *, limit: int = 500) -> dict[str, list[str]]:
    """Values the run list's drop-downs offer, from the newest ``limit`` runs."""
    recent = (
        f"SELECT r.branch, r.config_key, r.status, CAST({_IMPLEMENTATION} AS TEXT) AS "
        f"implementation FROM runs r ORDER BY r.id DESC LIMIT ?"
    )
    found = rows(conn, recent, (limit,))
    return {
        field: sorted({str(row[field]) for row in found if row[field] is not None})
        for field in ("implementation", "config_key", "branch", "status")
    }


def require_run(conn: sqlite3.Connection, *, run_id: int) -> None:
    """:raises NotFound: no run ``run_id`` (the one "does this run exist" check)."""
    if conn.execute("SELECT 1 FROM runs WHERE id = ?", (run_id,)).fetchone() is None:
        raise NotFound(f"run {run_id} does not exist")


def has_traces(conn: sqlite3.Connection, *, run_id: int) -> bool:
    """True when the run has at least one trace file."""
    sql = "SELECT 1 FROM run_files WHERE run_id = ? AND role = 'trace'"
    return conn.execute(sql, (run_id,)).fetchone() is not None


def _dump(value: Any) -> str | None:
    return None if value is None else json.dumps(value, allow_nan=False)


def create_run(
    conn: sqlite3.Connection,
    *,
    name: str,
    source: str,
    status: str,
    branch: str | None = None,
    commit: str | None = None,
    host: str | None = None,
    config_key: str | None = None,
    manifest: dict[str, Any] | None = None,
    spec: dict[str, Any] | None = None,
) -> int:
    """Insert a run; returns its id. Run it inside the caller's transaction."""
    now = now_iso()
    cur = conn.execute(
        "INSERT INTO runs (name, branch, commit_sha, host, source, status, config_key, "
        "manifest_json, spec_json, created_at, updated_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
        (
            name, branch, commit, host, source, status, config_key, _dump(manifest),
            _dump(spec), now, now,
        ),
    )  # fmt: skip
    return int(cur.lastrowid or 0)


def add_run_file(
    conn: sqlite3.Connection,
    *,
    run_id: int,
    role: str,
    name: str,
    sha256: str,
    size: int,
    format: str | None = None,
    rank: int | None = None,
) -> None:
    """Attach a stored blob to a run (the blob row is created when new)."""
    conn.execute(
        "INSERT OR IGNORE INTO blobs (sha256, size, created_at) VALUES (?, ?, ?)",
        (sha256, size, now_iso()),
    )
    conn.execute(
        "INSERT INTO run_files (run_id, role, name, format, rank, sha256, size) "
        "VALUES (?,?,?,?,?,?,?)",
        (run_id, role, name, format, rank, sha256, size),
    )


def find_upload(conn: sqlite3.Connection, *, key: str) -> int | None:
    """The run an idempotency key created, or None."""
    row = conn.execute("SELECT run_id FROM uploads WHERE key = ?", (key,)).fetchone()
    return None if row is None else int(row[0])


def record_upload(conn: sqlite3.Connection, *, key: str, run_id: int) -> None:
    conn.execute(
        "INSERT INTO uploads (key, run_id, created_at) VALUES (?, ?, ?)", (key, run_id, now_iso())
    )


def delete_run(conn: sqlite3.Connection, *, run_id: int) -> None:
    """Delete a run with its files, report, metrics, tasks and comparisons (blobs stay: shared).

    :raises NotFound: no such run.
    """
    require_run(conn, run_id=run_id)
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


def record_report(
    conn: sqlite3.Connection,
    *,
    run_id: int,
    schema_version: int,
    catalog_version: str,
    report_json: str,
    duration_s: float,
    metrics: Iterable[tuple[Metric, str, float]],
) -> None:
    """Store a run's report and its metrics, replacing the previous ones; comparisons computed
    from the previous report are stale, so they go."""
    conn.execute(
        "INSERT OR REPLACE INTO reports (run_id, schema_version, catalog_version, report_json,"
        " duration_s, created_at) VALUES (?, ?, ?, ?, ?, ?)",
        (run_id, schema_version, catalog_version, report_json, duration_s, now_iso()),
    )
    conn.execute("DELETE FROM run_metrics WHERE run_id = ?", (run_id,))
    conn.executemany(
        "INSERT OR REPLACE INTO run_metrics (run_id, metric, label, value) VALUES (?,?,?,?)",
        [(run_id, metric.value, label, value) for metric, label, value in metrics],
    )
    conn.execute(
        "DELETE FROM comparisons WHERE base_run_id = ? OR head_run_id = ?", (run_id, run_id)
    )


def store_comparison(
    conn: sqlite3.Connection,
    *,
    base_run_id: int,
    head_run_id: int,
    base_window: str | None,
    head_window: str | None,
    verdict: str,
    summary: str,
    report_json: str,
) -> None:
    """Store a comparison once (an identical one stored meanwhile wins)."""
    conn.execute(
        "INSERT OR IGNORE INTO comparisons (base_run_id, head_run_id, base_window, "
        "head_window, verdict, summary, report_json, created_at) VALUES (?,?,?,?,?,?,?,?)",
        (
            base_run_id, head_run_id, base_window or "", head_window or "", verdict, summary,
            report_json, now_iso(),
        ),
    )  # fmt: skip
