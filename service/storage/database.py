"""SQLite access: WAL, busy timeout, one writer thread, reads under a time limit.

Datasette's design: every write in this process is a callable put on a queue and run by one
dedicated thread on one connection (``write``), so writers never contend with each other inside
the process; reads use one connection per thread (``read``) and run under a progress-handler time
limit so a slow query cannot pin a server thread. Other processes (the analysis worker) write
through their own ``Database`` and meet this one at SQLite's file lock, which ``busy_timeout``
waits on.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import sqlite_utils

from service.core.errors import QueryTimeout

T = TypeVar("T")

_STOP = object()


def connect(path: Path, *, busy_timeout_ms: int) -> sqlite3.Connection:
    """Open a connection in autocommit mode (transactions are explicit) with WAL and timeouts."""
    conn = sqlite3.connect(
        str(path), timeout=busy_timeout_ms / 1000, isolation_level=None, check_same_thread=False
    )
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
    conn.execute("PRAGMA journal_mode = WAL")
    # NORMAL is durable across application crashes in WAL mode (only an OS crash can lose the
    # last transactions), which is the failure the SIGKILL tests exercise.
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("PRAGMA foreign_keys = ON")
    return conn


@contextlib.contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``: take the write lock up front so a read-then-update
    (a job claim) cannot be interleaved with another process's write."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


@contextlib.contextmanager
def time_limit(conn: sqlite3.Connection, ms: int) -> Iterator[None]:
    """Abort the statement running on ``conn`` once ``ms`` milliseconds have passed."""
    deadline = time.monotonic() + ms / 1000

    def handler() -> int:
        return 1 if time.monotonic() > deadline else 0

    conn.set_progress_handler(handler, 1000)
    try:
        yield
    except sqlite3.OperationalError as exc:
        if "interrupted" in str(exc):
            raise QueryTimeout(f"query took longer than the read time limit ({ms} ms)") from exc
        raise
    finally:
        conn.set_progress_handler(None, 1000)


class Database:
    """One SQLite file: a writer thread with its own connection, plus per-thread readers."""

    network_reads = False
    """A read is a local file's pages (microseconds): async code may run it inline."""

    def __init__(self, path: Path, *, busy_timeout_ms: int = 10000, read_time_limit_ms: int = 2000):
        self.path = Path(path)
        self.busy_timeout_ms = busy_timeout_ms
        self.read_time_limit_ms = read_time_limit_ms
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._queue: queue.Queue[Any] = queue.Queue()
        self._writer: threading.Thread | None = None
        self._write_conn: sqlite3.Connection | None = None

    # -- writes -------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the writer thread (idempotent)."""
        if self._writer is not None:
            return
        self._write_conn = connect(self.path, busy_timeout_ms=self.busy_timeout_ms)
        self._writer = threading.Thread(target=self._run_writes, name="cptrace-writer", daemon=True)
        self._writer.start()

    def _run_writes(self) -> None:
        assert self._write_conn is not None
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            fn, future = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(self._write_conn))
            except BaseException as exc:  # the caller gets the exception, the thread lives on
                if self._write_conn.in_transaction:
                    self._write_conn.execute("ROLLBACK")
                future.set_exception(exc)

    def submit(self, fn: Callable[[sqlite3.Connection], T]) -> Future[T]:
        """Queue ``fn(conn)`` for the writer thread; the future holds its result."""
        if self._writer is None:
            self.start()
        future: Future[T] = Future()
        self._queue.put((fn, future))
        return future

    def write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(conn)`` on the writer thread and wait for it (from sync code)."""
        return self.submit(fn).result()

    async def awrite(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn(conn)`` on the writer thread without blocking the event loop."""
        return await asyncio.wrap_future(self.submit(fn))

    def write_tx(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """``write`` inside ``BEGIN IMMEDIATE``: all of ``fn`` commits, or none of it."""

        def run(conn: sqlite3.Connection) -> T:
            with immediate(conn):
                return fn(conn)

        return self.write(run)

    # -- reads --------------------------------------------------------------------------------
    def _reader(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = connect(self.path, busy_timeout_ms=self.busy_timeout_ms)
            self._local.conn = conn
            # ``PRAGMA data_version`` is only comparable on one connection and restarts on a new
            # one, so a state tag carries a random id of the connection it was read on.
            self._local.nonce = secrets.token_hex(6)
            with self._readers_lock:
                self._readers.append(conn)
        return conn

    def read(self, fn: Callable[[sqlite3.Connection], T], *, time_limit_ms: int | None = None) -> T:
        """Run ``fn(conn)`` on this thread's read connection, under the read time limit."""
        conn = self._reader()
        with time_limit(conn, time_limit_ms or self.read_time_limit_ms):
            return fn(conn)

    def read_tagged(
        self, fn: Callable[[sqlite3.Connection, str], T], *, time_limit_ms: int | None = None
    ) -> T:
        """``read``, and ``fn`` also gets a tag of the database state this connection sees.

        The tag is ``<connection id>.<PRAGMA data_version>``: it changes whenever any other
        connection (the writer thread, the analysis worker) commits, so equal tags mean no data
        changed in between, which is what an HTTP ETag needs. The version is read *before*
        ``fn`` queries: a commit landing in between can only make the tag older than the data
        (the next request then answers in full), never newer (which would hide a change).
        """
        conn = self._reader()
        with time_limit(conn, time_limit_ms or self.read_time_limit_ms):
            version = conn.execute("PRAGMA data_version").fetchone()[0]
            return fn(conn, f"{self._local.nonce}.{version}")

    def read_db(self) -> sqlite_utils.Database:
        """A sqlite-utils view of this thread's read connection (no time limit: for tools)."""
        return sqlite_utils.Database(self._reader())

    def close(self) -> None:
        """Stop the writer after the queued writes and close every connection."""
        if self._writer is not None:
            self._queue.put(_STOP)
            self._writer.join(timeout=30)
            self._writer = None
        if self._write_conn is not None:
            self._write_conn.close()
            self._write_conn = None
        with self._readers_lock:
            for conn in self._readers:
                with contextlib.suppress(sqlite3.Error):
                    conn.close()
            self._readers.clear()
        self._local = threading.local()


def rows(conn: sqlite3.Connection, sql: str, params: Any = ()) -> list[dict[str, Any]]:
    """Run a query and return plain dicts.

    Plain tuples zipped with the column names: ``dict(sqlite3.Row)`` goes through the row's
    mapping protocol per column and cost more than the query itself on the run list page.
    """
    cur = conn.cursor()
    cur.row_factory = None
    cur.execute(sql, params)
    if cur.description is None:  # not a query: nothing to return
        return []
    names = [d[0] for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def one(conn: sqlite3.Connection, sql: str, params: Any = ()) -> dict[str, Any] | None:
    """The first row as a dict, or None."""
    row = conn.execute(sql, params).fetchone()
    return dict(row) if row is not None else None
