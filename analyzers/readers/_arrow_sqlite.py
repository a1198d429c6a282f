"""Optional fast path: pull integer columns out of SQLite as Arrow buffers (ADBC + nanoarrow).

Why: the standard ``sqlite3`` module builds a Python tuple and one Python int per value, then
numpy converts each back; that costs about half a microsecond per value and dominates reading
a multi-million-kernel export. The ADBC SQLite driver copies values straight into Arrow column
buffers in C, and nanoarrow exposes those buffers to numpy without a copy per value: about 5x
faster on the kernel table. Installed with the ``fast`` extra (``adbc-driver-sqlite``,
``nanoarrow``); without it, or with ``CPTRACE_NSYS_BACKEND=sqlite3``, the stdlib path runs.

Safety is unchanged: this connection only runs the reader's whitelisted SELECTs, and only after
the stdlib connection has inspected the schema (no triggers, views, virtual tables or generated
columns). It opens the same read-only, immutable URI and sets ``trusted_schema=OFF`` too.

Parallel reads: a big table's query can be split into rowid ranges read by sibling
connections on their own threads (``ArrowSqlite.sibling``, opt-in through ``READERS_ENV``).
The driver steps SQLite inside the stream's ``get_next``, and nanoarrow's Python binding calls
that with the GIL held (its extension never releases it), so threads reading through it take
turns. With more than one reader, ``_next_batch`` calls ``get_next`` through ``ctypes`` instead,
which drops the GIL for the length of the foreign call: the ranges decode on separate cores, and
the calling thread's numpy work runs beside them. The stream struct is the Arrow C stream
interface, a stable ABI, but it is reached through nanoarrow's private ``_addr``: so the default
(one reader) keeps nanoarrow's public iteration, and only the opt-in pays that dependency.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

BACKEND_ENV = "CPTRACE_NSYS_BACKEND"
"""``sqlite3`` forces the stdlib path; anything else (or unset) uses Arrow when installed."""
READERS_ENV = "CPTRACE_NSYS_READERS"
"""Connections reading one big table at a time (default 1; at most 4)."""
MAX_READERS = 4


class ArrowUnavailable(Exception):
    """A batch that the Arrow path cannot represent as int64 columns (NULLs, other types)."""


class ArrowSqlite:
    """A read-only ADBC connection to one export."""

    def __init__(
        self, path: Path, database: Any, connection: Any, modules: tuple[Any, Any, Any]
    ) -> None:
        self.path = path
        self._database = database
        self._connection = connection
        self._modules = modules
        _, self._manager, self._na = modules

    def batches(self, sql: str, rows: int) -> Iterator[list[tuple[npt.NDArray[np.int64], bool]]]:
        """Yield each result batch as ``[(int64 column, has_nulls), ...]``.

        :raises ArrowUnavailable: a column is not int64 (e.g. REAL or TEXT values).
        """
        from nanoarrow.c_array import allocate_c_array  # part of the extra, like nanoarrow

        statement = self._manager.AdbcStatement(self._connection)
        try:
            statement.set_options(**{"adbc.sqlite.query.batch_rows": str(rows)})
            statement.set_sql_query(sql)
            handle, _ = statement.execute_query()
            stream = self._na.c_array_stream(handle)
            if readers() > 1:  # ranges on threads: step SQLite with the GIL released
                schema = stream.get_schema()
                while (batch := _next_batch(stream, allocate_c_array(schema))) is not None:
                    yield [self._column(batch.child(i)) for i in range(batch.n_children)]
                stream.release()
            else:  # one reader: nanoarrow's own (public) iteration, no foreign call of ours
                for batch in stream:
                    yield [self._column(batch.child(i)) for i in range(batch.n_children)]
        finally:
            statement.close()

    def _column(self, child: Any) -> tuple[npt.NDArray[np.int64], bool]:
        if child.schema.format != "l":
            raise ArrowUnavailable(f"column type {child.schema.format!r} is not int64")
        array = self._na.Array(child)
        start, length = child.offset, child.length
        values = np.asarray(array.buffer(1)).view(np.int64)[start : start + length]
        if child.null_count >= 0:  # the driver counts them (-1: unknown, the first batch)
            return values, child.null_count > 0
        validity = np.asarray(array.buffer(0)).view(np.uint8)
        if not len(validity):
            return values, False
        bits = np.unpackbits(validity, bitorder="little")[start : start + length]
        return values, bool((bits == 0).any())

    def sibling(self) -> ArrowSqlite:
        """One more connection to the same file, opened the same way (for another thread)."""
        return _connect(self.path, self._modules)

    def close(self) -> None:
        self._connection.close()
        self._database.close()


class _Stream(ctypes.Structure):
    """``struct ArrowArrayStream`` of the Arrow C stream interface."""

    _fields_ = [
        ("get_schema", ctypes.c_void_p),
        ("get_next", ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)),
        ("get_last_error", ctypes.CFUNCTYPE(ctypes.c_char_p, ctypes.c_void_p)),
        ("release", ctypes.c_void_p),
        ("private_data", ctypes.c_void_p),
    ]


def _next_batch(stream: Any, batch: Any) -> Any | None:
    """The stream's next batch, filled into ``batch`` (an empty nanoarrow ``CArray``), or None
    at the stream's end.

    Called through ``ctypes``, which releases the GIL around the call: the SQLite stepping
    happens here, so sibling readers on other threads run at the same time.

    :raises RuntimeError: the driver reports an error (its message, e.g. a damaged page).
    """
    address = stream._addr()
    struct = _Stream.from_address(address)
    code = struct.get_next(address, batch._addr())
    if code != 0:
        message = struct.get_last_error(address)
        text = message.decode("utf-8", "replace") if message else os.strerror(code)
        raise RuntimeError(f"ADBC SQLite stream error {code}: {text}")
    return batch if batch.is_valid() else None


def readers() -> int:
    """How many connections may read one table at once: ``READERS_ENV``, else 1.

    Opt-in: on the loaded 2-core development machine (load average 19-22) two readers cut the
    2-million-kernel read's wall time by 15-22% but cost 20-25% more CPU time and 30-40 MB more
    peak RSS (the sibling's batches wait until the first range is stored), which took the
    process above the export's size; an idle-core measurement is still to be taken.
    """
    wanted = os.environ.get(READERS_ENV, "")
    if wanted.isdigit() and int(wanted) > 0:
        return min(int(wanted), MAX_READERS)
    return 1


def open_arrow(db_path: Path) -> ArrowSqlite | None:
    """An Arrow connection to ``db_path``, or None when the extra is missing or disabled."""
    if os.environ.get(BACKEND_ENV, "").lower() == "sqlite3":
        return None
    try:
        import adbc_driver_manager
        import adbc_driver_sqlite
        import nanoarrow
    except ImportError:
        return None
    return _connect(db_path, (adbc_driver_sqlite, adbc_driver_manager, nanoarrow))


def _connect(db_path: Path, modules: tuple[Any, Any, Any]) -> ArrowSqlite:
    """Open ``db_path`` read-only with ``modules`` = (SQLite driver, driver manager, nanoarrow)."""
    driver, manager, _ = modules
    uri = f"{db_path.resolve().as_uri()}?mode=ro&immutable=1"
    database = driver.connect(uri)
    connection = manager.AdbcConnection(database)
    statement = manager.AdbcStatement(connection)
    try:
        statement.set_sql_query("PRAGMA trusted_schema=OFF")
        statement.execute_update()
    finally:
        statement.close()
    return ArrowSqlite(db_path, database, connection, modules)
