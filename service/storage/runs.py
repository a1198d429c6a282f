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
import secrets
import sqlite3
from collections.abc import Iterable
from enum import StrEnum
from typing import IO, Any, Literal

import sqlalchemy as sa
from pydantic import BaseModel, Field

from service.auth import now_iso
from service.core.errors import NotFound, PayloadTooLarge
from service.storage import schema
from service.storage.database import rows
from service.storage.engine import Conn, execute


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
    repo: str | None = Field(default=None, description="the loop's repository tag (owner/name)")
    pr: int | None = Field(default=None, ge=1, le=2**31, description="the pull request tag")
    suite: str | None = Field(default=None, description="the loop's suite tag")


# One row per run: the two metrics the list shows are joined once (primary-key lookups), so the
# verdict reuses the findings value instead of running its subquery again.
SUMMARY_FROM = (
    " FROM runs r"
    " LEFT JOIN run_metrics fm ON fm.run_id = r.id AND fm.metric = 'findings' AND fm.label = ''"
    " LEFT JOIN run_metrics mm ON mm.run_id = r.id AND mm.metric = 'iteration_median_ms'"
    " AND mm.label = ''"
)
# A run whose job failed or hung (its manifest has a ``failure`` record) is ``failed`` whatever
# its analysis found: traces of the steps before the failure must never make it look clean.
# Stored at insert (``create_run``; migration m025 filled it for older runs), so the verdict
# reads no manifest: the run list's count and sort stay on the runs table's own pages.
_JOB_FAILED = "r.job_failed = 1"
_VERDICT = (
    f"CASE WHEN r.status = 'failed' OR {_JOB_FAILED} THEN 'failed' "
    "WHEN r.status != 'analysed' THEN 'pending' "
    "WHEN fm.value IS NULL THEN 'unknown' WHEN fm.value > 0 THEN 'findings' ELSE 'clean' END"
)
_IMPLEMENTATION = "r.implementation"
# The manifest facts the list, its filters, the history and the loop read are columns, stored
# at insert (``create_run`` with :func:`manifest_columns`; migration m041 filled them for older
# runs): no read parses a manifest (an 8 MB manifest string cut the run list from 614 to 50
# req/s when every listed row ran json_extract over it).
_TAG_COLUMNS: dict[str, type] = {"repo": str, "pr": int, "suite": str, "spec_name": str}


def _implementations(workload: object, variants: object) -> str | None:
    """The distinct implementations of a run's variants (the run's own without variants), e.g.
    "te, te-adapter": the history's series split runs of one configuration by it."""
    own = workload.get("implementation") if isinstance(workload, dict) else None
    found = {
        (v.get("workload") or {}).get("implementation") or own
        for v in (variants if isinstance(variants, list) else [])
        if isinstance(v, dict) and isinstance(v.get("workload") or {}, dict)
    } or {own}
    names = sorted(str(i) for i in found if i)
    return ", ".join(names) or None


def _scalar_text(value: object) -> str | None:
    """A manifest value as the run list shows it: text as is, a number as its digits."""
    if isinstance(value, bool) or value is None or isinstance(value, dict | list):
        return None
    return str(value)


def manifest_columns(manifest: object) -> dict[str, Any]:
    """The ``runs`` columns taken from a manifest: the workload's implementation, the
    variants' implementations and the workload block (the history), and the loop's tags from
    the ``run`` block (``cptrace agent``), each None unless of its type."""
    data = manifest if isinstance(manifest, dict) else {}
    workload = data.get("workload")
    block = data.get("run")
    run: dict[str, Any] = block if isinstance(block, dict) else {}
    out: dict[str, Any] = {
        "implementation": _scalar_text(workload.get("implementation"))
        if isinstance(workload, dict)
        else None,
        "implementations": _implementations(workload, data.get("variants")),
        "workload_json": _dump(workload) if isinstance(workload, dict) else None,
    }
    for key, kind in {**_TAG_COLUMNS, "entry_key": str}.items():
        value = run.get(key)
        out[key] = value if isinstance(value, kind) and not isinstance(value, bool) else None
    caveat = run.get("caveat")
    out["caveat"] = caveat if isinstance(caveat, str) else None  # what the history badges
    return out


