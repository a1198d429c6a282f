"""What the pages read, as one small interface over ``service.store``.

The routes depend on :class:`WebStore`, not on the database, so page tests can swap in an
in-memory store (``app.dependency_overrides[get_store]``) while the real app binds
:class:`ServiceStore` to the service's ``Database`` through ``service.api.deps.DbDep``.
"""

from __future__ import annotations

from typing import Annotated, Literal, Protocol

from fastapi import Depends

from analyzers.catalog import Catalog, load_catalog
from analyzers.report import ComparisonReport
from service import loop_store, store
from service.api.deps import DbDep
from service.api.schemas import RunId as RunId
from service.loop_store import BatchSummary, JobDetail, JobSummary, PullSummary
from service.page_summary import BuiltPage, RunPageSummary
from service.storage.engine import AnyDatabase
from service.store import HistoryPoint, RunDetail, RunFilters, RunSummary


class WebStore(Protocol):
    """The read functions the dashboards use (a subset of ``service.store``)."""

    def list_runs(
        self,
        filters: RunFilters,
        limit: int,
        offset: int,
        sort: str = "id",
        order: Literal["asc", "desc"] = "desc",
    ) -> list[RunSummary]: ...

    def count_runs(self, filters: RunFilters) -> int: ...

    def run_list_options(self) -> dict[str, list[str]]: ...

    def get_run(self, run_id: int, *, include_report: bool = True) -> RunDetail: ...

    def get_page_summary(self, run_id: int) -> RunPageSummary | None: ...

    def get_page_parts(self, run_id: int, version: str) -> BuiltPage | None: ...

    def store_page_parts(
        self, run_id: int, version: str, summary_stamp: str, page: BuiltPage
    ) -> bool: ...

    def get_comparison(
        self, base_id: int, head_id: int, base_window: str | None, head_window: str | None
    ) -> ComparisonReport: ...

    def metric_history(
        self, config_key: str, metric: str, label: str | None
    ) -> list[HistoryPoint]: ...

    def catalog(self) -> Catalog: ...


class ServiceStore:
    """:class:`WebStore` over the service's database (SQLite or PostgreSQL)."""

    def __init__(self, db: AnyDatabase) -> None:
        self.db = db

    def list_runs(
        self,
        filters: RunFilters,
        limit: int,
        offset: int,
        sort: str = "id",
        order: Literal["asc", "desc"] = "desc",
    ) -> list[RunSummary]:
        return store.list_runs(
            self.db, filters=filters, limit=limit, offset=offset, sort=sort, order=order
        )

    def count_runs(self, filters: RunFilters) -> int:
        return store.count_runs(self.db, filters=filters)

    def run_list_options(self) -> dict[str, list[str]]:
        return store.run_list_options(self.db)

    def get_run(self, run_id: int, *, include_report: bool = True) -> RunDetail:
        return store.get_run(self.db, run_id, include_report=include_report)

    def get_page_summary(self, run_id: int) -> RunPageSummary | None:
        return store.get_page_summary(self.db, run_id)

    def get_page_parts(self, run_id: int, version: str) -> BuiltPage | None:
        return store.get_page_parts(self.db, run_id, version)

    def store_page_parts(
        self, run_id: int, version: str, summary_stamp: str, page: BuiltPage
    ) -> bool:
        return store.store_page_parts(self.db, run_id, version, summary_stamp, page)

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


def get_store(db: DbDep) -> WebStore:
    """The store the pages read (overridden in tests)."""
    return ServiceStore(db)


StoreDep = Annotated[WebStore, Depends(get_store)]


class LoopStore(Protocol):
    """The pull-request loop's reads the loop pages use (``service.loop_store``)."""

    def list_pulls(self, limit: int, offset: int) -> list[PullSummary]: ...

    def list_batches(
        self, repo: str | None, pr: int | None, limit: int, offset: int
    ) -> list[BatchSummary]: ...

    def count_batches(self, repo: str | None, pr: int | None) -> int: ...

    def get_batch(self, batch_id: int) -> BatchSummary: ...

    def list_jobs(
        self, batch_id: int | None, status: str | None, limit: int, offset: int
    ) -> list[JobSummary]: ...

    def get_job(self, job_id: int) -> JobDetail: ...

    def get_run(self, run_id: int, *, include_report: bool = True) -> RunDetail: ...

    def list_runs(
        self, filters: RunFilters, limit: int, offset: int, sort: str = "id",
        order: Literal["asc", "desc"] = "desc",
    ) -> list[RunSummary]: ...  # fmt: skip


class ServiceLoopStore(ServiceStore):
    """:class:`LoopStore` over the service's database (SQLite or PostgreSQL)."""

    def list_pulls(self, limit: int, offset: int) -> list[PullSummary]:
        return loop_store.list_pulls(self.db, limit=limit, offset=offset)

    def list_batches(
        self, repo: str | None, pr: int | None, limit: int, offset: int
    ) -> list[BatchSummary]:
        return loop_store.list_batches(self.db, repo=repo, pr=pr, limit=limit, offset=offset)

    def count_batches(self, repo: str | None, pr: int | None) -> int:
        return loop_store.count_batches(self.db, repo=repo, pr=pr)

    def get_batch(self, batch_id: int) -> BatchSummary:
        return loop_store.get_batch(self.db, batch_id)

    def list_jobs(
        self, batch_id: int | None, status: str | None, limit: int, offset: int
    ) -> list[JobSummary]:
        return loop_store.list_jobs(
            self.db, batch_id=batch_id, status=status, limit=limit, offset=offset
        )

    def get_job(self, job_id: int) -> JobDetail:
        return loop_store.get_job(self.db, job_id)


def get_loop_store(db: DbDep) -> LoopStore:
    """The store the loop pages read."""
    return ServiceLoopStore(db)


LoopStoreDep = Annotated[LoopStore, Depends(get_loop_store)]
