"""Query helpers for nsys exports: whitelisted column expressions, chunked fetch, StringIds.

Why a separate module: the reader (``nsys.py``) decides *what* to read; this module owns *how*
rows leave SQLite. Rows go from ``fetchmany`` straight into numpy arrays; only the
StringIds actually referenced are turned into Python strings, each once.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from analyzers.errors import CorruptTraceError
from analyzers.model import SymbolTable
from analyzers.readers._arrays import factorize
from analyzers.readers._arrow_sqlite import ArrowSqlite, readers
from analyzers.readers._sqlite_guard import Schema

CHUNK_ROWS = 1 << 16
"""Rows per step from the cursor: amortizes the per-call cost, bounds transient memory."""
_IN_BATCH = 900  # stays under SQLITE_MAX_VARIABLE_NUMBER of old SQLite builds (999)
SPLIT_ROWS = 1 << 20
"""A table with fewer rows than this is read by one connection: a split would not pay."""


def shrink(buffer: npt.NDArray[np.void], rows: int) -> npt.NDArray[np.void]:
    """Cut ``buffer`` to its first ``rows`` rows in place (realloc; no copy, no zero fill)."""
    buffer.resize(rows, refcheck=False)
    return buffer


Columns = dict[str, npt.NDArray[np.int64]]
Fill = Callable[[Columns, npt.NDArray[np.void]], None]
"""Writes one chunk of fetched columns into the matching slice of the result rows."""


@dataclass(frozen=True, slots=True)
class Query:
    """One SELECT of integer columns and the names its columns go by.

    ``packed`` queries combine several small integers into one 64-bit value with SQL
    arithmetic: each value costs two Python objects on its way out of SQLite, so fewer values
    per row is the main lever on read speed. Their CASE guards yield NULL when a value does not
    fit its bits; the caller then falls back to the next (plain) query.
    """

    sql: str
    columns: tuple[str, ...]
    params: Sequence[object] = ()
    packed: bool = False
    splits: bool = False
    """The SQL reads one plain table and ends with its FROM (and WHERE) clause, in rowid
    order: a rowid condition can be appended, and ranges read apart concatenate in order."""

    def over_rows(self, low: int | None, high: int | None) -> str:
        """The SQL restricted to ``low < rowid <= high`` (None: no bound on that side)."""
        bounds = [f"rowid > {int(low)}"] if low is not None else []
        bounds += [f"rowid <= {int(high)}"] if high is not None else []
        where = " WHERE " in self.sql.rsplit(" FROM ", 1)[1]
        return f"{self.sql} {'AND' if where else 'WHERE'} {' AND '.join(bounds)}"


class _DoesNotPack(Exception):
    """A packed query met a value outside its bit budget (a NULL from its guard)."""


class _ArrowFallback(Exception):
    """The Arrow path cannot carry this result; the stdlib cursor path takes over."""


def store_chunk(
    out: npt.NDArray[np.void], filled: int, columns: Columns, fill: Fill
) -> tuple[npt.NDArray[np.void], int]:
    """Convert one chunk into ``out[filled:]``, growing ``out`` if the bound was short."""
    end = filled + len(next(iter(columns.values())))
    if end > len(out):
        grown = np.empty(max(end, 2 * len(out)), dtype=out.dtype)
        grown[:filled] = out[:filled]
        out = grown
    fill(columns, out[filled:end])
    return out, end


@dataclass(slots=True)
class NsysSource:
    """An open export plus what the reader learns while reading it."""

    conn: sqlite3.Connection
    schema: Schema
    label: str
    """Path shown in messages: the file the user gave, not a decompressed temporary copy."""
    strings: SymbolTable = field(default_factory=SymbolTable)
    notes: list[str] = field(default_factory=list)
    metadata: dict[str, object] = field(default_factory=dict)
    file_bytes: int = 1 << 40
    """Size of the export on disk; bounds row-count claims of a crafted file."""
    arrow: ArrowSqlite | None = None
    """Fast column reader for the big queries, when the ``fast`` extra is installed."""

    def column(self, table: str, name: str, default: str = "-1") -> str:
        """SQL for ``table.name`` with NULL read as ``default``, or ``default`` when absent.

        Names come from the reader's whitelist and are checked against ``PRAGMA table_xinfo``
        output, so interpolating them is safe.
        """
        if self.schema.has(table, name):
            return f'ifnull("{name}", {default})'
        return default

    def fetch(self, table: str, query: Query) -> npt.NDArray[np.void]:
        """All rows of a plain ``query`` as one structured array of int64 fields."""
        dtype = int_dtype(*query.columns)

        def copy(cols: Columns, rows: npt.NDArray[np.void]) -> None:
            for name in query.columns:
                rows[name] = cols[name]

        out = self.allocate((table,), dtype)
        out, filled = self.fetch_into(out, 0, table, [(query, copy)])
        return shrink(out, filled)

    def allocate(self, tables: Sequence[str], dtype: np.dtype) -> npt.NDArray[np.void]:
        """An uninitialized buffer big enough for every row of ``tables``.

        ``np.empty`` pages that are never written are never resident, so sizing by the row
        bound (e.g. the whole runtime table when only launches are kept) costs address space,
        not memory; ``shrink`` gives the unused tail back without a copy.
        """
        return np.empty(sum(self.row_bound(t) for t in tables), dtype=dtype)

    def fetch_into(
        self,
        out: npt.NDArray[np.void],
        filled: int,
        table: str,
        variants: Sequence[tuple[Query, Fill]],
    ) -> tuple[npt.NDArray[np.void], int]:
        """Write the rows of the first query variant that fits into ``out`` from row ``filled``.

        Returns ``(out, filled)``; ``out`` is replaced by a bigger array only when the table
        holds more rows than its bound said.
        """
        for query, fill in variants[:-1]:
            try:
                return self._fetch_chunks(out, filled, table, query, fill)
            except _DoesNotPack:
                continue
        query, fill = variants[-1]
        return self._fetch_chunks(out, filled, table, query, fill)

    def _fetch_chunks(
        self, out: npt.NDArray[np.void], filled: int, table: str, query: Query, fill: Fill
    ) -> tuple[npt.NDArray[np.void], int]:
        """Arrow batches when that path is available and the query fits it, else the cursor."""
        if self.arrow is not None and not query.params:
            try:
                return self._fetch_arrow(out, filled, table, query, fill)
            except _ArrowFallback:
                if query.packed:
                    raise _DoesNotPack from None
                # a plain query the Arrow path cannot carry: the stdlib path says what is wrong
        return self._fetch_cursor(out, filled, table, query, fill)

    def _fetch_arrow(
        self, out: npt.NDArray[np.void], filled: int, table: str, query: Query, fill: Fill
    ) -> tuple[npt.NDArray[np.void], int]:
        assert self.arrow is not None
        cuts = self._rowid_cuts(table) if query.splits else []
        if not cuts:
            return self._store_batches(
                out, filled, query, fill, self._batches(self.arrow, query.sql)
            )
        # Ranges after the first are read by sibling connections on threads while this thread
        # reads and stores the first; their batches are stored in rowid order afterwards.
        bounds = list(zip([None, *cuts], [*cuts, None], strict=True))
        with ThreadPoolExecutor(max_workers=len(cuts), thread_name_prefix="nsys-read") as pool:
            later: list[Future[list[list[tuple[npt.NDArray[np.int64], bool]]]]] = [
                pool.submit(self._range_batches, query.over_rows(low, high))
                for low, high in bounds[1:]
            ]
            try:
                first = self._batches(self.arrow, query.over_rows(*bounds[0]))
                out, filled = self._store_batches(out, filled, query, fill, first)
                for part in later:
                    out, filled = self._store_batches(out, filled, query, fill, iter(part.result()))
            finally:
                for part in later:
                    part.cancel()
        return out, filled

    def _rowid_cuts(self, table: str) -> list[int]:
        """Rowids splitting ``table`` into equal rowid ranges, one per reader; [] for one."""
        count = readers()
        if count < 2:
            return []
        low, high = self.conn.execute(f'SELECT min(rowid), max(rowid) FROM "{table}"').fetchone()
        if low is None or int(high) - int(low) < SPLIT_ROWS:
            return []
        step = (int(high) - int(low)) // count
        return [int(low) + step * k for k in range(1, count)]

    def _range_batches(self, sql: str) -> list[list[tuple[npt.NDArray[np.int64], bool]]]:
        """All batches of one rowid range, read on a sibling connection (a worker thread)."""
        assert self.arrow is not None
        sibling = self.arrow.sibling()
        try:
            return list(self._batches(sibling, sql))
        finally:
            sibling.close()

    @staticmethod
    def _batches(
        arrow: ArrowSqlite, sql: str
    ) -> Iterator[list[tuple[npt.NDArray[np.int64], bool]]]:
        try:
            yield from arrow.batches(sql, CHUNK_ROWS)
        except Exception as exc:  # driver errors (type inference, I/O): retry on the stdlib path
            raise _ArrowFallback(str(exc)) from exc

    @staticmethod
    def _store_batches(
        out: npt.NDArray[np.void],
        filled: int,
        query: Query,
        fill: Fill,
        batches: Iterator[list[tuple[npt.NDArray[np.int64], bool]]],
    ) -> tuple[npt.NDArray[np.void], int]:
        for batch in batches:
            if any(has_nulls for _, has_nulls in batch):
                raise _ArrowFallback("NULL in a result column")
            columns = {name: values for name, (values, _) in zip(query.columns, batch, strict=True)}
            out, filled = store_chunk(out, filled, columns, fill)
        return out, filled

    def _fetch_cursor(
        self, out: npt.NDArray[np.void], filled: int, table: str, query: Query, fill: Fill
    ) -> tuple[npt.NDArray[np.void], int]:
        """Rows leave the cursor ``CHUNK_ROWS`` at a time as one 2-D int64 array per chunk."""
        try:
            cursor = self.conn.execute(query.sql, query.params)
            while rows := cursor.fetchmany(CHUNK_ROWS):
                chunk = np.array(rows, dtype=np.int64).reshape(len(rows), len(query.columns))
                del rows
                out, filled = store_chunk(
                    out, filled, dict(zip(query.columns, chunk.T, strict=True)), fill
                )
        except sqlite3.DatabaseError as exc:
            raise CorruptTraceError(f"{self.label}: cannot read table {table} ({exc})") from exc
        except (TypeError, ValueError, OverflowError) as exc:
            if query.packed:
                raise _DoesNotPack from exc
            raise CorruptTraceError(
                f"{self.label}: table {table} holds a value that is not an integer where nsys "
                f"writes integers ({exc})"
            ) from exc
        return out, filled

    def row_bound(self, table: str) -> int:
        """Rows a query on ``table`` can return at most, for preallocation.

        nsys appends rows, so ``max(rowid)`` (an index lookup, not a scan) is the row count. A
        crafted file could claim a huge rowid; a table cell takes at least 4 bytes of the file,
        so anything above ``file size / 4`` is not believed and the buffer grows instead.
        """
        (rowid,) = self.conn.execute(f'SELECT max(rowid) FROM "{table}"').fetchone()
        bound = int(rowid or 0)
        limit = self.file_bytes // 4
        return bound if 0 <= bound <= limit else min(CHUNK_ROWS, limit)

    def string_values(self, ids: npt.NDArray[np.int64]) -> dict[int, str]:
        """StringIds ``id -> value`` for the given ids (unknown ids are simply absent)."""
        found: dict[int, str] = {}
        if not self.schema.has("StringIds", "value") or not len(ids):
            return found
        wanted = [int(i) for i in np.unique(ids) if i >= 0]
        try:
            for lo in range(0, len(wanted), _IN_BATCH):
                batch = wanted[lo : lo + _IN_BATCH]
                marks = ",".join("?" * len(batch))
                rows = self.conn.execute(
                    f"SELECT id, value FROM StringIds WHERE id IN ({marks})", batch
                )
                found.update((int(i), str(v)) for i, v in rows)
        except sqlite3.DatabaseError as exc:
            raise CorruptTraceError(f"{self.label}: cannot read table StringIds ({exc})") from exc
        return found

    def intern_ids(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int32]:
        """Map StringIds ids to SymbolTable ids, interning each distinct string once."""
        if not len(ids):
            return np.empty(0, dtype=np.int32)
        unique, inverse = factorize(ids)
        values = self.string_values(unique)
        missing = [int(i) for i in unique if int(i) not in values]
        if missing:
            self.notes.append(
                f"{len(missing)} string ids (e.g. {missing[0]}) are missing from StringIds: "
                "those names show as '<string N>'"
            )
        symbols = np.fromiter(
            (self.strings.intern(values.get(int(i), f"<string {int(i)}>")) for i in unique),
            dtype=np.int32,
            count=len(unique),
        )
        return symbols[inverse]


def int_dtype(*names: str) -> np.dtype:
    """A structured dtype of int64 fields, one per selected column."""
    return np.dtype([(name, np.int64) for name in names])