SUMMARY_COLUMNS = f"""
SELECT r.id, r.name, r.branch, r.commit_sha AS "commit", r.host, r.source, r.status, r.progress,
       r.error, r.config_key, r.created_at, r.updated_at,
       (SELECT count(*) FROM run_files f WHERE f.run_id = r.id AND f.role = 'trace') AS traces,
       fm.value AS findings, mm.value AS median_ms, r.implementation, {_VERDICT} AS verdict,
       r.repo, r.pr, r.suite, r.spec_name"""
"""The ``RunSummary`` columns; append ``SUMMARY_FROM`` (and any extra columns before it)."""


def summary_fields(row: dict[str, Any]) -> dict[str, Any]:
    """A ``SUMMARY_COLUMNS`` row as ``RunSummary`` fields: findings as an int (metrics are
    REAL)."""
    if row["findings"] is not None:
        row["findings"] = int(row["findings"])
    return row


_SORT_SQL = {key: f"r.{key}" for key in ("id", "name", "config_key", "branch", "created_at")}
_SORT_SQL.update(commit="r.commit_sha", implementation=_IMPLEMENTATION, verdict=_VERDICT)
_SORT_SQL.update(median_ms="mm.value", findings="fm.value")


MAX_ROWS = 2**53 - 1
"""Any limit or offset past it means "past the end": SQLite's INTEGER is 64-bit, callers' ints
are not (a page number of 2^63 from a URL)."""


def page_bounds(limit: int, offset: int) -> tuple[int, int]:
    """``LIMIT`` and ``OFFSET`` values SQLite can bind, same answer: clamped to ``MAX_ROWS``."""
    return max(0, min(int(limit), MAX_ROWS)), max(0, min(int(offset), MAX_ROWS))


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
        ("r.repo", filters.repo),
        ("r.pr", filters.pr),
        ("r.suite", filters.suite),
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
    # By id (the API's and the default order) the rowid order serves it with no sort step: only
    # the page's rows are computed. Other keys sort, runs without the value last.
    order_by = (
        f"r.id {direction}"
        if sort == "id"
        else f"({key}) IS NULL, {key} {direction}, r.id {direction}"
    )
    sql = f"{SUMMARY_COLUMNS}{SUMMARY_FROM}{where} ORDER BY {order_by} LIMIT ? OFFSET ?"
    return [summary_fields(r) for r in rows(conn, sql, [*params, *page_bounds(limit, offset)])]


def summaries_by_id(conn: sqlite3.Connection, *, run_ids: Iterable[int]) -> list[dict[str, Any]]:
    """The ``RunSummary`` rows of these runs (the loop's pages: a batch's or a job's runs)."""
    ids = sorted({int(i) for i in run_ids})
    if not ids:
        return []
    marks = ", ".join("?" * len(ids))
    found = rows(conn, f"{SUMMARY_COLUMNS}{SUMMARY_FROM} WHERE r.id IN ({marks})", ids)
    return [summary_fields(r) for r in found]


def count_runs(conn: sqlite3.Connection, *, filters: RunFilters) -> int:
    """How many runs match ``filters``."""
    where, params = _where(filters)
    source = SUMMARY_FROM if filters.verdict else " FROM runs r"  # only the verdict needs fm
    return int(conn.execute(f"SELECT count(*){source}{where}", params).fetchone()[0])


