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
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.dialects import sqlite as sqlite_dialect
from sqlalchemy.engine import Connection as SaConnection
from sqlalchemy.exc import OperationalError as SaOperationalError
from sqlalchemy.sql.compiler import SQLCompiler

from service.core.errors import DatabaseFault, QueryTimeout
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
"""What a statement on either backend raises when the database fails it (busy, gone, locked):
for callers that retry later (a heartbeat) rather than fail."""


def shown_url(url: str) -> str:
    """A database URL as it may appear in a log line: the password hidden."""
    return sa.engine.make_url(url).render_as_string(hide_password=True)


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


IDLE_PING_S = 10.0
"""A pooled PostgreSQL connection idle longer than this is pinged before use (a server
restarted meanwhile costs a reconnect, not an error); one in steady use is not (a ping is a
round trip per read)."""


class Pings:
    """When a pooled connection is pinged before use: after it idled ``IDLE_PING_S``, or when
    a connection of any engine sharing this object was found lost since it was last used (the
    server went away: every older connection is suspect, the other pool's too)."""

    def __init__(self) -> None:
        self.lost_at = 0.0  # time.monotonic() of the last connection found lost

    def due(self, idle_since: float) -> bool:
        return idle_since < self.lost_at or time.monotonic() - idle_since > IDLE_PING_S


def postgres_engine(
    url: str,
    *,
    pool_size: int = 5,
    max_overflow: int = 10,
    settings: Mapping[str, int | str] | None = None,
    autocommit: bool = False,
    pings: Pings | None = None,
) -> sa.Engine:
    """A SQLAlchemy engine on psycopg 3 for a ``postgresql://`` URL.

    ``settings``: server parameters set once per connection at connect time (``-c name=value``
    in the startup packet: no round trip per use), e.g. ``statement_timeout``. ``autocommit``:
    each statement its own transaction (a single-statement read costs one round trip, not
    BEGIN/COMMIT around it). Connections are pinged before use only when ``pings`` says so
    (idle, or after a lost connection), not on every checkout.
    """
    if backend_of(url) is not Backend.POSTGRESQL:
        raise DatabaseUrlError(f"not a PostgreSQL URL: {url!r}")
    driver_url = sa.make_url(url).set(drivername="postgresql+psycopg")
    connect_args = {}
    if settings:
        connect_args["options"] = " ".join(f"-c {name}={value}" for name, value in settings.items())
    engine = sa.create_engine(
        driver_url,
        pool_size=pool_size,
        max_overflow=max_overflow,
        connect_args=connect_args,
        isolation_level="AUTOCOMMIT" if autocommit else None,
    )
    _ping_when_due(engine, pings or Pings())
    return engine


def _ping_when_due(engine: sa.Engine, pings: Pings) -> None:
    @sa.event.listens_for(engine, "handle_error")
    def on_error(context: Any) -> None:
        if context.is_disconnect:  # SQLAlchemy drops this connection; the others are suspect
            pings.lost_at = time.monotonic()

    @sa.event.listens_for(engine, "checkin")
    def checkin(dbapi_conn: Any, record: Any) -> None:
        record.info["idle_since"] = time.monotonic()

    @sa.event.listens_for(engine, "checkout")
    def checkout(dbapi_conn: Any, record: Any, proxy: Any) -> None:
        since = record.info.get("idle_since")
        if since is None or not pings.due(since):  # new, or in steady use
            return
        try:
            alive = engine.dialect.do_ping(dbapi_conn)
        except Exception:  # any failure of the ping: the connection is gone
            alive = False
        if not alive:  # the pool drops this connection and checks out a fresh one
            raise sa.exc.DisconnectionError("connection found dead before use")


_BUSY_SQLSTATES = frozenset(
    {
        "55P03",  # lock_not_available (lock_timeout)
        "40001",  # serialization_failure
        "40P01",  # deadlock_detected
        "53300",  # too_many_connections
        "53400",  # configuration_limit_exceeded
    }
)


_CONNECTION_LIMIT = "too many connections"
"""The server's message when it refuses a connection over a limit (53300): refused while
connecting, libpq gives the message but no SQLSTATE (servers set to English messages)."""


def database_fault(exc: BaseException) -> DatabaseFault | None:
    """Whether ``exc`` is a busy or unavailable database (either backend), or None for any
    other error (a bad statement is a bug, not a fault to retry)."""
    if isinstance(exc, sqlite3.OperationalError):
        text = str(exc)
        return DatabaseFault.BUSY if "locked" in text or "busy" in text else None
    if isinstance(exc, sa.exc.TimeoutError):  # no pooled connection free within pool_timeout
        return DatabaseFault.BUSY
    if not isinstance(exc, sa.exc.DBAPIError):
        return None
    sqlstate = getattr(exc.orig, "sqlstate", None)
    if sqlstate in _BUSY_SQLSTATES:
        return DatabaseFault.BUSY
    if sqlstate is None and _CONNECTION_LIMIT in str(exc.orig):
        return DatabaseFault.BUSY
    if exc.connection_invalidated or isinstance(exc, SaOperationalError | sa.exc.InterfaceError):
        return DatabaseFault.UNAVAILABLE
    return None


