"""Read functions over the run store: what the API routes and the web pages show.

Every function takes the database the ``DbDep`` dependency gives (``service.api.deps``; a
SQLite ``Database`` or a ``PostgresDatabase``) and runs its SQL on a read connection under the
read time limit. They return
pydantic models, so the JSON API and the HTML pages are built from the same data.

The two hottest API reads (run list, run detail) also have ``*_json`` twins that build the
response bytes straight from the rows with orjson: the same dicts the models are validated from
(``_summary_row``, ``_detail_row``), so both paths give the same JSON (a test checks it), minus
two rounds of pydantic validation and FastAPI's encoder per request. Each twin returns the
database state tag (``Database.read_tagged``) for the ETag, and skips the query when the
caller's tag is still current.
"""

from __future__ import annotations

import json
from collections.abc import Container
from typing import Any, Literal

import orjson
from pydantic import BaseModel, Field, ValidationError

from analyzers.report import AnalysisReport, ComparisonReport
from service.byte_cache import ByteBoundedCache
from service.core.errors import Conflict, NotFound
from service.page_summary import PAGE_SUMMARY_VERSION, BuiltPage, RunPageSummary, page_summary
from service.storage import runs
from service.storage.engine import AnyDatabase, Conn
from service.storage.runs import Metric, RunFilters

__all__ = [
    "AnalysisStatus", "ComparisonRecord", "ComparisonSummary", "HistoryPoint", "Metric",
    "RunDetail", "RunFile", "RunFilters", "RunSummary", "count_runs", "find_comparison",
    "get_analysis_status", "get_comparison", "get_comparison_record", "get_page_parts",
    "get_page_summary", "get_report", "get_run",
    "list_comparisons", "list_runs", "metric_history", "run_detail_json", "run_page_json",
    "scans_runs", "store_page_parts",
]  # fmt: skip


class RunFile(BaseModel):
    """A file of a run: a trace, a log or the manifest (``name`` is a label, not a path)."""

    id: int
    role: str
    name: str
    format: str | None
    rank: int | None
    sha256: str
    size: int


class AnalysisStatus(BaseModel):
    """Where the analysis of a run stands."""

    run_id: int
    status: str  # "queued" | "running" | "done" | "failed" | "none"
    attempts: int = 0
    progress: str | None = None
    error: str | None = None
    updated_at: str | None = None
    duration_s: float | None = None


class RunSummary(BaseModel):
    """One row of the run list."""

    id: int
    name: str
    branch: str | None = None
    commit: str | None = None
    host: str | None = None
    source: str
    status: str  # "queued" | "analysing" | "analysed" | "failed" | "empty"
    progress: str | None = None
    error: str | None = None
    config_key: str | None = None
    created_at: str
    updated_at: str | None = None
    traces: int = 0
    findings: int | None = None
    median_ms: float | None = None
    implementation: str | None = None
    """The manifest's ``workload.implementation``."""
    verdict: str = "pending"
    """failed (the job failed or hung, or its analysis failed), pending (not analysed yet),
    clean (no findings), findings, or unknown."""
    repo: str | None = None
    """The loop's tags from the manifest ``run`` block (``cptrace agent``): repository, pull
    request, suite and spec or command entry name; None for runs from elsewhere."""
    pr: int | None = None
    suite: str | None = None
    spec_name: str | None = None


class RunDetail(RunSummary):
    """A run with its files, manifest, analysis status and (optionally) its report."""

    manifest: dict[str, Any] | None = None
    spec: dict[str, Any] | None = None
    files: list[RunFile] = Field(default_factory=list)
    analysis: AnalysisStatus | None = None
    report: AnalysisReport | None = None
    window_groups: list[str] = Field(default_factory=list)


class HistoryPoint(BaseModel):
    """One run's value of one metric, for trend charts."""

    run_id: int
    created_at: str
    name: str
    branch: str | None
    commit: str | None
    label: str
    value: float
    failed: bool = False
    """The run's job failed or hung, or its analysis failed."""
    implementation: str | None = None
    """The implementation(s) the run's variants ran, e.g. "te, te-adapter" (manifest
    ``workload.implementation`` with each variant's override): runs of one configuration hash
    that ran different code are different series."""
    workload: dict[str, Any] | None = None
    """The manifest's workload block (what the configuration hash is made from)."""
    caveat: str | None = None
    """The manifest's ``run.caveat``: what to know before trusting this run's figures."""


def _history_point(row: dict[str, Any]) -> HistoryPoint:
    workload = json.loads(row.pop("workload_json") or "null")
    return HistoryPoint(**row, workload=workload if isinstance(workload, dict) else None)


