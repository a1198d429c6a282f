"""The service on PostgreSQL end to end: ``cptrace serve --database postgresql://... --no-worker``
and a separate ``cptrace worker`` on the same database (real subprocesses, real uvicorn, a real
PostgreSQL server) take a bundle from tests/data through upload, analysis, the run list and the
run page, and no SQLite file is ever created in the data directory."""

from __future__ import annotations

import html
import os
import signal
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from postgres_server import PostgresServer
from service_server import Server, start_worker, upload_bundle, wait_analysed
from testkit import DATA_DIR

from service.storage.engine import postgres_engine

pytestmark = pytest.mark.slow  # the file's tests take long together: it is scheduled first

BUNDLE = DATA_DIR / "plain-h200-profile" / "plain_mlp_adamw.tar.gz"


@pytest.mark.timeout(90)
def test_serve_and_worker_on_postgresql_analyse_an_upload(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    url = postgres.new_database()
    server = Server(tmp_path, worker=False, database=url).start()
    worker = start_worker(tmp_path, url)
    try:
        run_id = upload_bundle(server, BUNDLE)
        wait_analysed(server, run_id, "the worker to analyse the upload")
        listed = httpx.get(f"{server.url}/api/v1/runs", timeout=10)
        assert listed.status_code == 200
        items = listed.json()["items"]
        assert [(r["id"], r["status"]) for r in items] == [(run_id, "analysed")]
        page = httpx.get(f"{server.url}/runs/{run_id}", timeout=30)
        assert page.status_code == 200 and html.escape(items[0]["name"]) in page.text
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=30)
        server.stop()
    assert not (tmp_path / "cptrace.db").exists()  # nothing went to a SQLite file
    engine = postgres_engine(url, pool_size=1)
    try:
        with engine.connect() as conn:
            status = conn.execute(sa.text("SELECT status FROM runs")).scalars().all()
            reports = conn.execute(sa.text("SELECT count(*) FROM reports")).scalar_one()
            beats = conn.execute(sa.text("SELECT count(*) FROM worker_heartbeats")).scalar_one()
    finally:
        engine.dispose()
    assert status == ["analysed"] and reports == 1 and beats >= 1