def distinct_values(conn: sqlite3.Connection, *, limit: int = 500) -> dict[str, list[str]]:
    """Values the run list's drop-downs offer, from the newest ``limit`` runs."""
    recent = (
        f"SELECT r.branch, r.config_key, r.status, {_IMPLEMENTATION} AS implementation "
        "FROM runs r ORDER BY r.id DESC LIMIT ?"
    )
    found = rows(conn, recent, (limit,))
    return {
        field: sorted({str(row[field]) for row in found if row[field] is not None})
        for field in ("implementation", "config_key", "branch", "status")
    }


def summary_with_texts(conn: sqlite3.Connection, *, run_id: int) -> dict[str, Any] | None:
    """One run's summary columns plus its stored ``manifest_json`` and ``spec_json`` texts."""
    found = rows(
        conn,
        f"{SUMMARY_COLUMNS}, r.manifest_json, r.spec_json{SUMMARY_FROM} WHERE r.id = ?",
        (run_id,),
    )
    return summary_fields(found[0]) if found else None


def run_files(conn: sqlite3.Connection, *, run_id: int) -> list[dict[str, Any]]:
    """All files of a run (``RunFile`` fields), in upload order."""
    return rows(
        conn,
        "SELECT id, role, name, format, rank, sha256, size FROM run_files WHERE run_id = ? "
        "ORDER BY id",
        (run_id,),
    )


def window_groups(conn: sqlite3.Connection, *, run_id: int) -> list[str]:
    """The window groups the run's report measured (those with per-step metrics)."""
    sql = "SELECT DISTINCT label FROM run_metrics WHERE run_id = ? AND metric = ? ORDER BY label"
    return [r[0] for r in conn.execute(sql, (run_id, Metric.GPU_BUSY_MS_PER_STEP.value))]


def analysis_facts(conn: sqlite3.Connection, *, run_id: int) -> dict[str, Any]:
    """The latest analysis task, the run's progress/error and the report's duration."""
    task = rows(
        conn,
        "SELECT status, attempts, error, updated_at FROM analysis_tasks WHERE run_id = ? "
        "ORDER BY id DESC LIMIT 1",
        (run_id,),
    )
    run = rows(conn, "SELECT progress, error, analysis_s FROM runs WHERE id = ?", (run_id,))
    # the report row's key only: its later columns sit behind the report's overflow pages
    has_report = conn.execute("SELECT 1 FROM reports WHERE run_id = ?", (run_id,)).fetchone()
    return {
        "task": task[0] if task else None,
        "run": run[0] if run else {},
        "duration_s": run[0]["analysis_s"] if run and has_report else None,
        "has_report": has_report is not None,
    }


def report_json(conn: sqlite3.Connection, *, run_id: int) -> str | None:
    """The stored report text of a run, or None."""
    row = conn.execute("SELECT report_json FROM reports WHERE run_id = ?", (run_id,)).fetchone()
    return None if row is None else str(row[0])


REPORT_CHUNK_BYTES = 256 * 1024


def copy_report(conn: sqlite3.Connection, *, run_id: int, into: IO[bytes]) -> int | None:
    """Write the stored report text of a run (UTF-8) into ``into``, 256 KiB at a time through
    SQLite's incremental blob reads, never the whole text in memory; its size in bytes, or
    None when the run has no report. ``reports.run_id`` is the table's rowid."""
    try:
        blob = conn.blobopen("reports", "report_json", run_id, readonly=True)
    except sqlite3.OperationalError:  # "no such rowid": no report
        return None
    with blob:
        while chunk := blob.read(REPORT_CHUNK_BYTES):
            into.write(chunk)
        return len(blob)


def page_stamp(conn: sqlite3.Connection, *, run_id: int) -> tuple[int, str] | None:
    """``(version, stamp)`` of the run's stored page summary, read without its text (the stamp
    is new at every write), or None."""
    row = conn.execute("SELECT version, stamp FROM run_pages WHERE run_id = ?", (run_id,))
    found = row.fetchone()
    return None if found is None else (int(found[0]), str(found[1]))