class ComparisonSummary(BaseModel):
    """A stored comparison without its report."""

    id: int
    base_run_id: int
    head_run_id: int
    base_window: str | None
    head_window: str | None
    verdict: str
    summary: str
    created_at: str


class ComparisonRecord(ComparisonSummary):
    """A stored comparison and its report."""

    report: ComparisonReport




def _summary_row(row: dict[str, Any]) -> dict[str, Any]:
    """A ``_SUMMARY_SQL`` row as ``RunSummary`` fields (metrics are stored as REAL)."""
    if row.get("findings") is not None:
        row["findings"] = int(row["findings"])
    return row


def _summary(row: dict[str, Any]) -> RunSummary:
    return RunSummary.model_validate(_summary_row(row))


def list_runs(
    db: AnyDatabase,
    *,
    filters: RunFilters | None = None,
    limit: int = 50,
    offset: int = 0,
    sort: str = "id",
    order: Literal["asc", "desc"] = "desc",
) -> list[RunSummary]:
    """Runs matching ``filters``, sorted (newest first by default), one page."""
    flt = filters or RunFilters()
    found = db.read(
        lambda c: runs.list_runs(c, filters=flt, limit=limit, offset=offset, sort=sort, order=order)
    )
    return [RunSummary.model_validate(r) for r in found]


def count_runs(db: AnyDatabase, *, filters: RunFilters | None = None) -> int:
    """How many runs match ``filters`` (for paging)."""
    return db.read(lambda c: runs.count_runs(c, filters=filters or RunFilters()))


def run_list_options(db: AnyDatabase) -> dict[str, list[str]]:
    """Values the run list's filter drop-downs offer (from the newest runs)."""
    return db.read(lambda c: runs.distinct_values(c))


def scans_runs(filters: RunFilters) -> bool:
    """True when ``filters`` need a full scan of the runs table (substring or prefix match):
    those reads grow with the store, so the API runs them off the event loop."""
    return bool(filters.name or filters.commit)


def run_page_json(
    db: AnyDatabase,
    *,
    filters: RunFilters | None = None,
    limit: int = 50,
    offset: int = 0,
    unless: Container[str] = (),
) -> tuple[str, bytes | None]:
    """``(tag, body)``: the run list page as ``RunPage`` JSON, read in one go on one connection.

    ``body`` is None when ``tag`` is in ``unless`` (the caller's copy is current: no query runs).
    """
    flt = filters or RunFilters()

    def read(conn: Conn, tag: str) -> tuple[str, bytes | None]:
        if tag in unless:
            return tag, None
        page = {
            "items": runs.list_runs(conn, filters=flt, limit=limit, offset=offset),
            "total": runs.count_runs(conn, filters=flt),
            "limit": limit,
            "offset": offset,
        }
        return tag, orjson.dumps(page)

    return db.read_tagged(read)


def _load_json(text: str | None) -> Any:
    return json.loads(text) if text else None


def _analysis_status(conn: Conn, run_id: int) -> AnalysisStatus:
    return AnalysisStatus.model_validate(_analysis_row(conn, run_id))


def _analysis_row(conn: Conn, run_id: int) -> dict[str, Any]:
    """``AnalysisStatus`` fields of one run: its latest task, else whether a report exists."""
    facts = runs.analysis_facts(conn, run_id=run_id)
    task, run = facts["task"], facts["run"]
    if task is None:
        return {
            "run_id": run_id,
            "status": "done" if facts["has_report"] else "none",
            "attempts": 0,
            "progress": run.get("progress"),
            "error": None,
            "updated_at": None,
            "duration_s": facts["duration_s"],
        }
    return {
        "run_id": run_id,
        "status": task["status"],
        "attempts": task["attempts"] or 0,
        "progress": run.get("progress"),
        "error": task["error"] or run.get("error"),
        "updated_at": task["updated_at"],
        "duration_s": facts["duration_s"],
    }


def get_analysis_status(db: AnyDatabase, run_id: int) -> AnalysisStatus:
    """The analysis status of one run. :raises NotFound: no such run."""

    def read(conn: Conn) -> AnalysisStatus:
        runs.require_run(conn, run_id=run_id)
        return _analysis_status(conn, run_id)

    return db.read(read)


def get_report(db: AnyDatabase, run_id: int) -> AnalysisReport | None:
    """The stored analysis report of a run, or None when it has none (yet)."""
    text = db.read(lambda c: runs.report_json(c, run_id=run_id))
    return None if text is None else AnalysisReport.model_validate_json(text)


