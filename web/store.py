"""What the pages read, as one small interface over ``service.store``.

The routes depend on :class:`WebStore`, not on the database, so page tests can swap in an
in-memory store (``app.dependency_overrides[get_store]``) while the real app binds
:class:`ServiceStore` to the service's ``Database`` through ``service.api.deps.DbDep``.
"""

from __future__ import annotations

import json
from typing import Annotated, Protocol

from fastapi import Depends, Path

from analyzers.catalog import Catalog, load_catalog
from analyzers.report import ComparisonReport
from service import store
from service.api.deps import DbDep
from service.storage.database import Database, rows
from service.store import HistoryPoint, RunDetail, RunFilters, RunSummary


class WebStore(Protocol):
    """The read functions the dashboards use (a subset of ``service.store``)."""

    def list_runs(self, filters: RunFilters, limit: int, offset: int) -> list[RunSummary]: ...

    def implementations(self, run_ids: list[int]) -> dict[int, str | None]: ...

    def get_run(self, run_id: int, *, include_report: bool = True) -> RunDetail: ...

    def get_comparison(
        self, base_id: int, head_id: int, base_window: str | None, head_window: str | None
    ) -> ComparisonReport: ...

    def metric_history(
        self, config_key: str, metric: str, label: str | None
    ) -> list[HistoryPoint]: ...

    def catalog(self) -> Catalog: ...


class ServiceStore:
    """:class:`WebStore` over the service's SQLite database."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def list_runs(self, filters: RunFilters, limit: int, offset: int) -> list[RunSummary]:
        return store.list_runs(self.db, filters=filters, limit=limit, offset=offset)

    def implementations(self, run_ids: list[int]) -> dict[int, str | None]:
        """``workload.implementation`` of each run's manifest (not part of ``RunSummary``)."""
        if not run_ids:
            return {}
        marks = ",".join("?" * len(run_ids))
        sql = f"SELECT id, manifest_json FROM runs WHERE id IN ({marks})"
        found = self.db.read(lambda c: rows(c, sql, [int(i) for i in run_ids]))
        return {row["id"]: _implementation(row["manifest_json"]) for row in found}

    def get_run(self, run_id: int, *, include_report: bool = True) -> RunDetail:
        return store.get_run(self.db, run_id, include_report=include_report)

    def get_comparison(
        self, base_id: int, head_id: int, base_window: str | None, head_window: str | None
    ) -> ComparisonReport:
        return store.get_comparison(
            self.db, base_id, head_id, base_window=base_window, head_window=head_window
        )

    def metric_history(self, config_key: str, metric: str, label: str | None) -> list[HistoryPoint]:
        return store.metric_history(self.db, config_key=config_key, metric=metric, label=label)

    def catalog(self) -> Catalog:
        return load_catalog()


def _implementation(manifest_json: str | None) -> str | None:
    try:
        workload = (json.loads(manifest_json or "null") or {}).get("workload") or {}
    except (ValueError, AttributeError):
        return None
    value = workload.get("implementation") if isinstance(workload, dict) else None
    return str(value) if value is not None else None


def get_store(db: DbDep) -> WebStore:
    """The store the pages read (overridden in tests)."""
    return ServiceStore(db)


StoreDep = Annotated[WebStore, Depends(get_store)]
RunId = Annotated[int, Path(ge=1, le=2**63 - 1, description="run id (SQLite integer)")]