def page_json(conn: sqlite3.Connection, *, run_id: int) -> tuple[int, str, str] | None:
    """The run's stored page summary ``(version, stamp, JSON)``, or None."""
    row = conn.execute(
        "SELECT version, stamp, page_json FROM run_pages WHERE run_id = ?", (run_id,)
    ).fetchone()
    return None if row is None else (int(row[0]), str(row[1]), str(row[2]))


def store_page(
    conn: sqlite3.Connection,
    *,
    run_id: int,
    version: int,
    page_json: str,
    if_stale: bool = False,
    unreadable: str | None = None,
) -> None:
    """Store (or replace) the run's page summary. ``if_stale``: only while the run has a report
    and no summary of ``version`` other than ``unreadable`` (a page view's build never replaces
    what a newer analysis stored meanwhile, nor outlives a deleted run)."""
    keep = (
        " WHERE run_pages.version != excluded.version OR run_pages.page_json IS ?5"
        if if_stale
        else ""
    )
    exists = "EXISTS (SELECT 1 FROM reports WHERE run_id = ?1)" if if_stale else "true"
    conn.execute(
        "INSERT INTO run_pages (run_id, version, page_json, created_at, stamp)"
        f" SELECT ?1, ?2, ?3, ?4, ?{6 if if_stale else 5} WHERE {exists}"
        " ON CONFLICT(run_id) DO UPDATE SET version = excluded.version, page_json ="
        f" excluded.page_json, created_at = excluded.created_at, stamp = excluded.stamp{keep}",
        (
            run_id, version, page_json, now_iso(), *([unreadable] if if_stale else []),
            secrets.token_hex(8),
        ),
    )  # fmt: skip


def find_comparison(
    conn: sqlite3.Connection,
    *,
    base_run_id: int,
    head_run_id: int,
    base_window: str | None,
    head_window: str | None,
) -> dict[str, Any] | None:
    """The stored comparison row of exactly these runs and windows, or None."""
    found = rows(
        conn,
        "SELECT * FROM comparisons WHERE base_run_id = ? AND head_run_id = ? AND "
        "base_window = ? AND head_window = ?",
        (base_run_id, head_run_id, base_window or "", head_window or ""),
    )
    return found[0] if found else None


def comparison_by_id(conn: sqlite3.Connection, *, comparison_id: int) -> dict[str, Any] | None:
    found = rows(conn, "SELECT * FROM comparisons WHERE id = ?", (comparison_id,))
    return found[0] if found else None


def list_comparisons(
    conn: sqlite3.Connection, *, run_id: int | None, limit: int, offset: int
) -> list[dict[str, Any]]:
    """Stored comparisons (without their reports), newest first."""
    where, params = "", []
    if run_id is not None:
        where, params = " WHERE base_run_id = ? OR head_run_id = ?", [run_id, run_id]
    sql = (
        "SELECT id, base_run_id, head_run_id, base_window, head_window, verdict, summary, "
        f"created_at FROM comparisons{where} ORDER BY id DESC LIMIT ? OFFSET ?"
    )
    return rows(conn, sql, [*params, *page_bounds(limit, offset)])


def metric_history(
    conn: sqlite3.Connection, *, config_key: str, metric: str, label: str | None, limit: int
) -> list[dict[str, Any]]:
    """One metric across the runs of one configuration (``HistoryPoint`` fields, the workload
    as JSON text), oldest first."""
    sql = (
        'SELECT m.run_id, r.created_at, r.name, r.branch, r.commit_sha AS "commit", m.label, '
        f"m.value, (r.status = 'failed' OR {_JOB_FAILED}) AS failed, "
        "r.implementations AS implementation, r.workload_json, r.caveat "
        "FROM run_metrics m JOIN runs r ON r.id = m.run_id "
        "WHERE r.config_key = ? AND m.metric = ?"
    )
    params: list[Any] = [config_key, metric]
    if label is not None:
        sql += " AND m.label = ?"
        params.append(label)
    sql += " ORDER BY r.id LIMIT ?"
    params.append(limit)
    return rows(conn, sql, params)


