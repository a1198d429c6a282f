"""Read functions over the pull-request loop: pull requests, batches and jobs, for the pages.

The twin of ``service.store`` for the loop's tables (SQL in ``service.storage.loop``, on either
backend); the runs a batch's jobs produced come back as the store's ``RunSummary`` (verdict
included, so a failed job's run reads ``failed`` here as on every other page).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, Field

from service.core.errors import NotFound
from service.storage import loop, runs
from service.storage.database import Database
from service.storage.engine import AnyDatabase
from service.store import RunSummary


class JobSummary(BaseModel):
    """One job of the queue: where it runs, its lease, what it produced."""

    id: int
    name: str | None
    status: str = Field(description="queued | running | completed | failed")
    gpus: int | None = None
    attempts: int | None = None
    max_attempts: int | None = None
    runner: str | None = None
    lease_expires_at: float | None = Field(default=None, description="epoch seconds")
    run_id: int | None = None
    reason: str | None = None
    created_at: str | None = None
    updated_at: str | None = None
    batch_id: int | None = None
    repo: str | None = None
    pr_number: int | None = None
    head_sha: str | None = None
    suite: str | None = None
    run: RunSummary | None = None
    """The run the job uploaded (its verdict: ``failed`` for a job that failed or hung)."""

    @property
    def lease_expires(self) -> str | None:
        """The lease's end as an ISO time (UTC, seconds)."""
        if self.lease_expires_at is None:
            return None
        return datetime.fromtimestamp(self.lease_expires_at, UTC).isoformat(timespec="seconds")


class JobDetail(JobSummary):
    spec: dict[str, Any] | None = None
    log_tail: str | None = None


class BatchSummary(BaseModel):
    """One (commit, suite) of the loop: its state and the comment it posted."""

    id: int
    repo: str
    pr_number: int | None
    head_sha: str
    head_ref: str | None = None
    base_sha: str | None = None
    base_ref: str | None = None
    suite: str
    status: str = Field(description="queued | published | superseded | error")
    state: str | None = Field(default=None, description="success | failure | neutral | error")
    reason: str | None = None
    comment_url: str | None = None
    created_at: str
    updated_at: str | None = None
    published_at: str | None = None
    jobs: int = 0


class PullSummary(BaseModel):
    """One pull request the loop measured, and the newest head it measured."""

    repo: str
    pr_number: int
    head_sha: str
    head_ref: str | None = None
    base_ref: str | None = None
    batches: int
    updated_at: str | None = None
    suites: list[BatchSummary] = Field(default_factory=list)
    """The newest head's batches, one per suite (the verdict per suite)."""


def _with_runs(db: Database, found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    ids = [r["run_id"] for r in found if r.get("run_id") is not None]
    summaries = db.read(lambda c: runs.summaries_by_id(c, run_ids=ids)) if ids else []
    by_id = {s["id"]: s for s in summaries}
    return [{**r, "run": by_id.get(r.get("run_id"))} for r in found]


def list_jobs(
    db: Database,
    *,
    batch_id: int | None = None,
    status: str | None = None,
    limit: int = 50,
    offset: int = 0,
) -> list[JobSummary]:
    found = db.read(
        lambda c: loop.list_jobs(c, batch_id=batch_id, status=status, limit=limit, offset=offset)
    )
    return [JobSummary.model_validate(r) for r in _with_runs(db, found)]


def get_job(db: Database, job_id: int) -> JobDetail:
    """:raises NotFound:."""
    row = db.read(lambda c: loop.get_job(c, job_id=job_id))
    if row is None:
        raise NotFound(f"job {job_id} does not exist")
    spec = row.pop("spec_json")
    (full,) = _with_runs(db, [row])
    return JobDetail.model_validate({**full, "spec": json.loads(spec) if spec else None})


def list_batches(
    db: AnyDatabase,
    *,
    repo: str | None = None,
    pr: int | None = None,
    limit: int = 50,
    offset: int = 0,
) -> list[BatchSummary]:
    found = db.read(lambda c: loop.list_batches(c, repo=repo, pr=pr, limit=limit, offset=offset))
    return [BatchSummary.model_validate(r) for r in found]


def count_batches(db: AnyDatabase, *, repo: str | None = None, pr: int | None = None) -> int:
    return db.read(lambda c: loop.count_batches(c, repo=repo, pr=pr))


def get_batch(db: AnyDatabase, batch_id: int) -> BatchSummary:
    """:raises NotFound:."""
    row = db.read(lambda c: loop.get_batch(c, batch_id=batch_id))
    if row is None:
        raise NotFound(f"batch {batch_id} does not exist")
    return BatchSummary.model_validate(row)


def list_pulls(db: AnyDatabase, *, limit: int = 50, offset: int = 0) -> list[PullSummary]:
    """Pull requests, the newest measured first, each with its newest head's suites."""
    found = db.read(lambda c: loop.list_pulls(c, limit=limit, offset=offset))

    def with_suites(conn: Any) -> list[dict[str, Any]]:
        return [
            {**r, "suites": loop.head_batches(
                conn, repo=r["repo"], pr=r["pr_number"], head_sha=r["head_sha"])}
            for r in found
        ]  # fmt: skip

    return [PullSummary.model_validate(r) for r in db.read(with_suites)]


__all__ = [
    "BatchSummary", "JobDetail", "JobSummary", "PullSummary", "count_batches", "get_batch",
    "get_job", "list_batches", "list_jobs", "list_pulls",
]  # fmt: skip