def fault_reason(exc: BaseException) -> str:
    """The first line of the database's own message (no statement, no parameters)."""
    orig = getattr(exc, "orig", None) or exc
    lines = str(orig).strip().splitlines()
    return lines[0] if lines else type(orig).__name__


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
def _read_limit_errors(ms: int) -> Iterator[None]:
    """A statement the server cancelled at ``statement_timeout`` surfaces as ``QueryTimeout``."""
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
    serialises what must be (row locks), which is what lets many hosts share it.

    Two pools, each connection's settings fixed when it connects: writes wait on a lock at
    most ``busy_timeout_ms`` (``lock_timeout``, the twin of SQLite's busy timeout: a held lock
    answers "busy", never hangs a request); reads run read-only in autocommit with
    ``statement_timeout`` at the read time limit (the twin of the SQLite progress handler),
    so a read of one statement is one round trip: no BEGIN, SET LOCAL, COMMIT around it.
    Each statement of a read sees its own snapshot, as in the READ COMMITTED transaction it
    replaces and as on SQLite, whose readers are in autocommit too.
    """

    backend = Backend.POSTGRESQL
    network_reads = True
    """A read waits on round trips to the server: async code runs it on a thread, or the
    event loop (every other request) would wait with it."""

    def __init__(
        self,
        url: str,
        *,
        read_time_limit_ms: int = 2000,
        busy_timeout_ms: int = 10000,
        pool_size: int = 5,
    ):
        self.url = url
        self.read_time_limit_ms = read_time_limit_ms
        pings = Pings()  # a connection lost in either pool: both ping before their next use
        self.engine = postgres_engine(
            url, pool_size=pool_size, settings={"lock_timeout": int(busy_timeout_ms)}, pings=pings
        )
        self.reader = postgres_engine(
            url,
            pool_size=pool_size,
            pings=pings,
            settings={
                "statement_timeout": int(read_time_limit_ms),
                "default_transaction_read_only": "on",
            },
            autocommit=True,
        )

    def apply_schema(self) -> list[str]:
        """Create the tables when the database has none (``schema.create_postgres_schema``)."""
        from service.storage.schema import create_postgres_schema

        try:
            with self.engine.begin() as conn:
                return create_postgres_schema(conn)
        except SaOperationalError as exc:  # no server, wrong password, no such database
            shown = self.engine.url.render_as_string(hide_password=True)
            raise DatabaseUnavailable(
                f"cannot open the database {shown}: {fault_reason(exc)}"
            ) from None

    def write(self, fn: Callable[[SaConnection], T]) -> T:
        with self.engine.begin() as conn:
            return fn(conn)

    write_tx = write

    async def awrite(self, fn: Callable[[SaConnection], T]) -> T:
        """``write`` from async code: on a thread, the event loop stays free."""
        return await asyncio.to_thread(self.write, fn)

    @contextlib.contextmanager
    def _reading(self, ms: int | None) -> Iterator[SaConnection]:
        """A read connection under the time limit ``ms`` (the connection's own unless the
        caller names another: then for this read only, in a transaction of its own)."""
        limit = ms or self.read_time_limit_ms
        with self.reader.connect() as conn, _read_limit_errors(limit):
            if limit == self.read_time_limit_ms:
                yield conn
                return
            tx_conn = conn.execution_options(isolation_level="READ COMMITTED")
            with tx_conn.begin():
                tx_conn.execute(sa.text(f"SET LOCAL statement_timeout = {int(limit)}"))
                yield tx_conn

    def read(self, fn: Callable[[SaConnection], T], *, time_limit_ms: int | None = None) -> T:
        with self._reading(time_limit_ms) as conn:
            return fn(conn)

    def read_tagged(
        self, fn: Callable[[SaConnection, str], T], *, time_limit_ms: int | None = None
    ) -> T:
        """``read``, and ``fn`` also gets a tag of the database state it sees (the twin of
        the SQLite ``Database.read_tagged``, for the HTTP ETag).

        The tag is the server's snapshot (``pg_current_snapshot()``: the oldest transaction
        still running, the next id to be assigned, the ones in flight), taken by the read's
        first statement, before ``fn`` queries, in autocommit as on SQLite: a commit landing
        in between can only make the tag older than the data (the next request then answers
        in full), never newer, since any commit changes the snapshot and two equal snapshots
        mean nothing committed in between, whatever connection or host took them. No
        transaction around the read: two round trips (``BEGIN``, ``COMMIT``) fewer.
        """
        with self._reading(time_limit_ms) as conn:
            snapshot = conn.execute(sa.text("SELECT pg_current_snapshot()::text")).scalar_one()
            return fn(conn, f"pg.{snapshot}")

    def close(self) -> None:
        self.engine.dispose()
        self.reader.dispose()


def insert_for(conn: Conn, table: sa.Table) -> Any:
    """The backend's own ``INSERT`` construct for ``table`` (``on_conflict_do_update`` /
    ``on_conflict_do_nothing``, the upsert both backends have, are dialect constructs)."""
    from sqlalchemy.dialects.postgresql import insert as postgresql_insert
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return (sqlite_insert if isinstance(conn, sqlite3.Connection) else postgresql_insert)(table)


AnyDatabase = Database | PostgresDatabase
"""A database handle on either backend (``write``, ``write_tx`` and ``read`` on both)."""
