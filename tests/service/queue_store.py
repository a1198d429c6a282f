"""One database on either backend for the queue tests: each ``open()`` is a new handle on it
(its own connection or pool), as another process or host would hold."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from service.auth import now_iso
from service.storage import schema
from service.storage.database import Database
from service.storage.engine import Backend, Conn, PostgresDatabase, execute
from service.storage.migrations import apply_migrations


@dataclass
class QueueStore:
    backend: Backend
    url: str
    """The SQLite file's path, or the PostgreSQL database's URL."""
    handles: list[Any] = field(default_factory=list)

    def open(self) -> Database | PostgresDatabase:
        if self.backend is Backend.SQLITE:
            db: Database | PostgresDatabase = Database(Path(self.url), busy_timeout_ms=30000)
            db.write(apply_migrations)
        else:
            db = PostgresDatabase(self.url, pool_size=2)
        self.handles.append(db)
        return db

    def close(self) -> None:
        for db in self.handles:
            db.close()


def add_run(conn: Conn, name: str = "run") -> int:
    """A bare run row (what an analysis task belongs to), in the caller's transaction."""
    insert = sa.insert(schema.runs).values(
        name=name, source="test", status="queued", created_at=now_iso()
    )
    return int(execute(conn, insert.returning(schema.runs.c.id)).scalar())


def rows_of(
    db: Database | PostgresDatabase, table: sa.Table, *columns: str
) -> list[dict[str, Any]]:
    """Every row of ``table`` (those columns), by id."""
    query = sa.select(*(table.c[c] for c in columns)).order_by(table.c.id)
    return db.write(lambda c: execute(c, query).rows)
