"""The runs tables, one module: every SQL statement on ``runs``, ``run_files``, ``run_metrics``,
``reports``, ``uploads`` and ``comparisons`` (the FastAPI template's ``crud.py``).

Functions take the connection they run on (writes: the caller's transaction, e.g. inside
``Database.write_tx`` or ``immediate``) and keyword-only arguments. The run list is filtered,
sorted and paged here in SQL, for the API (``GET /api/v1/runs``) and the pages (``/runs``) alike.
Metric names are the ``Metric`` enum, shared by the writer (``service.analysis``) and the readers
(``service.store``, ``web.data``).

Every statement is SQLAlchemy Core (``service.storage.schema``'s tables) run through
``engine.execute``, so each function runs on either backend: a SQLite connection (the
``Database``'s writer thread or a reader under its time limit) or a PostgreSQL one
(``PostgresDatabase``). Not sqlite-utils' ``insert``: it commits on its own (``with conn:``),
which would end the caller's transaction half-way through an upload or an analysis result; these
statements must commit together.
"""

from __future__ import annotations

import functools
import json
import secrets
import sqlite3
from collections.abc import Callable, Iterable
from enum import StrEnum
from typing import IO, Any, Literal

import sqlalchemy as sa
from pydantic import BaseModel, Field
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.sql.visitors import InternalTraversal

from service.auth import now_iso
from service.core.errors import NotFound, PayloadTooLarge
from service.storage import schema
from service.storage.engine import Conn, execute, insert_for


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


_r = schema.runs
_f = schema.run_files
_m = schema.run_metrics
_p = schema.reports
_pages = schema.run_pages
_parts = schema.run_page_parts
_c = schema.comparisons
_u = schema.uploads
# One row per run: the two metrics the list shows are joined once (primary-key lookups), so the
# verdict reuses the findings value instead of running its subquery again.
_fm = _m.alias("fm")
_mm = _m.alias("mm")
_SUMMARY_FROM = _r.outerjoin(
    _fm, sa.and_(_fm.c.run_id == _r.c.id, _fm.c.metric == Metric.FINDINGS.value, _fm.c.label == "")
).outerjoin(
    _mm,
    sa.and_(
        _mm.c.run_id == _r.c.id, _mm.c.metric == Metric.ITERATION_MEDIAN_MS.value, _mm.c.label == ""
    ),
)
# A run whose job failed or hung (its manifest has a ``failure`` record) is ``failed`` whatever
# its analysis found: traces of the steps before the failure must never make it look clean.
# Stored at insert (``create_run``; migration m025 filled it for older runs), so the verdict
# reads no manifest: the run list's count and sort stay on the runs table's own pages.
_FAILED = sa.or_(_r.c.status == "failed", _r.c.job_failed == 1)


def _text(value: str) -> sa.ColumnElement[str]:
    """A constant text in the statement itself (no parameter PostgreSQL must type)."""
    return sa.literal_column(f"'{value}'", sa.Text)


_VERDICT = sa.case(
    (_FAILED, _text("failed")),
    (_r.c.status != "analysed", _text("pending")),
    (_fm.c.value.is_(None), _text("unknown")),
    (_fm.c.value > 0, _text("findings")),
    else_=_text("clean"),
)
# The manifest facts the list, its filters, the history and the loop read are columns, stored
# at insert (``create_run`` with :func:`manifest_columns`; migration m041 filled them for older
# runs): no read parses a manifest (an 8 MB manifest string cut the run list from 614 to 50
# req/s when every listed row ran json_extract over it).
_TAG_COLUMNS: dict[str, type] = {"repo": str, "pr": int, "suite": str, "spec_name": str}


class _Bytewise(ColumnElement[Any]):
    """A text sorted by its bytes on both backends: SQLite's default (BINARY) collation, and
    ``COLLATE "C"`` on PostgreSQL, whose database collation may be a locale's."""

    inherit_cache = True
    _traverse_internals = [("column", InternalTraversal.dp_clauseelement)]  # noqa: RUF012

    def __init__(self, column: ColumnElement[Any]):
        self.column = column
        self.type = column.type


@compiles(_Bytewise)
def _bytewise_default(element: _Bytewise, compiler: SQLCompiler, **kw: Any) -> str:
    return compiler.process(element.column, **kw)


