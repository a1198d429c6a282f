"""The tables are defined once (``service.storage.schema``): the SQLite migration chain, run
on a database made by the code before it existed, arrives at that definition; PostgreSQL is
created from it; a database URL the service cannot use, or a PostgreSQL server it cannot
reach, is refused at start with one line."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa
import sqlite_utils
from postgres_server import PostgresServer
from testkit import free_port

from service.core.config import Settings, SettingsError
from service.main import open_database
from service.storage import schema
from service.storage.engine import DatabaseUnavailable, PostgresDatabase
from service.storage.migrations import apply_migrations, migrations

BEFORE_M041 = "m041_run_summary_columns"


def _sqlite_columns(conn: sqlite3.Connection, table: str) -> dict[str, tuple[bool, bool]]:
    """column -> (not null, in the primary key)."""
    found = conn.execute(f'PRAGMA table_info("{table}")').fetchall()
    return {r[1]: (bool(r[3]), bool(r[5])) for r in found}


def _defined_columns(table: sa.Table) -> dict[str, tuple[bool, bool]]:
    # SQLite reports a primary key column as nullable unless it says NOT NULL
    return {c.name: (not c.nullable and not c.primary_key, c.primary_key) for c in table.columns}


def test_an_older_sqlite_database_migrates_to_the_defined_schema(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "old.db", isolation_level=None)
    names = [m.name for m in migrations.pending(sqlite_utils.Database(conn))]
    assert BEFORE_M041 in names
    # a database as the code before m041 left it (runs without the summary columns), a run in it
    migrations.apply(sqlite_utils.Database(conn), stop_before=BEFORE_M041)
    conn.execute(
        "INSERT INTO runs (name, source, status, created_at, manifest_json) VALUES"
        " ('old', 'upload', 'analysed', '2026-01-01', ?)",
        ('{"workload": {"implementation": "te"}}',),
    )
    assert apply_migrations(conn) == names[names.index(BEFORE_M041) :]
    for table in schema.APPLICATION_TABLES:
        pk_aware = {
            name: (not_null and not pk, pk)
            for name, (not_null, pk) in _sqlite_columns(conn, table.name).items()
        }
        assert pk_aware == _defined_columns(table), table.name
    indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    defined = {i.name for t in schema.APPLICATION_TABLES for i in t.indexes}
    assert defined <= indexes
    assert conn.execute("SELECT implementation FROM runs").fetchone() == ("te",)  # carried


def test_postgres_is_created_from_the_definition_once(postgres: PostgresServer) -> None:
    url = postgres.url("postgres").rsplit("/", 1)[0] + "/"
    engine = postgres.admin()
    with engine.connect() as conn:
        conn.execute(sa.text('CREATE DATABASE "fresh_schema"'))
    engine.dispose()
    db = PostgresDatabase(url + "fresh_schema", pool_size=1)
    try:
        assert db.apply_schema() == list(schema.POSTGRES_SCHEMA_VERSIONS)
        assert db.apply_schema() == []  # a second process starting finds it made
        found = db.read(lambda c: sa.inspect(c).get_table_names())
        assert set(found) == {t.name for t in schema.metadata.tables.values()}
    finally:
        db.close()


def test_a_postgres_database_of_the_baseline_gets_the_later_versions(
    postgres: PostgresServer,
) -> None:
    """A database made at ``pg001_baseline`` (analysis tasks without the rank-task columns)
    gets ``pg002_rank_tasks`` and ``pg003_run_page_parts`` at the next start, its rows kept,
    the columns as defined."""
    db = PostgresDatabase(postgres.new_database(), pool_size=1)
    try:
        added = ("kind", "parent_id", "part", "part_sha256")

        def to_baseline(conn: sa.Connection) -> None:
            for column in added:
                conn.execute(sa.text(f"ALTER TABLE analysis_tasks DROP COLUMN {column}"))
            conn.execute(sa.text("DROP TABLE run_page_parts"))  # pg003's table
            conn.execute(
                sa.text("DELETE FROM cptrace_schema_versions WHERE name <> 'pg001_baseline'")
            )
            conn.execute(
                sa.text(
                    "INSERT INTO runs (name, source, status, created_at)"
                    " VALUES ('old', 'upload', 'queued', '2026-01-01')"
                )
            )
            conn.execute(
                sa.text("INSERT INTO analysis_tasks (run_id, status) SELECT id, 'queued' FROM runs")
            )

        db.write(to_baseline)
        assert db.apply_schema() == ["pg002_rank_tasks", "pg003_run_page_parts"]
        assert db.apply_schema() == []
        assert "run_page_parts" in db.read(lambda c: sa.inspect(c).get_table_names())
        columns = db.read(lambda c: sa.inspect(c).get_columns("analysis_tasks"))
        found = {c["name"]: c["nullable"] for c in columns}
        defined = {c.name: c.nullable for c in schema.analysis_tasks.columns}
        assert found == defined
        kinds = db.read(
            lambda c: c.execute(sa.text("SELECT kind FROM analysis_tasks")).scalars().all()
        )
        assert kinds == ["run"]  # the queued task of before is a whole-run task
    finally:
        db.close()


def test_a_database_url_the_service_cannot_use_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(SettingsError) as caught:
        Settings(data_dir=tmp_path, database_url="mysql://db/x")
    says = "expected empty (SQLite in the data directory) or postgresql://"
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_a_postgresql_server_that_cannot_be_reached_is_one_line_without_the_password(
    tmp_path: Path,
) -> None:
    url = f"postgresql://cptrace:s3cret@127.0.0.1:{free_port()}/cptrace"
    settings = Settings(data_dir=tmp_path, database_url=url)  # a PostgreSQL URL is accepted
    with pytest.raises(DatabaseUnavailable) as caught:
        open_database(settings)
    message = str(caught.value)
    assert message.startswith("cannot open the database postgresql+psycopg://cptrace:***@")
    assert "s3cret" not in message and "\n" not in message
