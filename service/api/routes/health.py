"""``GET /health``: liveness for healthchecks and load balancers."""

from __future__ import annotations

import sqlite3

from fastapi import APIRouter

from contracts.version import __version__
from service.api.deps import DbDep
from service.api.schemas import Health

router = APIRouter(prefix="/health", tags=["health"])


@router.get("", response_model=Health)
def health(db: DbDep) -> Health:
    """Service is up and the database answers."""

    def counts(conn: sqlite3.Connection) -> tuple[int, int, int]:
        q = (
            "SELECT (SELECT count(*) FROM runs), "
            "(SELECT count(*) FROM analysis_tasks WHERE status = 'queued'), "
            "(SELECT count(*) FROM jobs WHERE status = 'queued')"
        )
        runs, analyses, jobs = conn.execute(q).fetchone()
        return int(runs), int(analyses), int(jobs)

    runs, analyses, jobs = db.read(counts)
    return Health(
        ok=True, version=__version__, runs=runs, analyses_queued=analyses, jobs_queued=jobs
    )
