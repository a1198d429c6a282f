"""Request and response bodies of the JSON API (the OpenAPI contract runners and CI use)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Path, Query
from pydantic import BaseModel, ConfigDict, Field

from service.github_loop.models import JobCheckout
from service.store import RunSummary

MAX_ID = 2**53 - 1  # exact in JSON numbers (and in SQLite INTEGER): larger ids are a 422

RunId = Annotated[int, Path(ge=1, le=MAX_ID, description="run id")]
JobId = Annotated[int, Path(ge=1, le=MAX_ID, description="job id")]
ComparisonId = Annotated[int, Path(ge=1, le=MAX_ID, description="comparison id")]
Offset = Annotated[int, Query(ge=0, le=MAX_ID)]


class ErrorBody(BaseModel):
    """The one error shape."""

    ok: bool = False
    error: str
    errors: list[Any]
    status: int


class OkBody(BaseModel):
    """A write that has nothing else to say."""

    ok: bool = True


class RunCreate(BaseModel):
    """A run created by hand; traces are added with ``POST /uploads/traces?run_id=``."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=200)
    branch: str | None = Field(default=None, max_length=200)
    commit: str | None = Field(default=None, max_length=100)
    host: str | None = Field(default=None, max_length=200)
    manifest: dict[str, Any] | None = None


class RunPage(BaseModel):
    """One page of the run list."""

    items: list[RunSummary]
    total: int
    limit: int
    offset: int


class UploadResult(BaseModel):
    """What an upload created (or found: ``created`` is False for a repeated upload)."""

    run_id: int
    created: bool
    sha256: str


class ComparisonCreate(BaseModel):
    """Base vs head: two runs, or two window groups (arms) of one run."""

    model_config = ConfigDict(extra="forbid")

    base_run_id: int = Field(ge=1, le=MAX_ID)
    head_run_id: int = Field(ge=1, le=MAX_ID)
    base_window: str | None = Field(default=None, max_length=200)
    head_window: str | None = Field(default=None, max_length=200)


class JobSubmit(BaseModel):
    """A workload spec to run: as YAML text or as the decoded object."""

    model_config = ConfigDict(extra="forbid")

    spec_yaml: str | None = Field(default=None, max_length=1_000_000)
    spec: dict[str, Any] | None = None
    name: str | None = Field(default=None, max_length=200)
    gpus: int = Field(default=0, ge=0, le=1024, description="GPUs the job needs")
    max_attempts: int | None = Field(default=None, ge=1, le=100)


class Job(BaseModel):
    """A queued, running or finished workload job."""

    id: int
    name: str | None
    gpus: int
    status: str  # "queued" | "running" | "completed" | "failed"
    attempts: int
    max_attempts: int
    runner: str | None
    lease_expires_at: float | None
    run_id: int | None
    reason: str | None
    created_at: str
    updated_at: str | None
    spec: dict[str, Any] | None = None
    log_tail: str | None = None


class ClaimRequest(BaseModel):
    """A runner asking for work; waits up to ``wait_s`` seconds for a job (long poll)."""

    runner: str = Field(min_length=1, max_length=200)
    gpus: int = Field(default=0, ge=0, le=1024)
    wait_s: float = Field(default=0, ge=0, le=3600)


class ClaimedJob(BaseModel):
    """The job a runner now holds until ``lease_expires_at`` (unix seconds)."""

    id: int
    spec: dict[str, Any]
    lease_expires_at: float
    checkout: JobCheckout | None = Field(
        default=None, description="pull-request loop jobs: the commit to check out and run at"
    )


class Lease(BaseModel):
    """A renewed lease (unix seconds)."""

    lease_expires_at: float


class JobComplete(BaseModel):
    """The run the job produced."""

    run_id: int | None = Field(default=None, ge=1, le=MAX_ID)


class JobFail(BaseModel):
    """Why the job failed, with the end of its log."""

    reason: str = Field(default="failed", max_length=10_000)
    log_tail: str | None = Field(default=None, max_length=1_000_000)
    run_id: int | None = Field(default=None, ge=1, le=2**63 - 1)
    """The failed job's uploaded bundle (its failure record, stacks and log tail), if any."""


class Runner(BaseModel):
    """A registered agent (registered by its first claim)."""

    name: str
    gpus: int | None
    first_seen: str
    last_seen: str
    current_job_id: int | None


class Health(BaseModel):
    """Liveness plus queue depth."""

    ok: bool
    version: str
    runs: int
    analyses_queued: int
    jobs_queued: int
