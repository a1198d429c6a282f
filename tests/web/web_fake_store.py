"""An in-memory :class:`web.store.WebStore` and an app around the web router, for page tests
that need no database (the real-service tests live in test_web_browser.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

import web_factories as f
from fastapi import FastAPI

from analyzers.catalog import Catalog, load_catalog
from analyzers.compare import CompareError
from analyzers.report import AnalysisReport, ComparisonReport
from service.api.deps import read_access
from service.core.errors import ApiError, Conflict, NotFound, error_body
from service.page_summary import BuiltPage, RunPageSummary, page_summary
from service.store import HistoryPoint, RunDetail, RunFilters, RunSummary
from web.routes import router
from web.store import get_store


def _summary(i: int, **kw: object) -> RunSummary:
    base = dict(
        id=i,
        name=f"run-{i}",
        branch="main",
        commit=f"{i:02d}" + "abcdef0123456789" * 2 + "abcdef",
        host="h200x2",
        source="upload",
        status="analysed",
        config_key="ref-2xh200",
        created_at=f"2026-11-{i:02d}T10:00:00Z",
        traces=2,
        findings=1,
        median_ms=21.0 - i * 0.1,
    )
    base.update(kw)
    summary = RunSummary.model_validate(base)
    return summary.model_copy(update={"verdict": _verdict(summary)})


def _verdict(summary: RunSummary) -> str:
    """What the store's SQL computes: failed, pending, unknown, findings or clean."""
    if summary.status == "failed":
        return "failed"
    if summary.status != "analysed":
        return "pending"
    if summary.findings is None:
        return "unknown"
    return "findings" if summary.findings else "clean"


@dataclass
class FakeStore:
    runs: dict[int, RunSummary] = field(default_factory=dict)
    reports: dict[int, AnalysisReport] = field(default_factory=dict)
    comparison: ComparisonReport = field(default_factory=f.comparison_report)
    history: list[HistoryPoint] = field(default_factory=list)

    def _matching(self, filters: RunFilters) -> list[RunSummary]:
        return [
            r
            for r in self.runs.values()
            if (not filters.branch or r.branch == filters.branch)
            and (not filters.config_key or r.config_key == filters.config_key)
            and (not filters.status or r.status == filters.status)
            and (not filters.commit or (r.commit or "").startswith(filters.commit))
            and (not filters.implementation or r.implementation == filters.implementation)
            and (not filters.verdict or r.verdict == filters.verdict)
            and (not filters.date_from or r.created_at[:10] >= filters.date_from)
            and (not filters.date_to or r.created_at[:10] <= filters.date_to)
        ]

    def list_runs(
        self, filters: RunFilters, limit: int, offset: int, sort: str = "id", order: str = "desc"
    ) -> list[RunSummary]:
        found = sorted(self._matching(filters), key=lambda r: -r.id)
        present = [r for r in found if getattr(r, sort) is not None]
        present.sort(key=lambda r: getattr(r, sort), reverse=order == "desc")
        ordered = present + [r for r in found if getattr(r, sort) is None]
        return ordered[offset : offset + limit]

    def count_runs(self, filters: RunFilters) -> int:
        return len(self._matching(filters))

    def run_list_options(self) -> dict[str, list[str]]:
        def distinct(field: str) -> list[str]:
            return sorted({str(v) for r in self.runs.values() if (v := getattr(r, field))})

        return {f: distinct(f) for f in ("implementation", "config_key", "branch", "status")}

    def get_run(self, run_id: int, *, include_report: bool = True) -> RunDetail:
        if run_id not in self.runs:
            raise NotFound(f"run {run_id} does not exist")
        report = self.reports.get(run_id) if include_report else None
        return RunDetail(**self.runs[run_id].model_dump(), report=report)

    def get_page_summary(self, run_id: int) -> RunPageSummary | None:
        report = self.reports.get(run_id)
        return None if report is None else page_summary(report)

    def get_page_parts(self, run_id: int, version: str) -> BuiltPage | None:
        return None  # its summaries have no stamp: every view builds the page

    def store_page_parts(
        self, run_id: int, version: str, summary_stamp: str, page: BuiltPage
    ) -> bool:
        return False

    def get_comparison(self, base_id, head_id, base_window, head_window) -> ComparisonReport:
        for run_id in (base_id, head_id):
            self.get_run(run_id)
            if run_id not in self.reports:
                raise Conflict(f"run {run_id} has no analysis result yet")
        for window in (base_window, head_window):
            if window not in (None, "arm:auto_clone", "arm:explicit_false"):
                raise CompareError(f"window {window!r} not in the report")
        return self.comparison

    def metric_history(self, config_key: str, metric: str, label: str | None) -> list[HistoryPoint]:
        if config_key != "ref-2xh200":  # the demo history belongs to one configuration
            return []
        offsets = {"iteration_median_ms": 0.0, "iteration_p10_ms": -0.2, "iteration_p90_ms": 0.3}
        if metric not in offsets:
            return []
        points = [p for p in self.history if label is None or p.label == label]
        if metric != "iteration_median_ms":  # spreads are stored for runs 1-5 only
            points = [p for p in points if p.run_id < 6]
        return [p.model_copy(update={"value": p.value + offsets[metric]}) for p in points]

    def catalog(self) -> Catalog:
        return load_catalog(use_env=False)


def demo_store() -> FakeStore:
    store = FakeStore()
    for i in range(1, 8):
        store.runs[i] = _summary(i, implementation="te" if i % 2 else "bundled")
        store.reports[i] = f.analysis_report()
    store.runs[8] = _summary(
        8,
        name="fresh <upload>",
        status="queued",
        findings=None,
        median_ms=None,
        branch="feature/x",
        config_key="other",
    )
    store.runs[9] = _summary(9, status="analysed", findings=0, branch="feature/x")
    store.reports[9] = f.analysis_report()
    store.history = [
        HistoryPoint(
            run_id=i,
            created_at=f"2026-11-{i:02d}T10:00:00Z",
            name=f"run-{i}",
            branch="main",
            commit=f"{i:02d}abcdef",
            label="",
            value=v,
        )
        for i, v in enumerate([21.3, 21.2, 21.4, 21.3, 21.25, 18.6, 18.7], start=1)
    ]
    return store


def make_app(store: FakeStore) -> FastAPI:
    app = FastAPI()
    app.include_router(router)
    app.dependency_overrides[get_store] = lambda: store
    app.dependency_overrides[read_access] = lambda: None

    async def on_error(request, exc: ApiError):
        from fastapi.responses import JSONResponse

        return JSONResponse(error_body(exc.status, exc.message), status_code=exc.status)

    app.add_exception_handler(ApiError, on_error)
    return app
