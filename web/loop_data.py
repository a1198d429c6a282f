"""Page data of the pull-request loop: pull requests, batches and jobs (one function per page).

As in :mod:`web.data`, each HTML page and its ``.json`` twin are built from the one model its
function returns. A batch is one (commit, suite); its state is the suite's verdict (success,
failure, neutral, error) once published; its jobs link to the runs they uploaded, whose verdict
is the store's (``failed`` for a job that failed or hung).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, Field, field_validator

from service.loop_store import BatchSummary, JobDetail, JobSummary, PullSummary
from service.store import RunFilters, RunSummary
from web.data import FailureView, PageError, failure_view
from web.store import LoopStore

REPO_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9-]{0,38}/[A-Za-z0-9._-]{1,100}$")
JOB_STATUSES = ("queued", "running", "completed", "failed")
RUNS_PER_PULL = 100


def pull_url(repo: str, pr: int) -> str:
    return f"/pulls/{repo}/{pr}"


class PullsPage(BaseModel):
    pulls: list[PullSummary]
    batches: list[BatchSummary]
    """The newest batches of every kind (pull requests and pushes to tracked branches)."""
    total_batches: int


def pulls_page(store: LoopStore, *, limit: int = 50) -> PullsPage:
    return PullsPage(
        pulls=store.list_pulls(limit, 0),
        batches=store.list_batches(None, None, limit, 0),
        total_batches=store.count_batches(None, None),
    )


class PullPage(BaseModel):
    repo: str
    pr_number: int
    head_suites: list[BatchSummary]
    """The newest head's batches: the verdict per suite the pull request shows now."""
    batches: list[BatchSummary]
    runs: list[RunSummary]
    """The runs of this pull request (manifest tags), newest first."""


def pull_page(store: LoopStore, repo: str, pr: int) -> PullPage:
    """:raises PageError: a repository name GitHub would not accept."""
    if not REPO_NAME.match(repo):
        raise PageError(f"repository must be OWNER/NAME; got {repo!r}")
    batches = store.list_batches(repo, pr, 500, 0)
    head = batches[0].head_sha if batches else None
    runs = store.list_runs(RunFilters(repo=repo, pr=pr), RUNS_PER_PULL, 0)
    return PullPage(
        repo=repo,
        pr_number=pr,
        head_suites=sorted((b for b in batches if b.head_sha == head), key=lambda b: b.suite),
        batches=batches,
        runs=runs,
    )


class BatchPage(BaseModel):
    batch: BatchSummary
    jobs: list[JobSummary]
    pull_url: str | None


def batch_page(store: LoopStore, batch_id: int) -> BatchPage:
    batch = store.get_batch(batch_id)
    return BatchPage(
        batch=batch,
        jobs=store.list_jobs(batch_id, None, 500, 0),
        pull_url=pull_url(batch.repo, batch.pr_number) if batch.pr_number is not None else None,
    )


class JobsQuery(BaseModel):
    status: Literal["queued", "running", "completed", "failed"] | None = None
    page: int = Field(default=1, ge=1, le=100_000)
    per_page: int = Field(default=50, ge=1, le=500)

    @field_validator("status", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        """The filter form's "any" submits an empty status."""
        return None if value == "" else value


class JobsPage(BaseModel):
    query: JobsQuery
    jobs: list[JobSummary]


def jobs_page(store: LoopStore, query: JobsQuery) -> JobsPage:
    offset = (query.page - 1) * query.per_page
    return JobsPage(query=query, jobs=store.list_jobs(None, query.status, query.per_page, offset))


class JobPage(BaseModel):
    job: JobDetail
    batch: BatchSummary | None
    failure: FailureView | None
    """How the job's run failed or hung (its bundle's failure record)."""


def job_page(store: LoopStore, job_id: int) -> JobPage:
    job = store.get_job(job_id)
    batch = store.get_batch(job.batch_id) if job.batch_id is not None else None
    failure = None
    if job.run_id is not None:
        failure = failure_view(store.get_run(job.run_id, include_report=False).manifest)
    return JobPage(job=job, batch=batch, failure=failure)
