"""Open an untrusted SQLite file so that reading it cannot run anything it carries.

An uploaded "nsys export" is attacker-controlled. SQLite files can hold triggers, views, virtual
tables and generated columns whose SQL would run inside our process when queried. The defences,
in the order they apply:

1. the 16-byte magic header is checked before SQLite sees the file;
2. the file is opened read-only and immutable through a URI (no journal, no WAL, no writes);
3. ``PRAGMA trusted_schema=OFF`` keeps schema-defined SQL from calling non-innocuous functions;
4. an authorizer allows only SELECT/READ/the read-only PRAGMAs we issue and built-in functions;
5. ``sqlite_master`` is checked first: any trigger, view or virtual table refuses the file,
   so later queries only ever touch plain tables whose columns were listed with
   ``PRAGMA table_xinfo`` (hidden/generated columns also refuse the file).

Queries then name tables and columns only from the reader's whitelist (never from the file).
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from pathlib import Path

from analyzers.errors import CorruptTraceError, HostileTraceError, UnsupportedTraceError
from analyzers.readers._files import SQLITE_MAGIC

_ALLOWED_ACTIONS = {
    sqlite3.SQLITE_SELECT,
    sqlite3.SQLITE_READ,
    sqlite3.SQLITE_FUNCTION,
    sqlite3.SQLITE_PRAGMA,
}
_ALLOWED_PRAGMAS = {"table_xinfo", "table_info", "trusted_schema"}


@dataclass(slots=True)
class Schema:
    """Plain tables of the file and their column names, as found before any data query."""

    path: Path
    columns: dict[str, set[str]] = field(default_factory=dict)

    def has(self, table: str, column: str | None = None) -> bool:
        """True when ``table`` exists (and has ``column`` when one is given)."""
        cols = self.columns.get(table)
        if cols is None:
            return False
        return column is None or column in cols


def _authorizer(action: int, arg1: str | None, arg2: str | None, *_: object) -> int:
    if action not in _ALLOWED_ACTIONS:
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() not in _ALLOWED_PRAGMAS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK


def check_header(path: Path) -> None:
    """Refuse a file that is not SQLite before handing it to the SQLite library."""
    with open(path, "rb") as raw:
        head = raw.read(len(SQLITE_MAGIC))
    if head != SQLITE_MAGIC:
        raise UnsupportedTraceError(
            f"{path}: not an SQLite database (expected header 'SQLite format 3', got {head!r})"
        )


def open_readonly(path: Path) -> sqlite3.Connection:
    """Open ``path`` read-only, immutable, with untrusted schema SQL disabled.

    :raises UnsupportedTraceError: the header is not SQLite's.
    :raises CorruptTraceError: SQLite refuses the file.
    """
    check_header(path)
    uri = f"{path.resolve().as_uri()}?mode=ro&immutable=1"
    try:
        conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
        conn.execute("PRAGMA trusted_schema=OFF")
        conn.set_authorizer(_authorizer)
    except sqlite3.DatabaseError as exc:
        raise CorruptTraceError(f"{path}: SQLite cannot open the file ({exc})") from exc
    return conn


def inspect_schema(conn: sqlite3.Connection, path: Path, wanted: set[str]) -> Schema:
    """List the plain tables and, for the ``wanted`` ones, their columns.

    :raises HostileTraceError: the file defines triggers, views, virtual tables or
        generated columns.
    :raises CorruptTraceError: the schema cannot be read.
    """
    try:
        entries = conn.execute("SELECT type, name, sql FROM sqlite_master").fetchall()
    except sqlite3.DatabaseError as exc:
        raise CorruptTraceError(f"{path}: cannot read the SQLite schema ({exc})") from exc
    refused = [
        f"{kind} {name!r}"
        for kind, name, sql in entries
        if kind in ("trigger", "view")
        or (kind == "table" and (sql or "").lstrip().upper().startswith("CREATE VIRTUAL"))
    ]
    if refused:
        raise HostileTraceError(
            f"{path}: refusing an SQLite file that defines {', '.join(refused[:5])}: an nsys "
            "export holds only plain tables and indexes"
        )
    schema = Schema(path=path)
    for kind, name, _sql in entries:
        if kind == "table" and name in wanted:
            schema.columns[name] = _plain_columns(conn, path, name)
        elif kind == "table":
            schema.columns.setdefault(name, set())
    return schema


def _plain_columns(conn: sqlite3.Connection, path: Path, table: str) -> set[str]:
    # The table name comes from our whitelist (``wanted``), never from the file, so quoting it
    # here cannot inject SQL.
    rows = conn.execute(f'PRAGMA table_xinfo("{table}")').fetchall()
    generated = [row[1] for row in rows if row[6] != 0]
    if generated:
        raise HostileTraceError(
            f"{path}: table {table} has hidden or generated columns {generated[:5]}: an nsys "
            "export has plain columns only"
        )
    return {row[1] for row in rows}