PARSED_PAGE_BYTES = 128 * 1024 * 1024
"""Memory the parsed page summaries may take together (the least recently viewed leave first).
Bounded in bytes, not entries: the 3-arm reference workload's summary is 1.6 MB parsed, a small
run's a few KB, so a count kept too few large ones (each miss parses the stored text again)."""
PARSED_BYTES_PER_STORED_BYTE = 5
"""What a parsed summary is charged per byte of its stored JSON (measured: 4.6 for the
reference workload, 1.6 MB parsed from 0.35 MB of text)."""
_parsed: ByteBoundedCache[RunPageSummary] = ByteBoundedCache(PARSED_PAGE_BYTES)


def get_page_summary(db: AnyDatabase, run_id: int, *, keep: bool = True) -> RunPageSummary | None:
    """What the run page shows of the run's report (``service.page_summary``), or None when it
    has no report (yet). Stored with the report; a run analysed before the summary existed
    (or with an older or unreadable one) has its summary built from the report once, and
    stored. Summaries are kept parsed up to :data:`PARSED_PAGE_BYTES`, keyed by the stored
    row's stamp (new at every write), so a view of an unchanged summary reads two short columns.
    Callers must not change the summary they get. ``keep`` False: nothing is kept parsed (the
    worker reads each summary once, to build its page)."""
    stamp = db.read(lambda c: runs.page_stamp(c, run_id=run_id))
    if stamp is not None and stamp[0] == PAGE_SUMMARY_VERSION:
        cached = _parsed.get((run_id, stamp[1]))
        if cached is not None:
            return cached
    stored = db.read(lambda c: runs.page_json(c, run_id=run_id))
    unreadable = None
    if stored is not None and stored[0] == PAGE_SUMMARY_VERSION:
        try:
            summary = RunPageSummary.model_validate_json(stored[2])
        except ValidationError:
            unreadable = stored[2]  # rebuilt below, like a missing one
        else:
            summary.stamp = stored[1]
            if keep:
                charge = PARSED_BYTES_PER_STORED_BYTE * len(stored[2])
                _parsed.put((run_id, stored[1]), summary, charge)
            return summary
    report = get_report(db, run_id)
    if report is None:
        return None
    built = page_summary(report)
    text = built.model_dump_json()
    # the stamp it is stored under (None: a newer one was stored meanwhile), so what is built
    # from it (``web.page_parts``) is stored at this first view too
    built.stamp = db.write_tx(
        lambda c: runs.store_page(
            c, run_id=run_id, version=built.version, page_json=text, if_stale=True,
            unreadable=unreadable,
        )
    )  # fmt: skip
    return built


def get_page_parts(db: AnyDatabase, run_id: int, version: str) -> BuiltPage | None:
    """The run's page as built by code of ``version`` from its current page summary, or None
    (not built yet, built by other code, or from a summary replaced since or of another
    ``PAGE_SUMMARY_VERSION``)."""
    found = db.read(
        lambda c: runs.page_parts(
            c, run_id=run_id, version=version, summary_version=PAGE_SUMMARY_VERSION
        )
    )
    return None if found is None else BuiltPage(*found)


def store_page_parts(
    db: AnyDatabase, run_id: int, version: str, summary_stamp: str, page: BuiltPage
) -> bool:
    """Store the run's built page while its page summary is still the one of ``summary_stamp``;
    whether it was stored."""
    return db.write_tx(
        lambda c: runs.store_page_parts(
            c, run_id=run_id, version=version, summary_stamp=summary_stamp, charts=page.charts,
            html=page.html, page_json=page.page_json,
        )
    )  # fmt: skip


def _detail_row(conn: Conn, run_id: int) -> dict[str, Any]:
    """``RunDetail`` fields but the report, read on one connection; ``manifest`` and ``spec``
    stay the stored JSON text (the JSON path embeds it as is, the model path parses it).

    :raises NotFound: no such run.
    """
    detail = runs.summary_with_texts(conn, run_id=run_id)
    if detail is None:
        raise NotFound(f"run {run_id} does not exist")
    detail["manifest"] = detail.pop("manifest_json") or None
    detail["spec"] = detail.pop("spec_json") or None
    detail.update(
        files=runs.run_files(conn, run_id=run_id),
        analysis=_analysis_row(conn, run_id),
        report=None,
        window_groups=runs.window_groups(conn, run_id=run_id),
    )
    return detail


