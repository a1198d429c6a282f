"""One way to run a statement on either backend: SQLite (the default) or PostgreSQL.

Statements written with SQLAlchemy Core (``service.storage.schema``'s tables) run through
:func:`execute` on the connection a caller holds: a ``sqlite3.Connection`` (the SQLite
``Database``'s writer thread and readers keep their WAL, one-writer and progress-handler
guarantees: the statement is compiled for SQLite and run on that very connection) or a
SQLAlchemy ``Connection`` to PostgreSQL (psycopg 3). :func:`transaction` opens the write
transaction each backend needs for a read-then-update: ``BEGIN IMMEDIATE`` on SQLite (the file's
write lock up front), a plain transaction on PostgreSQL, where claims lock their row with
``SELECT ... FOR UPDATE SKIP LOCKED`` instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.engine import Connection as SaConnection
from sqlalchemy.exc import OperationalError as SaOperationalError
from sqlalchemy.sql.compiler import SQLCompiler

from service.core.errors import QueryTimeout
from service.storage.database import Database, immediate

Conn = sqlite3.Connection | SaConnection
"""What storage functions run on: a SQLite connection or a SQLAlchemy PostgreSQL one."""

_SQLITE = sqlite_dialect.dialect()
T = TypeVar("T")


class Backend(StrEnum):
    SQLITE = "sqlite"
    POSTGRESQL = "postgresql"


class DatabaseUrlError(ValueError):
    """A ``--database`` / ``CPTRACE_DATABASE_URL`` value this service cannot use."""


class DatabaseUnavailable(DatabaseUrlError):
    """The configured PostgreSQL server cannot be reached, or refuses the connection."""


DATABASE_ERRORS: tuple[type[Exception], ...] = (sqlite3.Error, sa.exc.SQLAlchemyError)
# What a lost or unreachable PostgreSQL server raises; rooms above storage name it through here.
ConnectionLost = SaOperationalError


def shown_url(url: str) -> str:
    """A database URL as it may appear in a log line: the password hidden."""
    return sa.engine.make_url(url).render_as_string(hide_password=True)
"""What a statement on either backend raises when the database fails it (busy, gone, locked):
for callers that retry later (a heartbeat) rather than fail."""


def backend_of(url: str) -> Backend:
    """Which backend a database URL names: empty (the data directory's SQLite file) or
    ``postgresql://...`` (``postgres://``, ``postgresql+psycopg://`` too).

    :raises DatabaseUrlError: any other value.
    """
    if not url:
        return Backend.SQLITE
    scheme = url.partition("://")[0].lower()
    if "://" in url and scheme in ("postgresql", "postgres", "postgresql+psycopg"):
        return Backend.POSTGRESQL
    raise DatabaseUrlError(
        f"database URL {url[:40]!r}: expected empty (SQLite in the data directory) or"
        " postgresql://USER@HOST/NAME"
    )


def postgres_engine(url: str, *, pool_size: int = 5) -> sa.Engine:
    """A SQLAlchemy engine on psycopg 3 for a ``postgresql://`` URL (connections are checked
    before use: a restarted server costs one reconnect, not an error)."""
    if backend_of(url) is not Backend.POSTGRESQL:
        raise DatabaseUrlError(f"not a PostgreSQL URL: {url!r}")
    driver_url = sa.make_url(url).set(drivername="postgresql+psycopg")
    return sa.create_engine(driver_url, pool_size=pool_size, pool_pre_ping=True)


@dataclass(slots=True)
class Outcome:
    """What a statement gave back: its rows as dicts (RETURNING or a query) and ``rowcount``."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    rowcount: int = 0

    def first(self) -> dict[str, Any] | None:
        return self.rows[0] if self.rows else None

    def scalar(self) -> Any:
        return next(iter(self.rows[0].values())) if self.rows else None


_COMPILED: dict[Any, SQLCompiler] = {}
_COMPILED_MAX = 1000
_COMPILED_LOCK = threading.Lock()  # reader threads fill the caches concurrently


def _remember(cache: dict[Any, Any], key: Any, value: Any) -> None:
    with _COMPILED_LOCK:
        if len(cache) >= _COMPILED_MAX:
            cache.pop(next(iter(cache)))
        cache[key] = value


