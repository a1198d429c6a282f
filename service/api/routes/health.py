"""``GET /health`` (readiness, per component) and ``GET /health/live`` (liveness).

Readiness answers 503 as soon as one component is down, so a load balancer stops sending work
and an orchestrator can replace the server: the database does not answer, the supervised
analysis worker is dead or silent, the upload-validation pool is restarting or gave up, the
analysis queue is stalled (work waiting, no worker beating), or the disk under the data
directory is nearly full. Liveness only says the process answers HTTP. Nothing here names a
path or a process id: both routes are public.
"""

from __future__ import annotations

import shutil
import sqlite3
import time
from datetime import datetime
from typing import Literal

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field

from contracts.version import __version__
from service.api.deps import DbDep
from service.core.config import Settings
from service.storage.database import Database
from service.storage.health import queue_counts
from service.storage.heartbeats import last_beat
from service.storage.runs import total_runs
from service.supervisor import ComponentState, WorkerSupervisor

router = APIRouter(prefix="/health", tags=["health"])

Status = Literal["ok", "down"]


class DatabaseHealth(BaseModel):
    status: Status
    error: str | None = None


class WorkerHealth(BaseModel):
    status: Status
    managed: bool = Field(description="this server starts and supervises the worker")
    state: str = Field(description="starting, ok, restarting, failed, stopped; external")
    alive: bool | None = Field(description="the supervised process exists (null: external)")
    restarts: int
    last_exit: str | None
    last_heartbeat_age_s: float | None = Field(description="seconds since a worker last beat")


class ValidationHealth(BaseModel):
    status: Status
    state: str
    processes: int = Field(description="configured validation processes (0: in a thread)")
    alive: int
    restarts: int
    last_exit: str | None


class QueueHealth(BaseModel):
    status: Status
    analyses_queued: int
    oldest_queued_age_s: float | None = Field(description="age of the oldest queued analysis")
    jobs_queued: int


class DiskHealth(BaseModel):
    status: Status
    free_bytes: int
    min_free_bytes: int


class Components(BaseModel):
    database: DatabaseHealth
    worker: WorkerHealth
    validation: ValidationHealth
    queue: QueueHealth
    disk: DiskHealth


class HealthReport(BaseModel):
    """Readiness: ``ok`` is false (and the status 503) when any component is down."""

    ok: bool
    version: str
    runs: int
    analyses_queued: int
    jobs_queued: int
    down: list[str] = Field(description="names of the components that are down")
    components: Components


class Liveness(BaseModel):
    ok: bool
    version: str


@router.get("/live", response_model=Liveness)
async def live() -> Liveness:
    """Liveness: the process answers (restart it when this fails)."""
    return Liveness(ok=True, version=__version__)


def _counts(conn: sqlite3.Connection) -> tuple[int, int, int, str | None, float | None]:
    q = queue_counts(conn)
    return (
        total_runs(conn), q.analyses_queued, q.jobs_queued, q.oldest_queued_analysis,
        q.newest_alive_beat,
    )  # fmt: skip


def _age(iso: str | None, now: float) -> float | None:
    if iso is None:
        return None
    try:
        return max(0.0, now - datetime.fromisoformat(iso).timestamp())
    except ValueError:
        return None


def _worker(
    request: Request, db: Database, settings: Settings, beat_age: float | None, now: float
) -> WorkerHealth:
    supervisor: WorkerSupervisor | None = getattr(request.app.state, "worker_supervisor", None)
    if supervisor is None:  # `--no-worker`: workers run elsewhere; the queue check covers them
        return WorkerHealth(
            status="ok",
            managed=False,
            state="external",
            alive=None,
            restarts=0,
            last_exit=None,
            last_heartbeat_age_s=beat_age,
        )
    st = supervisor.status()
    if st.name is not None:  # the supervised worker's own beat, not any worker's
        try:
            name = st.name
            beat = db.read(lambda c: last_beat(c, name))
            beat_age = None if beat is None else max(0.0, now - beat)
        except Exception:  # the database component reports the failure
            beat_age = None
    started_age = None if st.started_at is None else now - st.started_at
    silent = (beat_age is None or beat_age > settings.health_worker_stale_s) and (
        started_age is None or started_age > settings.health_worker_stale_s
    )
    up = st.alive and st.state is ComponentState.OK and not silent
    return WorkerHealth(
        status="ok" if up else "down",
        managed=True,
        state=st.state.value,
        alive=st.alive,
        restarts=st.restarts,
        last_exit=st.last_exit,
        last_heartbeat_age_s=beat_age,
    )


def _validation(request: Request) -> ValidationHealth:
    from service.uploads_exec import ValidationPool

    pool: ValidationPool | None = getattr(request.app.state, "validation_pool", None)
    if pool is None:
        settings: Settings = request.app.state.settings
        in_thread = settings.ingest_workers == 0
        return ValidationHealth(
            status="ok" if in_thread else "down",
            state="thread" if in_thread else "not started",
            processes=0 if in_thread else settings.ingest_workers,
            alive=0,
            restarts=0,
            last_exit=None,
        )
    st = pool.status()
    return ValidationHealth(status="ok" if pool.healthy() else "down", **st)


@router.get(
    "",
    response_model=HealthReport,
    responses={503: {"model": HealthReport, "description": "a component is down"}},
)
def health(request: Request, response: Response, db: DbDep) -> HealthReport:
    """Readiness: every component's state; 503 when one is down."""
    settings: Settings = request.app.state.settings
    now = time.time()
    try:
        runs, analyses, jobs, oldest, beat = db.read(_counts)
        database = DatabaseHealth(status="ok")
    except Exception as exc:  # the answer is "down", not a 500
        runs = analyses = jobs = 0
        oldest = beat = None
        database = DatabaseHealth(status="down", error=type(exc).__name__)
    beat_age = None if beat is None else max(0.0, now - float(beat))
    oldest_age = _age(oldest, now)
    stalled = (
        oldest_age is not None
        and oldest_age > settings.health_queue_stall_s
        and (beat_age is None or beat_age > settings.health_queue_stall_s)
    )
    try:
        free = shutil.disk_usage(settings.data_dir).free
    except OSError:
        free = 0
    components = Components(
        database=database,
        worker=_worker(request, db, settings, beat_age, now),
        validation=_validation(request),
        queue=QueueHealth(
            status="down" if stalled else "ok",
            analyses_queued=analyses,
            oldest_queued_age_s=oldest_age,
            jobs_queued=jobs,
        ),
        disk=DiskHealth(
            status="ok" if free >= settings.health_min_free_bytes else "down",
            free_bytes=free,
            min_free_bytes=settings.health_min_free_bytes,
        ),
    )
    down = [name for name, part in components if part.status == "down"]
    if down:
        response.status_code = 503
    return HealthReport(
        ok=not down,
        version=__version__,
        runs=runs,
        analyses_queued=analyses,
        jobs_queued=jobs,
        down=down,
        components=components,
    )
