"""The database failing under a running service: lost, busy, out of connections.

A real PostgreSQL server (its own cluster where the test stops it), real ``cptrace serve`` and
``cptrace worker`` processes: while the server is down reads answer 503 with the reason and a
``Retry-After``, never a 500 or a traceback; once it is back the same processes serve and
analyse again, no restart. A held lock answers 503 "busy" with ``Retry-After`` on both
backends (SQLite's locked file, PostgreSQL's ``lock_timeout``), as does a connection limit.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from conftest import make_settings
from fastapi.testclient import TestClient
from postgres_server import PostgresServer, postgres_missing, running_postgres
from service_factories import auth
from service_server import Server, start_worker, upload_bundle, wait_analysed, wait_for
from testkit import DATA_DIR

from service.auth import Role, create_token
from service.main import create_app
from service.storage.engine import Backend, postgres_engine

BUNDLE = DATA_DIR / "plain-h200-profile" / "plain_mlp_adamw.tar.gz"


@pytest.fixture(scope="module")
def own_postgres() -> Iterator[PostgresServer]:
    """A cluster of this module's own: the tests stop and start it."""
    missing = postgres_missing()
    if missing is not None:
        pytest.skip(missing)
    with running_postgres() as server:
        yield server


def _get(url: str) -> httpx.Response:
    answer = httpx.get(url, timeout=30)
    assert answer.status_code in (200, 503), (answer.status_code, answer.text)
    return answer


def _served(url: str) -> bool:
    return _get(url).status_code == 200


@pytest.mark.timeout(150)
def test_a_stopped_server_answers_503_and_the_api_and_worker_resume(
    tmp_path: Path, own_postgres: PostgresServer
) -> None:
    url = own_postgres.new_database()
    server = Server(tmp_path, worker=False, database=url).start()
    worker = start_worker(tmp_path, url)
    worker_log = tmp_path / "worker.log"
    runs = f"{server.url}/api/v1/runs"
    try:
        wait_for(lambda: "started on" in worker_log.read_text(), 30, "the worker to start")
        assert _get(runs).status_code == 200
        own_postgres.stop()
        for path in (runs, f"{runs}/1", f"{server.url}/api/v1/health"):
            answer = _get(path)
            assert answer.status_code == 503, (path, answer.text)
            if path != f"{server.url}/api/v1/health":  # /health answers its own 503 body
                assert answer.json()["error"] == "the database is unavailable; retry"
                assert answer.headers["retry-after"] == "5"
        wait_for(
            lambda: "database unavailable" in worker_log.read_text(), 20, "the worker to report"
        )
        assert worker.poll() is None and server.proc is not None and server.proc.poll() is None

        own_postgres.start()
        wait_for(lambda: _served(runs), 30, "the API to serve again", interval=0.2)
        run_id = upload_bundle(server, BUNDLE)
        wait_analysed(server, run_id, "the same worker to analyse an upload")
        assert worker.poll() is None  # the worker that saw the outage did it
        # said once the claim after the outage returns (after the run's page is built)
        wait_for(
            lambda: "database answers again" in worker_log.read_text(), 20, "the worker to say so"
        )
    finally:
        own_postgres.start()  # running again for the other tests
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=30)
        server.stop()
    server_log = server.log.read_text()
    assert "database unavailable on GET /api/v1/runs" in server_log
    assert "Traceback" not in server_log and "Traceback" not in worker_log.read_text()


@pytest.mark.timeout(60)
def test_terminated_backends_cost_at_most_one_answer(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    url = postgres.new_database()
    name = sa.make_url(url).database
    server = Server(tmp_path, worker=False, database=url).start()
    runs = f"{server.url}/api/v1/runs"
    admin = postgres.admin()
    try:
        assert [_get(runs).status_code for _ in range(5)] == [200] * 5
        with admin.connect() as conn:
            ended = conn.execute(
                sa.text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                    " WHERE datname = :name AND pid <> pg_backend_pid()"
                ),
                {"name": name},
            ).scalar_one()
        assert ended >= 1  # the API's pooled connections
        statuses = [_get(runs).status_code for _ in range(10)]
    finally:
        admin.dispose()
        server.stop()
    # the first use of a dead connection fails it and renews the pool: the rest are served
    assert statuses.count(503) <= 1 and statuses[-9:] == [200] * 9, statuses
    assert "Traceback" not in server.log.read_text()