def _sqlite_sql(statement: sa.ClauseElement) -> tuple[str, list[Any]]:
    """The statement's SQLite text and positional parameters. Compiled once per statement
    shape (SQLAlchemy's cache key: the statement without its bound values), as a SQLAlchemy
    connection would: compiling the run list's statement cost 20 times the query itself."""
    key = statement._generate_cache_key()
    compiled = _COMPILED.get(key.key) if key is not None else None
    if compiled is None:
        compiled = _SQLITE.statement_compiler(_SQLITE, statement, cache_key=key)
        if key is not None:
            _remember(_COMPILED, key.key, compiled)
    params = compiled.construct_params(
        extracted_parameters=key.bindparams if key is not None else None
    )
    state = compiled.construct_expanded_state(params)  # IN lists expanded to their values
    return state.statement, [state.parameters[name] for name in state.positiontup or ()]


_PREPARED: dict[int, tuple[sa.ClauseElement, SQLCompiler]] = {}


def _sqlite_prepared(
    statement: sa.ClauseElement, values: Mapping[str, Any]
) -> tuple[str, list[Any]]:
    """A statement built once (its values in named ``bindparam``s) compiled once: found by
    identity, no cache key computed per call (the run list's costs more than its query)."""
    found = _PREPARED.get(id(statement))
    if found is None or found[0] is not statement:
        made = statement.compile(dialect=_SQLITE)
        assert isinstance(made, SQLCompiler)  # a statement, not DDL
        found = (statement, made)
        _remember(_PREPARED, id(statement), found)
    compiled = found[1]
    state = compiled.construct_expanded_state(compiled.construct_params(dict(values)))
    return state.statement, [state.parameters[name] for name in state.positiontup or ()]


def execute(
    conn: Conn, statement: sa.Executable, values: Mapping[str, Any] | None = None
) -> Outcome:
    """Run one Core statement on ``conn`` (either backend), inside whatever transaction the
    caller holds. ``values``: the statement's named ``bindparam``s, for a statement built once
    and kept (it is then compiled once for SQLite)."""
    if isinstance(conn, sqlite3.Connection):
        assert isinstance(statement, sa.ClauseElement)
        if values is None:
            sql, params = _sqlite_sql(statement)
        else:
            sql, params = _sqlite_prepared(statement, values)
        cur = conn.cursor()
        cur.row_factory = None
        cur.execute(sql, params)
        found: list[dict[str, Any]] = []
        if cur.description is not None:
            names = [d[0] for d in cur.description]
            found = [dict(zip(names, row, strict=True)) for row in cur.fetchall()]
        return Outcome(found, cur.rowcount)
    result = conn.execute(statement, dict(values) if values is not None else None)
    rows: list[dict[str, Any]] = []
    if result.returns_rows:
        # plain str names (SQLAlchemy's are ``quoted_name``, a subclass orjson refuses as keys)
        keys = [str(name) for name in result.keys()]  # noqa: SIM118 (a Result, not a dict)
        rows = [dict(zip(keys, row, strict=True)) for row in result]
    return Outcome(rows, result.rowcount)


@contextlib.contextmanager
def transaction(conn: Conn) -> Iterator[Conn]:
    """A write transaction for a read-then-update: ``BEGIN IMMEDIATE`` on SQLite; on
    PostgreSQL a transaction (nested as a savepoint when the caller already holds one)."""
    if isinstance(conn, sqlite3.Connection):
        with immediate(conn):
            yield conn
        return
    with conn.begin_nested() if conn.in_transaction() else conn.begin():
        yield conn


def lock_name(conn: Conn, name: str) -> None:
    """Serialise the callers' transactions that lock the same ``name`` (until they end), for a
    read-then-insert that a unique index alone would turn into an error (two API processes
    recording the same upload): on PostgreSQL a transaction-level advisory lock; on SQLite
    nothing, as the caller's ``BEGIN IMMEDIATE`` already holds the file's write lock."""
    if isinstance(conn, sqlite3.Connection):
        return
    key = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)
    conn.execute(sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})