@compiles(_Bytewise, "postgresql")
def _bytewise_postgres(element: _Bytewise, compiler: SQLCompiler, **kw: Any) -> str:
    return f'{compiler.process(element.column, **kw)} COLLATE "C"'


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


_TRACES = (
    sa.select(sa.func.count())
    .select_from(_f)
    .where(_f.c.run_id == _r.c.id, _f.c.role == "trace")
    .scalar_subquery()
)
SUMMARY_COLUMNS: tuple[ColumnElement[Any], ...] = (
    _r.c.id, _r.c.name, _r.c.branch, _r.c.commit_sha.label("commit"), _r.c.host, _r.c.source,
    _r.c.status, _r.c.progress, _r.c.error, _r.c.config_key, _r.c.created_at, _r.c.updated_at,
    _TRACES.label("traces"), _fm.c.value.label("findings"), _mm.c.value.label("median_ms"),
    _r.c.implementation, _VERDICT.label("verdict"), _r.c.repo, _r.c.pr, _r.c.suite,
    _r.c.spec_name,
)  # fmt: skip
"""The ``RunSummary`` columns (select them from :func:`_summaries`)."""


def _summaries(*extra: ColumnElement[Any]) -> sa.Select[Any]:
    return sa.select(*SUMMARY_COLUMNS, *extra).select_from(_SUMMARY_FROM)


def summary_fields(row: dict[str, Any]) -> dict[str, Any]:
    """A summary row as ``RunSummary`` fields: findings as an int (metrics are REAL)."""
    if row["findings"] is not None:
        row["findings"] = int(row["findings"])
    return row


_SORT_SQL: dict[str, ColumnElement[Any]] = {
    "id": _r.c.id,
    "name": _Bytewise(_r.c.name),
    "config_key": _Bytewise(_r.c.config_key),
    "branch": _Bytewise(_r.c.branch),
    "created_at": _Bytewise(_r.c.created_at),
    "commit": _Bytewise(_r.c.commit_sha),
    "implementation": _Bytewise(_r.c.implementation),
    "verdict": _Bytewise(_VERDICT),
    "median_ms": _mm.c.value,
    "findings": _fm.c.value,
}


MAX_ROWS = 2**53 - 1
"""Any limit or offset past it means "past the end": SQLite's INTEGER is 64-bit, callers' ints
are not (a page number of 2^63 from a URL)."""


def page_bounds(limit: int, offset: int) -> tuple[int, int]:
    """``LIMIT`` and ``OFFSET`` values SQLite can bind, same answer: clamped to ``MAX_ROWS``."""
    return max(0, min(int(limit), MAX_ROWS)), max(0, min(int(offset), MAX_ROWS))


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _param(name: str) -> Any:
    return sa.bindparam(name, type_=sa.Text)


_FILTERS: dict[str, Callable[[], ColumnElement[bool]]] = {
    "status": lambda: _r.c.status == sa.bindparam("status"),
    "branch": lambda: _r.c.branch == sa.bindparam("branch"),
    "config_key": lambda: _r.c.config_key == sa.bindparam("config_key"),
    "implementation": lambda: _r.c.implementation == sa.bindparam("implementation"),
    "verdict": lambda: _param("verdict") == _VERDICT,
    "repo": lambda: _r.c.repo == sa.bindparam("repo"),
    "pr": lambda: _r.c.pr == sa.bindparam("pr"),
    "suite": lambda: _r.c.suite == sa.bindparam("suite"),
    # a substring, case-folded alike on both sides; % and _ in it are themselves
    "name": lambda: sa.func.lower(_r.c.name).contains(sa.func.lower(_param("name")), escape="\\"),
    "commit": lambda: _r.c.commit_sha.like(_param("commit"), escape="\\"),
    "date_from": lambda: sa.func.substr(_r.c.created_at, 1, 10) >= _param("date_from"),
    "date_to": lambda: sa.func.substr(_r.c.created_at, 1, 10) <= _param("date_to"),
}
"""Each filter's clause, its value a ``bindparam`` of the filter's name."""


def _filter_values(filters: RunFilters) -> dict[str, Any]:
    """The filters given (a falsy value is no filter), as the clauses' parameter values."""
    out = {key: value for key in _FILTERS if (value := getattr(filters, key))}
    if "name" in out:
        out["name"] = _escape_like(out["name"])
    if "commit" in out:
        out["commit"] = _escape_like(out["commit"]) + "%"
    return out