def set_manifest_columns(conn: sqlite3.Connection, *, run_id: int, manifest: object) -> None:
    """Fill the run's :func:`manifest_columns` from ``manifest`` (a run inserted without them:
    migration m041's backfill)."""
    facts = manifest_columns(manifest)
    sets = ", ".join(f"{column} = ?" for column in facts)
    conn.execute(f"UPDATE runs SET {sets} WHERE id = ?", (*facts.values(), run_id))


def require_run(conn: Conn, *, run_id: int) -> None:
    """:raises NotFound: no run ``run_id`` (the one "does this run exist" check)."""
    if not run_exists(conn, run_id=run_id):
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
    facts = manifest_columns(manifest)
    cur = conn.execute(
        "INSERT INTO runs (name, branch, commit_sha, host, source, status, config_key, "
        f"manifest_json, spec_json, created_at, updated_at, job_failed, {', '.join(facts)})"
        f" VALUES (?,?,?,?,?,?,?,?,?,?,?,?{',?' * len(facts)})",
        (
            name, branch, commit, host, source, status, config_key, _dump(manifest),
            _dump(spec), now, now, int(isinstance((manifest or {}).get("failure"), dict)),
            *facts.values(),
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


def record_upload(
    conn: sqlite3.Connection,
    *,
    key: str,
    run_id: int,
    token_id: int | None = None,
    quota: int | None = None,
) -> None:
    """Remember the upload ``key`` made ``run_id``, sent with token ``token_id``.

    ``quota``: the most bytes the token's runs may store (``stored_bytes_of_token``), checked
    after the upload's files were inserted, in the caller's write transaction: two uploads
    that each passed the check made before their bodies were read cannot both commit past it.

    :raises PayloadTooLarge: the token's runs would store more than ``quota`` (the caller's
        transaction must roll back).
    """
    conn.execute(
        "INSERT INTO uploads (key, run_id, created_at, token_id) VALUES (?, ?, ?, ?)",
        (key, run_id, now_iso(), token_id),
    )
    if quota is None or token_id is None:
        return
    stored = stored_bytes_of_token(conn, token_id=token_id)
    if stored > quota:
        raise PayloadTooLarge(
            f"this upload would make this token's runs store {stored} bytes, over its quota "
            f"of {quota} (CPTRACE_TOKEN_STORED_QUOTA_BYTES); nothing was stored; delete runs "
            "to upload more"
        )


def uploaded_by(conn: Conn, *, run_id: int, token_id: int) -> bool:
    """Whether token ``token_id`` uploaded (some of) run ``run_id``."""
    u = schema.uploads
    query = sa.select(u.c.key).where(u.c.run_id == run_id, u.c.token_id == token_id).limit(1)
    return execute(conn, query).first() is not None


def stored_bytes_of_token(conn: sqlite3.Connection, *, token_id: int) -> int:
    """Bytes the runs token ``token_id`` uploaded (some of) hold: the sizes of their files, a
    file shared by two runs counted in each (what the token's stored-bytes quota counts)."""
    sql = (
        "SELECT COALESCE(SUM(size), 0) FROM run_files WHERE run_id IN "
        "(SELECT run_id FROM uploads WHERE token_id = ?)"
    )
    return int(conn.execute(sql, (token_id,)).fetchone()[0])


def run_job(conn: Conn, *, run_id: int) -> int | None:
    """The job that produced ``run_id``, if one did."""
    t = schema.runs
    found = execute(conn, sa.select(t.c.job_id).where(t.c.id == run_id)).scalar()
    return None if found is None else int(found)


def blob_recorded(conn: sqlite3.Connection, *, digest: str) -> bool:
    """Whether a ``blobs`` row holds ``digest`` (a blob some committed upload stored)."""
    return conn.execute("SELECT 1 FROM blobs WHERE sha256 = ?", (digest,)).fetchone() is not None


def delete_run(conn: sqlite3.Connection, *, run_id: int) -> list[str]:
    """Delete a run with its files, report, metrics, tasks and comparisons, and the rows of the
    blobs no other run refers to (shared blobs stay). Returns those blobs' digests: the caller
    removes their files once the transaction committed.

    :raises NotFound: no such run.
    """
    require_run(conn, run_id=run_id)
    digests = [
        str(r[0])
        for r in conn.execute("SELECT DISTINCT sha256 FROM run_files WHERE run_id = ?", (run_id,))
    ]
    for sql in (
        "DELETE FROM comparisons WHERE base_run_id = ?1 OR head_run_id = ?1",
        "DELETE FROM run_metrics WHERE run_id = ?1",
        "DELETE FROM reports WHERE run_id = ?1",
        "DELETE FROM run_pages WHERE run_id = ?1",
        "DELETE FROM analysis_tasks WHERE run_id = ?1",
        "DELETE FROM uploads WHERE run_id = ?1",
        "DELETE FROM run_files WHERE run_id = ?1",
        "UPDATE jobs SET run_id = NULL WHERE run_id = ?1",
        "DELETE FROM runs WHERE id = ?1",
    ):
        conn.execute(sql, (run_id,))
    unreferenced = [
        d
        for d in digests
        if conn.execute("SELECT 1 FROM run_files WHERE sha256 = ? LIMIT 1", (d,)).fetchone() is None
    ]
    for digest in unreferenced:
        conn.execute("DELETE FROM blobs WHERE sha256 = ?", (digest,))
    return unreferenced


def record_report(
    conn: sqlite3.Connection,
    *,
    run_id: int,
    schema_version: int,
    catalog_version: str,
    report_json: str,
    duration_s: float,
    metrics: Iterable[tuple[Metric, str, float]],
    page: tuple[int, str] | None = None,
) -> None:
    """Store a run's report and its metrics, replacing the previous ones, and ``page``: the
    page summary's ``(version, JSON)`` (``service.page_summary``; None: the first view builds
    it); comparisons computed from the previous report are stale, so they go."""
    conn.execute(
        "INSERT OR REPLACE INTO reports (run_id, schema_version, catalog_version, report_json,"
        " duration_s, created_at) VALUES (?, ?, ?, ?, ?, ?)",
        (run_id, schema_version, catalog_version, report_json, duration_s, now_iso()),
    )
    conn.execute("UPDATE runs SET analysis_s = ? WHERE id = ?", (duration_s, run_id))
    conn.execute("DELETE FROM run_pages WHERE run_id = ?", (run_id,))
    if page is not None:
        store_page(conn, run_id=run_id, version=page[0], page_json=page[1])
    conn.execute("DELETE FROM run_metrics WHERE run_id = ?", (run_id,))
    conn.executemany(
        "INSERT OR REPLACE INTO run_metrics (run_id, metric, label, value) VALUES (?,?,?,?)",
        [(run_id, metric.value, label, value) for metric, label, value in metrics],
    )
    conn.execute(
        "DELETE FROM comparisons WHERE base_run_id = ? OR head_run_id = ?", (run_id, run_id)
    )


class _Keep:
    """Sentinel: leave the column as it is."""


KEEP = _Keep()


def set_run_state(
    conn: Conn,
    *,
    run_id: int,
    status: str | _Keep = KEEP,
    progress: str | _Keep | None = KEEP,
    error: str | _Keep | None = KEEP,
    only_if_status: str | None = None,
    touch: bool = True,
) -> None:
    """Update where a run stands (status, progress line, error); columns given as ``KEEP``
    stay. ``only_if_status``: change nothing unless the run is in that status. Either backend
    (the analysis queue's claims call it on PostgreSQL too)."""
    values: dict[str, Any] = {
        column: value
        for column, value in (("status", status), ("progress", progress), ("error", error))
        if not isinstance(value, _Keep)
    }
    if touch:
        values["updated_at"] = now_iso()
    if not values:
        return
    t = schema.runs
    update = sa.update(t).where(t.c.id == run_id).values(**values)
    if only_if_status:
        update = update.where(t.c.status == only_if_status)
    execute(conn, update)


def run_exists(conn: Conn, *, run_id: int) -> bool:
    """Whether run ``run_id`` is stored (either backend)."""
    t = schema.runs
    return execute(conn, sa.select(t.c.id).where(t.c.id == run_id)).first() is not None


def link_job(conn: Conn, *, run_id: int, job_id: int) -> None:
    """Record that job ``job_id`` produced run ``run_id`` (a runner completed it)."""
    t = schema.runs
    execute(conn, sa.update(t).where(t.c.id == run_id).values(job_id=job_id))


def unlink_job(conn: Conn, *, job_id: int) -> None:
    """Forget that job ``job_id`` produced its runs (the job is being deleted; they stay)."""
    t = schema.runs
    execute(conn, sa.update(t).where(t.c.job_id == job_id).values(job_id=None))


def total_runs(conn: sqlite3.Connection) -> int:
    """How many runs are stored (``/health``)."""
    return int(conn.execute("SELECT count(*) FROM runs").fetchone()[0])


def trace_files(conn: sqlite3.Connection, *, run_id: int) -> list[dict[str, Any]]:
    """The run's trace files (``id, name, format, rank, sha256``), in upload order."""
    return rows(
        conn,
        "SELECT id, name, format, rank, sha256 FROM run_files WHERE run_id = ? AND role = 'trace' "
        "ORDER BY id",
        (run_id,),
    )


def manifest_json(conn: sqlite3.Connection, *, run_id: int) -> Any:
    """The run's stored manifest (decoded), or None."""
    row = conn.execute("SELECT manifest_json FROM runs WHERE id = ?", (run_id,)).fetchone()
    return json.loads(row[0]) if row and row[0] else None


_LOOP_TAGS = 'SELECT r.id, r.name, r.commit_sha AS "commit", r.branch, r.manifest_json FROM runs r '


def loop_tag_row(conn: sqlite3.Connection, *, run_id: int) -> dict[str, Any] | None:
    """A run's id, name, commit, branch and manifest text (the pull-request loop's tags)."""
    found = rows(conn, _LOOP_TAGS + "WHERE r.id = ?", (run_id,))
    return found[0] if found else None


def loop_baseline_candidates(
    conn: sqlite3.Connection,
    *,
    branch: str,
    exclude_run_id: int,
    repo: str | None,
    suite: str | None,
    spec_name: str | None,
    entry_key: str | None,
    limit: int,
) -> list[dict[str, Any]]:
    """Analysed runs on ``branch`` tagged (manifest ``run`` block) with this repository, suite,
    entry name and entry key (``IS``: a spec's runs have none), not from a pull request; newest
    first, rows as :func:`loop_tag_row`."""
    return rows(
        conn,
        _LOOP_TAGS + "WHERE r.status = 'analysed' AND r.branch = ? AND r.id != ?"
        " AND r.repo = ? AND r.suite = ? AND r.spec_name = ? AND r.pr IS NULL"
        " AND r.entry_key IS ? ORDER BY r.id DESC LIMIT ?",
        (branch, exclude_run_id, repo, suite, spec_name, entry_key, limit),
    )


def runs_with_reports_older_than(conn: sqlite3.Connection, *, schema_version: int) -> list[int]:
    """Runs whose stored report has an older schema and no analysis queued or running."""
    return [
        int(r[0])
        for r in conn.execute(
            "SELECT p.run_id FROM reports p WHERE p.schema_version < ? AND NOT EXISTS ("
            "SELECT 1 FROM analysis_tasks t WHERE t.run_id = p.run_id "
            "AND t.status IN ('queued', 'running'))",
            (schema_version,),
        )
    ]


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
