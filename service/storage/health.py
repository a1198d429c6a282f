"""The queue counts ``/health`` reports, in one statement on either backend (the run count is
``service.storage.runs.total_runs``)."""

from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from service.storage import schema
from service.storage.engine import Conn, execute

_t = schema.analysis_tasks
_j = schema.jobs
_h = schema.worker_heartbeats


@dataclass(frozen=True, slots=True)
class QueueCounts:
    analyses_queued: int
    jobs_queued: int
    oldest_queued_analysis: str | None
    """``created_at`` (ISO) of the oldest queued analysis task."""
    newest_alive_beat: float | None
    """The newest beat (epoch seconds) of any worker that is alive."""


def queue_counts(conn: Conn) -> QueueCounts:
    count = sa.func.count()
    query = sa.select(
        sa.select(count).where(_t.c.status == "queued").scalar_subquery().label("analyses"),
        sa.select(count).where(_j.c.status == "queued").scalar_subquery().label("jobs"),
        sa.select(sa.func.min(_t.c.created_at))
        .where(_t.c.status == "queued")
        .scalar_subquery()
        .label("oldest"),
        sa.select(sa.func.max(_h.c.beat_at))
        .where(_h.c.state == "alive")
        .scalar_subquery()
        .label("beat"),
    )
    row = execute(conn, query).rows[0]
    beat = row["beat"]
    return QueueCounts(
        analyses_queued=int(row["analyses"]),
        jobs_queued=int(row["jobs"]),
        oldest_queued_analysis=row["oldest"],
        newest_alive_beat=None if beat is None else float(beat),
    )
