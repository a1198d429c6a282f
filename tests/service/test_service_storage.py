"""Storage pieces on their own: migrations, the writer, read time limits, blobs, capped gzip."""

from __future__ import annotations

import gzip
import io
import sqlite3
import threading
from pathlib import Path

import pytest
from service_factories import kineto_bundle

from analyzers.bundle import UnsafeBundleError, _safe_member_name
from analyzers.errors import CorruptTraceError, TraceTooLargeError
from analyzers.readers import CappedGunzip
from service.bootstrap import ensure_admin_token, seed_demo
from service.core.config import Settings
from service.core.errors import QueryTimeout
from service.main import open_database
from service.storage.database import Database
from service.storage.migrations import apply_migrations, migrations


def test_migrations_apply_once(tmp_path: Path) -> None:
    db = open_database(Settings(data_dir=tmp_path))
    try:
        assert db.write(apply_migrations) == []  # already applied by open_database
        applied = db.read(
            lambda c: [
                r[0]
                for r in c.execute(
                    "SELECT name FROM _sqlite_migrations WHERE migration_set = 'cptrace'"
                )
            ]
        )
        assert applied == [m.name for m in migrations._migrations]
        mode = db.read(lambda c: c.execute("PRAGMA journal_mode").fetchone()[0])
        assert mode == "wal"
    finally:
        db.close()


def test_writer_serialises_and_survives_errors(tmp_path: Path) -> None:
    db = Database(tmp_path / "x.db")
    db.write(lambda c: c.execute("CREATE TABLE t (n INTEGER)"))

    def bump(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO t VALUES (1)")

    threads = [
        threading.Thread(target=lambda: [db.write_tx(bump) for _ in range(50)]) for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    def boom(conn: sqlite3.Connection) -> None:
        conn.execute("INSERT INTO t VALUES (2)")
        raise ValueError("rolled back")

    with pytest.raises(ValueError):
        db.write_tx(boom)
    assert tuple(db.read(lambda c: c.execute("SELECT count(*), sum(n) FROM t").fetchone())) == (
        400,
        400,
    )
    db.close()


def test_reads_have_a_time_limit(tmp_path: Path) -> None:
    db = Database(tmp_path / "x.db", read_time_limit_ms=50)
    slow = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT max(x) FROM c"
    with pytest.raises(QueryTimeout) as exc:
        db.read(lambda c: c.execute(slow).fetchone())
    assert exc.value.status == 503 and "50 ms" in exc.value.message
    assert db.read(lambda c: c.execute("SELECT 1").fetchone()[0]) == 1  # the connection lives
    db.close()


def test_capped_gzip() -> None:
    """The one capped gunzip (the readers'), as the upload path uses it."""
    two_members = gzip.compress(b"abc") + gzip.compress(b"def")
    assert CappedGunzip(io.BytesIO(two_members), 100, label="t").read() == b"abcdef"
    with pytest.raises(TraceTooLargeError, match="limit of 100 bytes"):
        CappedGunzip(io.BytesIO(gzip.compress(b"x" * 1000)), 100, label="t").read()
    with pytest.raises(CorruptTraceError, match="truncated"):
        CappedGunzip(io.BytesIO(gzip.compress(b"x" * 1000)[:-10]), 10_000, label="t").read()
    with pytest.raises(CorruptTraceError, match="not valid gzip"):
        CappedGunzip(io.BytesIO(b"\x1f\x8bnot really"), 100, label="t").read()


@pytest.mark.parametrize("name", ["../x", "traces/../../x", "/abs", "a\\b", "traces/..", "x\x00"])
def test_member_names_that_leave_the_bundle(name: str) -> None:
    with pytest.raises(UnsafeBundleError):
        _safe_member_name(name, source="bundle")


def test_first_start_and_demo_seed_are_idempotent(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data")
    demo = tmp_path / "demo"
    demo.mkdir()
    (demo / "a.tar.gz").write_bytes(kineto_bundle(name="demo-a"))
    (demo / "broken.tar.gz").write_bytes(b"not a bundle")
    db = open_database(settings)
    try:
        token = ensure_admin_token(db)
        assert token and token.startswith("cpt_")
        assert ensure_admin_token(db) is None  # printed once, never again
        first = {r.path.name: r for r in seed_demo(db, settings, demo)}
        assert first["a.tar.gz"].created and first["broken.tar.gz"].error
        second = {r.path.name: r for r in seed_demo(db, settings, demo)}
        assert not second["a.tar.gz"].created
        assert second["a.tar.gz"].run_id == first["a.tar.gz"].run_id
        assert db.read(lambda c: c.execute("SELECT count(*) FROM runs").fetchone()[0]) == 1
    finally:
        db.close()
