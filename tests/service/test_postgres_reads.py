"""Reads on PostgreSQL: one round trip for a one-statement read, the read time limit kept.

A read runs on a connection whose ``statement_timeout`` and read-only default were set when it
connected, in autocommit: the statements of the read are the only ones sent (no ping, no
BEGIN, no SET LOCAL, no COMMIT), and the server still cancels a read over the limit.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from postgres_server import PostgresServer

from service.core.errors import QueryTimeout
from service.storage import runs
from service.storage.engine import PostgresDatabase


@pytest.fixture
def db(postgres: PostgresServer) -> Iterator[PostgresDatabase]:
    database = PostgresDatabase(postgres.new_database(), read_time_limit_ms=300)
    yield database
    database.close()


def _sent(engine: sa.Engine) -> list[str]:
    """The statements SQLAlchemy sends on ``engine`` from now on (pings and BEGIN/COMMIT are
    not statements of a cursor: the transaction state below tells about those)."""
    sent: list[str] = []

    @sa.event.listens_for(engine, "before_cursor_execute")
    def record(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        sent.append(statement)

    return sent


def test_a_one_statement_read_sends_only_its_statement(db: PostgresDatabase) -> None:
    db.read(runs.total_runs)  # a pooled connection exists: what follows is the steady state
    sent = _sent(db.reader)

    def read(conn: sa.Connection) -> tuple[int, Any, str, str]:
        total = runs.total_runs(conn)
        status = conn.connection.dbapi_connection.info.transaction_status  # type: ignore[union-attr]
        timeout = conn.execute(sa.text("SHOW statement_timeout")).scalar_one()
        read_only = conn.execute(sa.text("SHOW transaction_read_only")).scalar_one()
        return total, status, timeout, read_only

    total, status, timeout, read_only = db.read(read)
    assert total == 0
    assert status is psycopg.pq.TransactionStatus.IDLE  # no transaction left open: autocommit
    assert (timeout, read_only) == ("300ms", "on")  # set at connect time, not per read
    assert len(sent) == 3 and "count" in sent[0].lower()  # the read's statements, nothing else


def test_the_read_time_limit_holds_without_a_set_per_read(db: PostgresDatabase) -> None:
    sleep = sa.text("SELECT pg_sleep(5)")
    for read in (
        lambda: db.read(lambda c: c.execute(sleep)),
        lambda: db.read_tagged(lambda c, tag: c.execute(sleep)),
    ):
        started = time.monotonic()
        with pytest.raises(QueryTimeout, match="300 ms"):
            read()
        assert time.monotonic() - started < 3
    # a caller's own limit holds for that read only
    with pytest.raises(QueryTimeout, match="100 ms"):
        db.read(lambda c: c.execute(sa.text("SELECT pg_sleep(1)")), time_limit_ms=100)
    assert db.read(lambda c: c.execute(sa.text("SHOW statement_timeout")).scalar_one()) == "300ms"


def test_a_read_cannot_write(db: PostgresDatabase) -> None:
    insert = sa.text("INSERT INTO tokens (name) VALUES ('x')")
    with pytest.raises(sa.exc.InternalError, match="read-only transaction"):
        db.read(lambda c: c.execute(insert))


def test_the_tag_moves_with_every_write_and_only_then(db: PostgresDatabase) -> None:
    def tagged(conn: sa.Connection, tag: str) -> tuple[str, int]:
        return tag, runs.total_runs(conn)

    tag, total = db.read_tagged(tagged)
    assert tag.startswith("pg.") and total == 0
    assert db.read_tagged(tagged) == (tag, 0)  # nothing written: the same tag
    db.write(lambda c: runs.create_run(c, name="r", source="api", status="empty"))
    moved, total = db.read_tagged(tagged)
    assert moved != tag and total == 1
