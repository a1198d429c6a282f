"""The Arrow (ADBC) path's batch stream: rows as the stdlib reads them, driver errors as errors.

Batches are taken from the Arrow C stream through ``ctypes`` (``_arrow_sqlite._next_batch``)
so that SQLite steps without the GIL; these tests hold that path to the stdlib's rows and to a
clean error when a page is damaged in the middle of a table (after batches were handed out).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import numpy as np
import pytest

from analyzers.errors import CorruptTraceError
from analyzers.readers import _arrow_sqlite, read_nsys

pytest.importorskip("adbc_driver_sqlite")  # the Arrow path is the ``fast`` extra's

ROWS = 60_000
BATCH = 4_096
KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"


def _export(path: Path) -> Path:
    """A small nsys-shaped export: StringIds and a kernel table of ``ROWS`` rows."""
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute("INSERT INTO StringIds VALUES (1, 'kernel_a'), (2, 'kernel_b')")
    conn.execute(
        f"CREATE TABLE {KERNEL} (start INTEGER NOT NULL, end INTEGER NOT NULL,"
        " deviceId INTEGER NOT NULL, streamId INTEGER NOT NULL, correlationId INTEGER,"
        " globalPid INTEGER, demangledName INTEGER NOT NULL, graphNodeId INTEGER)"
    )
    conn.executemany(
        f"INSERT INTO {KERNEL} VALUES (?, ?, 0, 7, ?, ?, ?, NULL)",
        ((10 * i, 10 * i + 5, i + 1, 1 << 24, 1 + i % 2) for i in range(ROWS)),
    )
    conn.commit()
    conn.close()
    return path


def _damage_a_middle_page(path: Path) -> None:
    """Overwrite one leaf page of the kernel table, halfway through its rows, with garbage."""
    conn = sqlite3.connect(path)
    (page_size,) = conn.execute("PRAGMA page_size").fetchone()
    (page,) = conn.execute(
        "SELECT pageno FROM dbstat WHERE name = ? AND pagetype = 'leaf' ORDER BY pageno",
        (KERNEL,),
    ).fetchall()[ROWS // 2 // 200 : ROWS // 2 // 200 + 1][0]
    conn.close()
    with open(path, "r+b") as f:
        f.seek((page - 1) * page_size)
        f.write(b"\xff" * page_size)


def _arrow(path: Path) -> _arrow_sqlite.ArrowSqlite:
    arrow = _arrow_sqlite.open_arrow(path)
    assert arrow is not None
    return arrow


@pytest.mark.parametrize("readers", ["1", "2"], ids=["nanoarrow-iteration", "ctypes-gil-released"])
def test_batches_hold_the_rows_sqlite_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, readers: str
) -> None:
    monkeypatch.setenv(_arrow_sqlite.READERS_ENV, readers)
    db = _export(tmp_path / "k.sqlite")
    sql = f'SELECT start, "end", correlationId, ifnull(graphNodeId, -1) FROM {KERNEL}'
    arrow = _arrow(db)
    try:
        batches = list(arrow.batches(sql, BATCH))
    finally:
        arrow.close()
    assert len(batches) == -(-ROWS // BATCH)
    assert not any(has_nulls for batch in batches for _, has_nulls in batch)
    columns = zip(*[[values for values, _ in batch] for batch in batches], strict=True)
    got = np.column_stack([np.concatenate(column) for column in columns])
    conn = sqlite3.connect(db)
    want = np.array(conn.execute(sql).fetchall(), dtype=np.int64)
    conn.close()
    assert np.array_equal(got, want)


def test_nulls_are_reported_per_column(tmp_path: Path) -> None:
    db = _export(tmp_path / "k.sqlite")
    arrow = _arrow(db)
    try:
        (first, *_) = arrow.batches(f"SELECT start, graphNodeId FROM {KERNEL}", BATCH)
    finally:
        arrow.close()
    assert [has_nulls for _, has_nulls in first] == [False, True]


@pytest.mark.parametrize(
    ("readers", "error"),
    [("1", "SQLITE|malformed|corrupt"), ("2", "ADBC SQLite stream error")],
    ids=["nanoarrow-iteration", "ctypes-gil-released"],
)
def test_a_damaged_page_mid_stream_is_a_driver_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, readers: str, error: str
) -> None:
    monkeypatch.setenv(_arrow_sqlite.READERS_ENV, readers)  # >1 takes the ctypes stepping
    db = _export(tmp_path / "k.sqlite")
    _damage_a_middle_page(db)
    arrow = _arrow(db)
    seen = 0
    try:
        with pytest.raises(RuntimeError, match=error):
            for batch in arrow.batches(f"SELECT start FROM {KERNEL}", BATCH):
                seen += len(batch[0][0])
    finally:
        arrow.close()
    assert 0 < seen < ROWS  # batches before the damaged page came through


def test_a_damaged_page_is_a_clear_read_error(tmp_path: Path) -> None:
    db = _export(tmp_path / "k.sqlite")
    _damage_a_middle_page(db)
    with pytest.raises(CorruptTraceError, match=f"{KERNEL}|malformed"):
        read_nsys(db)
