"""The database a benchmark runs on, named by its ``--database`` option.

``sqlite`` (the default): the data directory's SQLite file. ``postgresql``: a throwaway local
cluster in a temp folder (the tests' server, ``tests/service/postgres_server.py``: Debian's
``postgresql``, ``fsync=off``), so one command measures PostgreSQL with nothing to set up.
A ``postgresql://...`` URL: that (empty) database.
"""

from __future__ import annotations

import contextlib
import sqlite3
import sys
from collections.abc import Iterator
from pathlib import Path

import sqlalchemy as sa

REPO = Path(__file__).resolve().parent.parent


def choice_help() -> str:
    return "sqlite (default), postgresql (a throwaway local cluster) or a postgresql:// URL"


@contextlib.contextmanager
def database_url(choice: str) -> Iterator[str]:
    """The database URL for ``choice`` ('' is SQLite in the data directory), for the block."""
    if choice == "sqlite":
        yield ""
        return
    if choice != "postgresql":
        yield choice
        return
    sys.path.insert(0, str(REPO / "tests" / "service"))
    from postgres_server import postgres_missing, running_postgres

    missing = postgres_missing()
    if missing is not None:
        raise SystemExit(f"--database postgresql: {missing}")
    with running_postgres() as server:
        yield server.new_database()


def copy_into_postgres(sqlite_path: Path, url: str) -> None:
    """Copy every application table of a populated SQLite file into the PostgreSQL database
    of ``url`` (its schema already made), and move each identity past the copied ids."""
    from service.storage.engine import postgres_engine
    from service.storage.schema import APPLICATION_TABLES

    source = sqlite3.connect(sqlite_path)
    engine = postgres_engine(url, pool_size=1)
    try:
        with engine.begin() as conn:
            for table in APPLICATION_TABLES:
                names = [c.name for c in table.columns]
                cursor = source.execute(f"SELECT {', '.join(names)} FROM {table.name}")
                while batch := cursor.fetchmany(5000):
                    conn.execute(table.insert(), [dict(zip(names, r, strict=True)) for r in batch])
                if "id" in names and table.c.id.identity is not None:
                    conn.execute(
                        sa.text(
                            f"SELECT setval(pg_get_serial_sequence('{table.name}', 'id'),"
                            f" coalesce((SELECT max(id) FROM {table.name}), 0) + 1, false)"
                        )
                    )
    finally:
        engine.dispose()
        source.close()


def analyze_postgres(url: str) -> None:
    """``VACUUM ANALYZE``: the planner's statistics of the rows just inserted, as autovacuum
    leaves a server in steady use (a fresh table's plans can be far off)."""
    from service.storage.engine import postgres_engine

    engine = postgres_engine(url, pool_size=1).execution_options(isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as conn:
            conn.execute(sa.text("VACUUM ANALYZE"))
    finally:
        engine.dispose()