def _run_detail(conn: Conn, run_id: int) -> RunDetail:
    """Everything but the report, read in one go on one connection (a consistent snapshot)."""
    detail = _detail_row(conn, run_id)
    detail["manifest"] = _load_json(detail["manifest"])
    detail["spec"] = _load_json(detail["spec"])
    return RunDetail.model_validate(detail)


def run_detail_json(
    db: AnyDatabase, run_id: int, *, unless: Container[str] = ()
) -> tuple[str, bytes | None]:
    """``(tag, body)``: ``RunDetail`` JSON of one run without its report (``report: null``).

    ``body`` is None when ``tag`` is in ``unless`` and the run exists (the caller's copy is
    current). :raises NotFound: no such run.
    """

    def read(conn: Conn, tag: str) -> tuple[str, bytes | None]:
        if tag in unless:
            runs.require_run(conn, run_id=run_id)
            return tag, None
        detail = _detail_row(conn, run_id)
        # The stored manifest and spec were written by json.dumps: embed the text, no re-parse.
        for key in ("manifest", "spec"):
            if detail[key] is not None:
                detail[key] = orjson.Fragment(detail[key])
        return tag, orjson.dumps(detail)

    return db.read_tagged(read)


def get_run(db: AnyDatabase, run_id: int, *, include_report: bool = True) -> RunDetail:
    """One run with files, manifest, analysis status and report. :raises NotFound:."""
    detail = db.read(lambda conn: _run_detail(conn, run_id))
    if include_report:
        detail.report = get_report(db, run_id)
    return detail


def find_comparison(
    db: AnyDatabase,
    base_id: int,
    head_id: int,
    *,
    base_window: str | None = None,
    head_window: str | None = None,
) -> ComparisonRecord | None:
    """A stored comparison of exactly these runs and windows, or None."""
    row = db.read(
        lambda c: runs.find_comparison(
            c,
            base_run_id=base_id,
            head_run_id=head_id,
            base_window=base_window,
            head_window=head_window,
        )
    )
    return _record(row) if row else None


def get_comparison_record(db: AnyDatabase, comparison_id: int) -> ComparisonRecord:
    """A stored comparison by id. :raises NotFound:."""
    row = db.read(lambda c: runs.comparison_by_id(c, comparison_id=comparison_id))
    if row is None:
        raise NotFound(f"comparison {comparison_id} does not exist")
    return _record(row)


def _record(row: dict[str, Any]) -> ComparisonRecord:
    return ComparisonRecord(
        id=row["id"],
        base_run_id=row["base_run_id"],
        head_run_id=row["head_run_id"],
        base_window=row["base_window"] or None,
        head_window=row["head_window"] or None,
        verdict=row["verdict"],
        summary=row["summary"],
        created_at=row["created_at"],
        report=ComparisonReport.model_validate_json(row["report_json"]),
    )


def list_comparisons(
    db: AnyDatabase, *, run_id: int | None = None, limit: int = 50, offset: int = 0
) -> list[dict[str, Any]]:
    """Stored comparisons (without their reports), newest first."""
    return db.read(
        lambda c: runs.list_comparisons(c, run_id=run_id, limit=limit, offset=offset)
    )


def get_comparison(
    db: AnyDatabase,
    base_id: int,
    head_id: int,
    *,
    base_window: str | None = None,
    head_window: str | None = None,
) -> ComparisonReport:
    """Base vs head: the stored comparison, else computed now from the two stored reports.

    :raises NotFound: a run does not exist. :raises Conflict: a run has no analysis yet.
    """
    stored = find_comparison(db, base_id, head_id, base_window=base_window, head_window=head_window)
    if stored is not None:
        return stored.report
    from analyzers import compare_reports

    base = _require_report(db, base_id)
    head = base if head_id == base_id else _require_report(db, head_id)  # two arms: one parse
    return compare_reports(base, head, base_window=base_window, head_window=head_window)


def _require_report(db: AnyDatabase, run_id: int) -> AnalysisReport:
    status = get_analysis_status(db, run_id)  # raises NotFound
    report = get_report(db, run_id)
    if report is None:
        raise Conflict(f"run {run_id} has no analysis result yet (analysis {status.status})")
    return report


def metric_history(
    db: AnyDatabase,
    *,
    config_key: str,
    metric: Metric | str,
    label: str | None = None,
    limit: int = 500,
) -> list[HistoryPoint]:
    """One metric across the runs of one workload configuration, oldest first."""
    found = db.read(
        lambda c: runs.metric_history(
            c, config_key=config_key, metric=str(metric), label=label, limit=limit
        )
    )
    return [_history_point(dict(r)) for r in found]