@contextlib.contextmanager
def postgres_read_limit(conn: SaConnection, ms: int) -> Iterator[None]:
    """Run the caller's reads under ``statement_timeout`` (PostgreSQL's twin of the SQLite
    progress handler): a slow query is cancelled by the server, and surfaces as
    ``QueryTimeout``."""
    with conn.begin():
        conn.execute(sa.text(f"SET LOCAL statement_timeout = {int(ms)}"))
        try:
            yield
        except SaOperationalError as exc:
            if getattr(exc.orig, "sqlstate", None) == "57014":  # query_canceled
                raise QueryTimeout(f"query took longer than the read time limit ({ms} ms)") from exc
            raise


class PostgresDatabase:
    """A PostgreSQL database behind the same ``write``/``read`` calls as the SQLite
    ``Database``: ``write(fn)`` runs ``fn(conn)`` in one transaction (committed when ``fn``
    returns, rolled back when it raises); ``read(fn)`` runs it under ``statement_timeout``.
    Connections come from a pool, so threads and processes write concurrently; the server
    serialises what must be (row locks), which is what lets many hosts share it."""

    backend = Backend.POSTGRESQL

    def __init__(self, url: str, *, read_time_limit_ms: int = 2000, pool_size: int = 5):
        self.url = url
        self.read_time_limit_ms = read_time_limit_ms
        self.engine = postgres_engine(url, pool_size=pool_size)

    def apply_schema(self) -> list[str]:
        """Create the tables when the database has none (``schema.create_postgres_schema``)."""
        from service.storage.schema import create_postgres_schema

        try:
            with self.engine.begin() as conn:
                return create_postgres_schema(conn)
        except SaOperationalError as exc:  # no server, wrong password, no such database
            shown = self.engine.url.render_as_string(hide_password=True)
            reason = str(exc.orig or exc).strip().splitlines()[0]
            raise DatabaseUnavailable(f"cannot open the database {shown}: {reason}") from None

    def write(self, fn: Callable[[SaConnection], T]) -> T:
        with self.engine.begin() as conn:
            return fn(conn)

    write_tx = write

    async def awrite(self, fn: Callable[[SaConnection], T]) -> T:
        """``write`` from async code: on a thread, the event loop stays free."""
        return await asyncio.to_thread(self.write, fn)

    def read(self, fn: Callable[[SaConnection], T], *, time_limit_ms: int | None = None) -> T:
        with (
            self.engine.connect() as conn,
            postgres_read_limit(conn, time_limit_ms or self.read_time_limit_ms),
        ):
            return fn(conn)

    def read_tagged(
        self, fn: Callable[[SaConnection, str], T], *, time_limit_ms: int | None = None
    ) -> T:
        """``read``, and ``fn`` also gets a tag of the database state it sees (the twin of
        the SQLite ``Database.read_tagged``, for the HTTP ETag).

        The read runs in one ``REPEATABLE READ`` transaction whose first statement takes its
        snapshot (``pg_current_snapshot()``: the oldest transaction still running, the next id
        to be assigned, the ones in flight): every query of ``fn`` sees exactly that snapshot,
        and two equal snapshots show the same committed data, whatever connection or host
        they were taken on. A write anywhere in the server moves it (a tag changes more often
        than the data, never less).
        """
        ms = time_limit_ms or self.read_time_limit_ms
        with (
            self.engine.connect() as plain,
            postgres_read_limit(plain.execution_options(isolation_level="REPEATABLE READ"), ms),
        ):
            snapshot = plain.execute(sa.text("SELECT pg_current_snapshot()::text")).scalar_one()
            return fn(plain, f"pg.{snapshot}")

    def close(self) -> None:
        self.engine.dispose()


def insert_for(conn: Conn, table: sa.Table) -> Any:
    """The backend's own ``INSERT`` construct for ``table`` (``on_conflict_do_update`` /
    ``on_conflict_do_nothing``, the upsert both backends have, are dialect constructs)."""
    from sqlalchemy.dialects.postgresql import insert as postgresql_insert
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return (sqlite_insert if isinstance(conn, sqlite3.Connection) else postgresql_insert)(table)


AnyDatabase = Database | PostgresDatabase
"""A database handle on either backend (``write``, ``write_tx`` and ``read`` on both)."""