@functools.lru_cache(maxsize=256)
def _list_statement(keys: tuple[str, ...], sort: str, order: str) -> sa.Select[Any]:
    """The run list's statement for these filters and this order, built once per shape."""
    key = _SORT_SQL[sort]
    direction = sa.desc if order == "desc" else sa.asc
    # By id (the API's and the default order) the rowid order serves it with no sort step: only
    # the page's rows are computed. Other keys sort, runs without the value last.
    order_by = (
        [direction(_r.c.id)]
        if sort == "id"
        else [key.is_(None), direction(key), direction(_r.c.id)]
    )
    return (
        _summaries()
        .where(*(_FILTERS[k]() for k in keys))
        .order_by(*order_by)
        .limit(sa.bindparam("page_limit", type_=sa.BigInteger))
        .offset(sa.bindparam("page_offset", type_=sa.BigInteger))
    )


@functools.lru_cache(maxsize=256)
def _count_statement(keys: tuple[str, ...]) -> sa.Select[Any]:
    source = _SUMMARY_FROM if "verdict" in keys else _r  # only the verdict needs fm
    return sa.select(sa.func.count()).select_from(source).where(*(_FILTERS[k]() for k in keys))


def list_runs(
    conn: Conn,
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
    values = _filter_values(filters)
    query = _list_statement(tuple(values), sort, "desc" if order == "desc" else "asc")
    page_limit, page_offset = page_bounds(limit, offset)
    found = execute(conn, query, {**values, "page_limit": page_limit, "page_offset": page_offset})
    return [summary_fields(r) for r in found.rows]


_ONE_WITH_TEXTS = _summaries(_r.c.manifest_json, _r.c.spec_json).where(
    _r.c.id == sa.bindparam("run_id")
)


def summaries_by_id(conn: Conn, *, run_ids: Iterable[int]) -> list[dict[str, Any]]:
    """The ``RunSummary`` rows of these runs (the loop's pages: a batch's or a job's runs)."""
    ids = sorted({int(i) for i in run_ids})
    if not ids:
        return []
    found = execute(conn, _summaries().where(_r.c.id.in_(ids))).rows
    return [summary_fields(r) for r in found]


def count_runs(conn: Conn, *, filters: RunFilters) -> int:
    """How many runs match ``filters``."""
    values = _filter_values(filters)
    return int(execute(conn, _count_statement(tuple(values)), values).scalar())


def distinct_values(conn: Conn, *, limit: int = 500) -> dict[str, list[str]]:
    """Values the run list's drop-downs offer, from the newest ``limit`` runs."""
    recent = (
        sa.select(_r.c.branch, _r.c.config_key, _r.c.status, _r.c.implementation)
        .order_by(_r.c.id.desc())
        .limit(limit)
    )
    found = execute(conn, recent).rows
    return {
        field: sorted({str(row[field]) for row in found if row[field] is not None})
        for field in ("implementation", "config_key", "branch", "status")
    }


def summary_with_texts(conn: Conn, *, run_id: int) -> dict[str, Any] | None:
    """One run's summary columns plus its stored ``manifest_json`` and ``spec_json`` texts."""
    found = execute(conn, _ONE_WITH_TEXTS, {"run_id": run_id}).first()
    return summary_fields(found) if found else None


def run_files(conn: Conn, *, run_id: int) -> list[dict[str, Any]]:
    """All files of a run (``RunFile`` fields), in upload order."""
    c = _f.c
    query = sa.select(c.id, c.role, c.name, c.format, c.rank, c.sha256, c.size)
    return execute(conn, query.where(c.run_id == run_id).order_by(c.id)).rows


def window_groups(conn: Conn, *, run_id: int) -> list[str]:
    """The window groups the run's report measured (those with per-step metrics)."""
    query = (
        sa.select(_m.c.label)
        .where(_m.c.run_id == run_id, _m.c.metric == Metric.GPU_BUSY_MS_PER_STEP.value)
        .group_by(_m.c.label)
        .order_by(_Bytewise(_m.c.label))
    )
    return [r["label"] for r in execute(conn, query).rows]


def analysis_facts(conn: Conn, *, run_id: int) -> dict[str, Any]:
    """The latest analysis task, the run's progress/error and the report's duration."""
    t = schema.analysis_tasks.c
    # a run analysed per rank: its merge task says where it stands (running while it waits
    # for its rank tasks), never one of those
    status = sa.case((t.status == "waiting", "running"), else_=t.status).label("status")
    task = execute(
        conn,
        sa.select(status, t.attempts, t.error, t.updated_at)
        .where(t.run_id == run_id, t.kind != "rank")
        .order_by(t.id.desc())
        .limit(1),
    ).first()
    run = execute(
        conn, sa.select(_r.c.progress, _r.c.error, _r.c.analysis_s).where(_r.c.id == run_id)
    ).first()
    # the report row's key only: its later columns sit behind the report's overflow pages
    has_report = execute(conn, sa.select(_p.c.run_id).where(_p.c.run_id == run_id)).first()
    return {
        "task": task,
        "run": run or {},
        "duration_s": run["analysis_s"] if run and has_report else None,
        "has_report": has_report is not None,
    }


def report_json(conn: Conn, *, run_id: int) -> str | None:
    """The stored report text of a run, or None."""
    found = execute(conn, sa.select(_p.c.report_json).where(_p.c.run_id == run_id)).first()
    return None if found is None else str(found["report_json"])


REPORT_CHUNK_BYTES = 256 * 1024


def copy_report(conn: Conn, *, run_id: int, into: IO[bytes]) -> int | None:
    """Write the stored report text of a run (UTF-8) into ``into``, 256 KiB at a time; its
    size in bytes, or None when the run has no report. On SQLite through incremental blob
    reads, never the whole text in memory (``reports.run_id`` is the table's rowid); on
    PostgreSQL the text is read in one statement, then written in chunks."""
    if not isinstance(conn, sqlite3.Connection):
        text = report_json(conn, run_id=run_id)
        if text is None:
            return None
        data = text.encode()
        for start in range(0, len(data), REPORT_CHUNK_BYTES):
            into.write(data[start : start + REPORT_CHUNK_BYTES])
        return len(data)
    try:
        blob = conn.blobopen("reports", "report_json", run_id, readonly=True)
    except sqlite3.OperationalError:  # "no such rowid": no report
        return None
    with blob:
        while chunk := blob.read(REPORT_CHUNK_BYTES):
            into.write(chunk)
        return len(blob)


def page_stamp(conn: Conn, *, run_id: int) -> tuple[int, str] | None:
    """``(version, stamp)`` of the run's stored page summary, read without its text (the stamp
    is new at every write), or None."""
    query = sa.select(_pages.c.version, _pages.c.stamp).where(_pages.c.run_id == run_id)
    found = execute(conn, query).first()
    return None if found is None else (int(found["version"]), str(found["stamp"]))


def page_json(conn: Conn, *, run_id: int) -> tuple[int, str, str] | None:
    """The run's stored page summary ``(version, stamp, JSON)``, or None."""
    c = _pages.c
    found = execute(conn, sa.select(c.version, c.stamp, c.page_json).where(c.run_id == run_id))
    row = found.first()
    return None if row is None else (int(row["version"]), str(row["stamp"]), str(row["page_json"]))


def page_parts(
    conn: Conn, *, run_id: int, version: str, summary_version: int
) -> tuple[int, str, str] | None:
    """The run's built page ``(charts, html, page_json)`` when it was built by code of
    ``version`` from the page summary stored now (its stamp), a summary of ``summary_version``;
    else None."""
    c = _parts.c
    query = (
        sa.select(c.charts, c.html, c.page_json)
        .select_from(_parts.join(_pages, _pages.c.run_id == c.run_id))
        .where(
            c.run_id == run_id,
            c.version == version,
            c.summary_stamp == _pages.c.stamp,
            _pages.c.version == summary_version,
        )
    )
    row = execute(conn, query).first()
    return None if row is None else (int(row["charts"]), str(row["html"]), str(row["page_json"]))


def store_page_parts(
    conn: Conn, *, run_id: int, version: str, summary_stamp: str, charts: int, html: str,
    page_json: str,
) -> bool:  # fmt: skip
    """Store (or replace) the run's built page, only while its stored page summary is still the
    one of ``summary_stamp`` (a build never outlives a re-analysis or a deleted run). Whether
    it was stored."""
    values: dict[str, Any] = {
        "run_id": run_id,
        "version": version,
        "summary_stamp": summary_stamp,
        "created_at": now_iso(),
        "charts": charts,
        "html": html,
        "page_json": page_json,
    }
    current = sa.exists().where(_pages.c.run_id == run_id, _pages.c.stamp == summary_stamp)
    source = sa.select(
        *(sa.cast(sa.literal(v), _parts.c[k].type).label(k) for k, v in values.items())
    ).where(current)
    insert = insert_for(conn, _parts).from_select(list(values), source)
    replaced = ("version", "summary_stamp", "created_at", "charts", "html", "page_json")
    upsert = insert.on_conflict_do_update(
        index_elements=[_parts.c.run_id], set_={k: insert.excluded[k] for k in replaced}
    )
    # RETURNING, not the row count: PostgreSQL's driver reports -1 for an INSERT ... SELECT
    return bool(execute(conn, upsert.returning(_parts.c.run_id)).rows)


def store_page(
    conn: Conn,
    *,
    run_id: int,
    version: int,
    page_json: str,
    if_stale: bool = False,
    unreadable: str | None = None,
) -> str | None:
    """Store (or replace) the run's page summary; its stamp, or None when nothing was stored.
    ``if_stale``: only while the run has a report and no summary of ``version`` other than
    ``unreadable`` (a page view's build never replaces what a newer analysis stored meanwhile,
    nor outlives a deleted run)."""
    values: dict[str, Any] = {
        "run_id": run_id,
        "version": version,
        "page_json": page_json,
        "created_at": now_iso(),
        "stamp": secrets.token_hex(8),
    }
    source = sa.select(
        *(sa.cast(sa.literal(v), _pages.c[k].type).label(k) for k, v in values.items())
    ).where(sa.exists().where(_p.c.run_id == run_id) if if_stale else sa.true())
    insert = insert_for(conn, _pages).from_select(list(values), source)
    keep = (
        sa.or_(
            _pages.c.version != insert.excluded.version,
            _pages.c.page_json.is_not_distinct_from(unreadable),
        )
        if if_stale
        else None
    )
    upsert = insert.on_conflict_do_update(
        index_elements=[_pages.c.run_id],
        set_={k: insert.excluded[k] for k in ("version", "page_json", "created_at", "stamp")},
        where=keep,
    )
    # RETURNING, not the row count: PostgreSQL's driver reports -1 for an INSERT ... SELECT
    stored = execute(conn, upsert.returning(_pages.c.stamp)).rows
    return str(stored[0]["stamp"]) if stored else None


def find_comparison(
    conn: Conn,
    *,
    base_run_id: int,
    head_run_id: int,
    base_window: str | None,
    head_window: str | None,
) -> dict[str, Any] | None:
    """The stored comparison row of exactly these runs and windows, or None."""
    query = sa.select(_c).where(
        _c.c.base_run_id == base_run_id,
        _c.c.head_run_id == head_run_id,
        _c.c.base_window == (base_window or ""),
        _c.c.head_window == (head_window or ""),
    )
    return execute(conn, query).first()


def comparison_by_id(conn: Conn, *, comparison_id: int) -> dict[str, Any] | None:
    return execute(conn, sa.select(_c).where(_c.c.id == comparison_id)).first()


def list_comparisons(
    conn: Conn, *, run_id: int | None, limit: int, offset: int
) -> list[dict[str, Any]]:
    """Stored comparisons (without their reports), newest first."""
    c = _c.c
    query = sa.select(
        c.id, c.base_run_id, c.head_run_id, c.base_window, c.head_window, c.verdict, c.summary,
        c.created_at,
    )  # fmt: skip
    if run_id is not None:
        query = query.where(sa.or_(c.base_run_id == run_id, c.head_run_id == run_id))
    page_limit, page_offset = page_bounds(limit, offset)
    return execute(conn, query.order_by(c.id.desc()).limit(page_limit).offset(page_offset)).rows


def metric_history(
    conn: Conn, *, config_key: str, metric: str, label: str | None, limit: int
) -> list[dict[str, Any]]:
    """One metric across the runs of one configuration (``HistoryPoint`` fields, the workload
    as JSON text), oldest first."""
    columns = (
        _m.c.run_id, _r.c.created_at, _r.c.name, _r.c.branch, _r.c.commit_sha.label("commit"),
        _m.c.label, _m.c.value, sa.cast(_FAILED, sa.Integer).label("failed"),
        _r.c.implementations.label("implementation"), _r.c.workload_json, _r.c.caveat,
    )  # fmt: skip
    query = (
        sa.select(*columns)
        .select_from(_m.join(_r, _r.c.id == _m.c.run_id))
        .where(_r.c.config_key == config_key, _m.c.metric == metric)
    )
    if label is not None:
        query = query.where(_m.c.label == label)
    return execute(conn, query.order_by(_r.c.id).limit(limit)).rows


def set_manifest_columns(conn: Conn, *, run_id: int, manifest: object) -> None:
    """Fill the run's :func:`manifest_columns` from ``manifest`` (a run inserted without them:
    migration m041's backfill)."""
    facts = manifest_columns(manifest)
    execute(conn, sa.update(_r).where(_r.c.id == run_id).values(**facts))


def require_run(conn: Conn, *, run_id: int) -> None:
    """:raises NotFound: no run ``run_id`` (the one "does this run exist" check)."""
    if not run_exists(conn, run_id=run_id):
        raise NotFound(f"run {run_id} does not exist")


def has_traces(conn: Conn, *, run_id: int) -> bool:
    """True when the run has at least one trace file."""
    query = sa.select(_f.c.id).where(_f.c.run_id == run_id, _f.c.role == "trace").limit(1)
    return execute(conn, query).first() is not None


def _dump(value: Any) -> str | None:
    return None if value is None else json.dumps(value, allow_nan=False)


def create_run(
    conn: Conn,
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
    insert = sa.insert(_r).values(
        name=name, branch=branch, commit_sha=commit, host=host, source=source, status=status,
        config_key=config_key, manifest_json=_dump(manifest), spec_json=_dump(spec),
        created_at=now, updated_at=now,
        job_failed=int(isinstance((manifest or {}).get("failure"), dict)),
        **manifest_columns(manifest),
    )  # fmt: skip
    return int(execute(conn, insert.returning(_r.c.id)).scalar())


def add_run_file(
    conn: Conn,
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
    blob = insert_for(conn, schema.blobs).values(sha256=sha256, size=size, created_at=now_iso())
    execute(conn, blob.on_conflict_do_nothing(index_elements=[schema.blobs.c.sha256]))
    execute(
        conn,
        sa.insert(_f).values(
            run_id=run_id, role=role, name=name, format=format, rank=rank, sha256=sha256,
            size=size,
        ),
    )  # fmt: skip


def find_upload(conn: Conn, *, key: str) -> int | None:
    """The run an idempotency key created, or None."""
    found = execute(conn, sa.select(_u.c.run_id).where(_u.c.key == key)).first()
    return None if found is None else int(found["run_id"])


def record_upload(
    conn: Conn,
    *,
    key: str,
    run_id: int,
    token_id: int | None = None,
    quota: int | None = None,
) -> None:
    """Remember the upload ``key`` made ``run_id``, sent with token ``token_id``.

    ``quota``: the most bytes the token's runs may store (``stored_bytes_of_token``), checked
    after the upload's files were inserted, in the caller's write transaction: two uploads
    that each passed the check made before their bodies were read cannot both commit past it
    (SQLite: the transaction holds the file's write lock; PostgreSQL: the token's row is
    locked before the sum, so the second upload sums after the first committed).

    :raises PayloadTooLarge: the token's runs would store more than ``quota`` (the caller's
        transaction must roll back).
    """
    execute(
        conn,
        sa.insert(_u).values(key=key, run_id=run_id, created_at=now_iso(), token_id=token_id),
    )
    if quota is None or token_id is None:
        return
    tokens = schema.tokens
    execute(conn, sa.select(tokens.c.id).where(tokens.c.id == token_id).with_for_update())
    stored = stored_bytes_of_token(conn, token_id=token_id)
    if stored > quota:
        raise PayloadTooLarge(
            f"this upload would make this token's runs store {stored} bytes, over its quota "
            f"of {quota} (CPTRACE_TOKEN_STORED_QUOTA_BYTES); nothing was stored; delete runs "
            "to upload more"
        )


def uploaded_by(conn: Conn, *, run_id: int, token_id: int) -> bool:
    """Whether token ``token_id`` uploaded (some of) run ``run_id``."""
    query = sa.select(_u.c.key).where(_u.c.run_id == run_id, _u.c.token_id == token_id).limit(1)
    return execute(conn, query).first() is not None


def stored_bytes_of_token(conn: Conn, *, token_id: int) -> int:
    """Bytes the runs token ``token_id`` uploaded (some of) hold: the sizes of their files, a
    file shared by two runs counted in each (what the token's stored-bytes quota counts)."""
    theirs = sa.select(_u.c.run_id).where(_u.c.token_id == token_id)
    query = sa.select(sa.func.coalesce(sa.func.sum(_f.c.size), 0)).where(_f.c.run_id.in_(theirs))
    return int(execute(conn, query).scalar())


def run_job(conn: Conn, *, run_id: int) -> int | None:
    """The job that produced ``run_id``, if one did."""
    found = execute(conn, sa.select(_r.c.job_id).where(_r.c.id == run_id)).scalar()
    return None if found is None else int(found)


def blob_recorded(conn: Conn, *, digest: str) -> bool:
    """Whether a ``blobs`` row holds ``digest`` (a blob some committed upload stored)."""
    b = schema.blobs
    return execute(conn, sa.select(b.c.sha256).where(b.c.sha256 == digest)).first() is not None


def delete_run(conn: Conn, *, run_id: int) -> list[str]:
    """Delete a run with its files, report, metrics, tasks and comparisons, and the rows of the
    blobs no other run refers to (shared blobs stay). Returns those blobs' digests and those of
    the part blobs its rank tasks left: the caller removes them once the transaction committed.

    :raises NotFound: no such run.
    """
    require_run(conn, run_id=run_id)
    query = sa.select(_f.c.sha256).distinct().where(_f.c.run_id == run_id)
    digests = [str(r["sha256"]) for r in execute(conn, query).rows]
    t = schema.analysis_tasks.c  # the part blobs of its rank tasks, unique to them
    query = sa.select(t.part_sha256).where(t.run_id == run_id, t.part_sha256.is_not(None))
    parts = [str(r["part_sha256"]) for r in execute(conn, query).rows]
    jobs = schema.jobs
    for statement in (
        sa.delete(_c).where(sa.or_(_c.c.base_run_id == run_id, _c.c.head_run_id == run_id)),
        sa.delete(_m).where(_m.c.run_id == run_id),
        sa.delete(_p).where(_p.c.run_id == run_id),
        sa.delete(_parts).where(_parts.c.run_id == run_id),
        sa.delete(_pages).where(_pages.c.run_id == run_id),
        sa.delete(schema.analysis_tasks).where(schema.analysis_tasks.c.run_id == run_id),
        sa.delete(_u).where(_u.c.run_id == run_id),
        sa.delete(_f).where(_f.c.run_id == run_id),
        sa.update(jobs).where(jobs.c.run_id == run_id).values(run_id=None),
        sa.delete(_r).where(_r.c.id == run_id),
    ):
        execute(conn, statement)
    unreferenced = [
        d
        for d in digests
        if execute(conn, sa.select(_f.c.id).where(_f.c.sha256 == d).limit(1)).first() is None
    ]
    for digest in unreferenced:
        execute(conn, sa.delete(schema.blobs).where(schema.blobs.c.sha256 == digest))
    return unreferenced + parts


def record_report(
    conn: Conn,
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
    report = insert_for(conn, _p).values(
        run_id=run_id, schema_version=schema_version, catalog_version=catalog_version,
        report_json=report_json, duration_s=duration_s, created_at=now_iso(),
    )  # fmt: skip
    replaced = ("schema_version", "catalog_version", "report_json", "duration_s", "created_at")
    execute(
        conn,
        report.on_conflict_do_update(
            index_elements=[_p.c.run_id], set_={k: report.excluded[k] for k in replaced}
        ),
    )
    execute(conn, sa.update(_r).where(_r.c.id == run_id).values(analysis_s=duration_s))
    execute(conn, sa.delete(_parts).where(_parts.c.run_id == run_id))
    execute(conn, sa.delete(_pages).where(_pages.c.run_id == run_id))
    if page is not None:
        store_page(conn, run_id=run_id, version=page[0], page_json=page[1])
    execute(conn, sa.delete(_m).where(_m.c.run_id == run_id))
    # one row per (metric, label), the last value given winning
    values = {(metric.value, label): value for metric, label, value in metrics}
    if values:
        rows = [
            {"run_id": run_id, "metric": metric, "label": label, "value": value}
            for (metric, label), value in values.items()
        ]
        execute(conn, sa.insert(_m).values(rows))
    execute(
        conn,
        sa.delete(_c).where(sa.or_(_c.c.base_run_id == run_id, _c.c.head_run_id == run_id)),
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
    stay. ``only_if_status``: change nothing unless the run is in that status."""
    values: dict[str, Any] = {
        column: value
        for column, value in (("status", status), ("progress", progress), ("error", error))
        if not isinstance(value, _Keep)
    }
    if touch:
        values["updated_at"] = now_iso()
    if not values:
        return
    update = sa.update(_r).where(_r.c.id == run_id).values(**values)
    if only_if_status:
        update = update.where(_r.c.status == only_if_status)
    execute(conn, update)


def run_exists(conn: Conn, *, run_id: int) -> bool:
    """Whether run ``run_id`` is stored."""
    return execute(conn, sa.select(_r.c.id).where(_r.c.id == run_id)).first() is not None


def link_job(conn: Conn, *, run_id: int, job_id: int) -> None:
    """Record that job ``job_id`` produced run ``run_id`` (a runner completed it)."""
    execute(conn, sa.update(_r).where(_r.c.id == run_id).values(job_id=job_id))


def unlink_job(conn: Conn, *, job_id: int) -> None:
    """Forget that job ``job_id`` produced its runs (the job is being deleted; they stay)."""
    execute(conn, sa.update(_r).where(_r.c.job_id == job_id).values(job_id=None))


def total_runs(conn: Conn) -> int:
    """How many runs are stored (``/health``)."""
    return int(execute(conn, sa.select(sa.func.count()).select_from(_r)).scalar())


def trace_files(conn: Conn, *, run_id: int) -> list[dict[str, Any]]:
    """The run's trace files (``id, name, format, rank, sha256``), in upload order."""
    c = _f.c
    query = sa.select(c.id, c.name, c.format, c.rank, c.sha256)
    return execute(conn, query.where(c.run_id == run_id, c.role == "trace").order_by(c.id)).rows


def manifest_json(conn: Conn, *, run_id: int) -> Any:
    """The run's stored manifest (decoded), or None."""
    text = execute(conn, sa.select(_r.c.manifest_json).where(_r.c.id == run_id)).scalar()
    return json.loads(text) if text else None


_LOOP_TAGS = sa.select(
    _r.c.id, _r.c.name, _r.c.commit_sha.label("commit"), _r.c.branch, _r.c.manifest_json
)


def loop_tag_row(conn: Conn, *, run_id: int) -> dict[str, Any] | None:
    """A run's id, name, commit, branch and manifest text (the pull-request loop's tags)."""
    return execute(conn, _LOOP_TAGS.where(_r.c.id == run_id)).first()


def loop_baseline_candidates(
    conn: Conn,
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
    query = _LOOP_TAGS.where(
        _r.c.status == "analysed",
        _r.c.branch == branch,
        _r.c.id != exclude_run_id,
        _r.c.repo == repo,
        _r.c.suite == suite,
        _r.c.spec_name == spec_name,
        _r.c.pr.is_(None),
        _r.c.entry_key.is_not_distinct_from(entry_key),
    )
    return execute(conn, query.order_by(_r.c.id.desc()).limit(limit)).rows


def runs_with_reports_older_than(conn: Conn, *, schema_version: int) -> list[int]:
    """Runs whose stored report has an older schema and no analysis queued or running."""
    t = schema.analysis_tasks
    busy = sa.exists().where(
        t.c.run_id == _p.c.run_id, t.c.status.in_(("queued", "running", "waiting"))
    )
    query = sa.select(_p.c.run_id).where(_p.c.schema_version < schema_version, ~busy)
    return [int(r["run_id"]) for r in execute(conn, query).rows]


def store_comparison(
    conn: Conn,
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
    insert = insert_for(conn, _c).values(
        base_run_id=base_run_id, head_run_id=head_run_id, base_window=base_window or "",
        head_window=head_window or "", verdict=verdict, summary=summary,
        report_json=report_json, created_at=now_iso(),
    )  # fmt: skip
    execute(conn, insert.on_conflict_do_nothing())
