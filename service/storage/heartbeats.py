"""Every statement on ``worker_heartbeats``, on either backend: an analysis worker records
that it lives (``service.worker``); the supervisor and ``/health`` read when it last did."""

from __future__ import annotations

import sqlalchemy as sa

from service.storage import schema
from service.storage.engine import Conn, execute, insert_for

_h = schema.worker_heartbeats

HISTORY_S = 86400.0
"""Rows of workers silent this long are history, not state (``prune_heartbeats``)."""


def record_beat(conn: Conn, *, name: str, started_at: str, beat_at: float, state: str) -> None:
    """The worker ``name`` (``host:pid``) is ``state`` (alive | stopped) at ``beat_at``; its
    first beat also records when it started."""
    insert = insert_for(conn, _h).values(
        name=name, started_at=started_at, beat_at=beat_at, state=state
    )
    upsert = insert.on_conflict_do_update(
        index_elements=[_h.c.name],
        set_={"beat_at": insert.excluded.beat_at, "state": insert.excluded.state},
    )
    execute(conn, upsert)


def prune_heartbeats(conn: Conn, *, now: float) -> int:
    """Delete the rows of workers silent for ``HISTORY_S``; returns how many."""
    return execute(conn, sa.delete(_h).where(_h.c.beat_at < now - HISTORY_S)).rowcount


def last_beat(conn: Conn, name: str) -> float | None:
    """When worker ``name`` last beat (epoch seconds), or None when it never did."""
    found = execute(conn, sa.select(_h.c.beat_at).where(_h.c.name == name)).scalar()
    return None if found is None else float(found)
