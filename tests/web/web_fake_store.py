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
    return RunSummary.model_validate(base)


@dataclass
class FakeStore:
    runs: dict[int, RunSummary] = field(default_factory=dict)
    reports: dict[int, AnalysisReport] = field(default_factory=dict)
    impl: dict[int, str] = field(default_factory=dict)
    comparison: ComparisonReport = field(default_factory=f.comparison_report)
    history: list[HistoryPoint] = field(default_factory=list)

    def list_runs(self, filters: RunFilters, limit: int, offset: int) -> list[RunSummary]:
        found = [
            r
            for r in sorted(self.runs.values(), key=lambda r: -r.id)
            if (not filters.branch or r.branch == filters.branch)
            and (not filters.config_key or r.config_key == filters.config_key)
            and (not filters.status or r.status == filters.status)
            and (not filters.commit or (r.commit or "").startswith(filters.commit))
        ]
        return found[offset : offset + limit]

    def implementations(self, run_ids: list[int]) -> dict[int, str | None]:
        return {i: self.impl.get(i) for i in run_ids}

    def get_run(self, run_id: int, *, include_report: bool = True) -> RunDetail:
        if run_id not in self.runs:
            raise NotFound(f"run {run_id} does not exist")
        report = self.reports.get(run_id) if include_report else None
        return RunDetail(**self.runs[run_id].model_dump(), report=report)

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
        store.runs[i] = _summary(i)
        store.impl[i] = "te" if i % 2 else "bundled"
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
