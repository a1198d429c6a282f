"""The built run pages (``run_page_parts``) on both backends (the ``queue_store`` fixture: a
SQLite file and a real PostgreSQL database): a built page is shown only while the page summary
it was built from is the stored one, of the code version that built it, and it goes with a
re-analysis and with its run; a PostgreSQL database made before the table gets it."""

from __future__ import annotations

import sqlalchemy as sa
from postgres_server import PostgresServer
from queue_store import QueueStore

from service.page_summary import PAGE_SUMMARY_VERSION
from service.storage import runs, schema
from service.storage.engine import Conn, PostgresDatabase, execute


def _analysed(conn: Conn) -> int:
    run_id = runs.create_run(conn, name="built", source="test", status="analysed")
    runs.record_report(
        conn, run_id=run_id, schema_version=3, catalog_version="c", report_json="{}",
        duration_s=1.0, metrics=[], page=(PAGE_SUMMARY_VERSION, '{"notes": ["a"]}'),
    )  # fmt: skip
    return run_id


def _stamp(conn: Conn, run_id: int) -> str:
    found = runs.page_stamp(conn, run_id=run_id)
    assert found is not None
    return found[1]


def _store(conn: Conn, run_id: int, stamp: str, html: str = "<p>page</p>") -> bool:
    return runs.store_page_parts(
        conn, run_id=run_id, version="v1", summary_stamp=stamp, charts=3, html=html,
        page_json='{"report": null}',
    )  # fmt: skip


def _read(conn: Conn, run_id: int, version: str = "v1") -> tuple[int, str, str] | None:
    return runs.page_parts(
        conn, run_id=run_id, version=version, summary_version=PAGE_SUMMARY_VERSION
    )


def test_a_built_page_is_shown_while_its_summary_and_code_are_current(
    queue_store: QueueStore,
) -> None:
    db = queue_store.open()
    run_id = db.write_tx(_analysed)
    stamp = db.read(lambda c: _stamp(c, run_id))
    assert db.read(lambda c: _read(c, run_id)) is None  # nothing built yet
    assert db.write_tx(lambda c: _store(c, run_id, "another stamp")) is False
    assert db.read(lambda c: _read(c, run_id)) is None
    assert db.write_tx(lambda c: _store(c, run_id, stamp)) is True
    assert db.read(lambda c: _read(c, run_id)) == (3, "<p>page</p>", '{"report": null}')
    assert db.read(lambda c: _read(c, run_id, version="v2")) is None  # other code built it
    assert db.write_tx(lambda c: _store(c, run_id, stamp, html="<p>again</p>")) is True
    assert db.read(lambda c: _read(c, run_id)) == (3, "<p>again</p>", '{"report": null}')

    # a new summary (a view's rebuild, a re-analysis) has a new stamp: the page is stale
    db.write_tx(
        lambda c: runs.store_page(c, run_id=run_id, version=PAGE_SUMMARY_VERSION, page_json="{}")
    )
    assert db.read(lambda c: _read(c, run_id)) is None
    assert db.write_tx(lambda c: _store(c, run_id, stamp)) is False  # built from the old one


def test_a_reanalysis_and_a_delete_take_the_built_page_along(queue_store: QueueStore) -> None:
    db = queue_store.open()
    run_id = db.write_tx(_analysed)
    assert db.write_tx(lambda c: _store(c, run_id, _stamp(c, run_id)))
    count = sa.select(sa.func.count()).select_from(schema.run_page_parts)
    def reanalysed(conn: Conn) -> None:
        runs.record_report(
            conn, run_id=run_id, schema_version=3, catalog_version="c", report_json="{}",
            duration_s=1.0, metrics=[],
        )  # fmt: skip

    db.write_tx(reanalysed)
    assert db.read(lambda c: execute(c, count).scalar()) == 0
    assert db.read(lambda c: _read(c, run_id)) is None
    db.write_tx(
        lambda c: runs.store_page(c, run_id=run_id, version=PAGE_SUMMARY_VERSION, page_json="{}")
    )
    assert db.write_tx(lambda c: _store(c, run_id, _stamp(c, run_id)))
    db.write_tx(lambda c: runs.delete_run(c, run_id=run_id))  # no row left to hold the run
    assert db.read(lambda c: _read(c, run_id)) is None


def test_a_postgres_database_made_before_the_table_gets_it(postgres: PostgresServer) -> None:
    db = PostgresDatabase(postgres.new_database(), pool_size=1)
    try:
        # what the version before made: every table but this one, and not this version
        db.write(lambda c: c.execute(sa.text("DROP TABLE run_page_parts")))
        versions = schema.schema_versions
        gone = versions.delete().where(versions.c.name == "pg003_run_page_parts")
        db.write(lambda c: c.execute(gone))
        assert db.apply_schema() == ["pg003_run_page_parts"]
        assert db.apply_schema() == []
        run_id = db.write_tx(_analysed)
        assert db.write_tx(lambda c: _store(c, run_id, _stamp(c, run_id)))
        assert db.read(lambda c: _read(c, run_id)) is not None
    finally:
        db.close()