@pytest.fixture(params=[Backend.SQLITE, Backend.POSTGRESQL], ids=str)
def busy_app(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[TestClient, str]]:
    """An app that waits 200 ms on a held lock, and its database's URL ('' for SQLite)."""
    sqlite = request.param is Backend.SQLITE
    url = "" if sqlite else request.getfixturevalue("postgres").new_database()
    app = create_app(make_settings(tmp_path, database_url=url, busy_timeout_ms=200))
    token = app.state.db.write_tx(lambda c: create_token(c, role=Role.RUNNER))
    with TestClient(app, raise_server_exceptions=False) as client:
        client.headers.update(auth(token))
        yield client, url


def _hold_write_lock(url: str, data_dir: Path) -> tuple[object, object]:
    """Another client holding the lock every insert into ``runs`` needs (until closed)."""
    if not url:
        conn = sqlite3.connect(data_dir / "cptrace.db", isolation_level=None)
        conn.execute("BEGIN IMMEDIATE")  # the file's write lock
        return conn, conn.close
    engine = postgres_engine(url, pool_size=1)
    conn = engine.connect()
    conn.begin()
    conn.execute(sa.text("LOCK TABLE runs IN SHARE MODE"))  # reads pass, inserts wait

    def release() -> None:
        conn.close()
        engine.dispose()

    return conn, release


def test_a_held_lock_answers_503_busy_with_retry_after(
    busy_app: tuple[TestClient, str], tmp_path: Path
) -> None:
    client, url = busy_app
    _, release = _hold_write_lock(url, tmp_path)
    try:
        answer = client.post("/api/v1/runs", json={"name": "held"})
        assert answer.status_code == 503, answer.text
        assert answer.json()["error"] == "the database is busy; retry"
        assert answer.headers["retry-after"] == "1"
        assert client.get("/api/v1/runs").status_code == 200  # reads do not wait on it
    finally:
        release()  # type: ignore[operator]
    assert client.post("/api/v1/runs", json={"name": "free"}).status_code == 201


def test_a_connection_limit_answers_503_busy(tmp_path: Path, postgres: PostgresServer) -> None:
    url = postgres.new_database()
    role = f"r_{uuid.uuid4().hex[:12]}"
    admin = postgres.admin()
    mine = postgres_engine(url, pool_size=1).execution_options(isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f"CREATE ROLE {role} LOGIN"))
        with mine.connect() as conn:  # the tables are the database owner's
            for what in ("SELECT, INSERT, UPDATE, DELETE ON ALL TABLES", "USAGE ON ALL SEQUENCES"):
                conn.execute(sa.text(f"GRANT {what} IN SCHEMA public TO {role}"))
        role_url = sa.make_url(url).set(username=role).render_as_string(hide_password=False)
        app = create_app(make_settings(tmp_path, database_url=role_url))
        with TestClient(app, raise_server_exceptions=False) as client:
            # the schema check holds one pooled connection; a read needs a second one
            with admin.connect() as conn:
                conn.execute(sa.text(f"ALTER ROLE {role} CONNECTION LIMIT 1"))
            answer = client.get("/api/v1/runs")
            assert answer.status_code == 503, answer.text
            assert answer.json()["error"] == "the database is busy; retry"
            assert answer.headers["retry-after"] == "1"
            with admin.connect() as conn:
                conn.execute(sa.text(f"ALTER ROLE {role} CONNECTION LIMIT -1"))
            assert client.get("/api/v1/runs").status_code == 200
    finally:
        mine.dispose()
        admin.dispose()
