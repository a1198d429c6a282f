"""PostgreSQL and S3 together, as a multi-host deployment runs them: ``cptrace serve --no-worker``
(real uvicorn) and a separate ``cptrace worker`` process share one PostgreSQL database (the tests'
real server) and one S3 bucket (moto's server over HTTP). A two-rank bundle uploaded over HTTP is
analysed as per-rank tasks whose parts pass through the bucket; the report equals the one a
SQLite + local-folder ``cptrace serve`` gives for the same bundle, and no part is left after the
merge."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from postgres_server import PostgresServer
from service_factories import kineto_bundle
from service_server import Server, start_worker, upload_bundle, wait_analysed

from service.storage.blobs import S3BlobStore, S3Location
from service.storage.engine import postgres_engine

pytestmark = pytest.mark.slow


def _report(server: Server, run_id: int) -> bytes:
    answer = httpx.get(f"{server.url}/api/v1/runs/{run_id}/analysis/result", timeout=30)
    assert answer.status_code == 200, answer.text
    return answer.content


@pytest.mark.timeout(240)
def test_postgres_and_s3_per_rank_report_equals_sqlite_local(
    tmp_path: Path, postgres: PostgresServer, s3_location: S3Location
) -> None:
    bundle = tmp_path / "two-ranks.tar.gz"
    bundle.write_bytes(kineto_bundle(name="pg-s3-run", salt="pg-s3"))

    local_dir = tmp_path / "sqlite-local"
    local_dir.mkdir()
    local = Server(local_dir, env={"CPTRACE_INGEST_WORKERS": "1"}).start()
    try:
        local_id = upload_bundle(local, bundle)
        wait_analysed(local, local_id, "the SQLite + local-folder analysis", timeout=120)
        expected = _report(local, local_id)
    finally:
        local.stop()

    url = postgres.new_database()
    settings = {
        "CPTRACE_BLOBS": s3_location.url,
        "CPTRACE_S3_ENDPOINT_URL": s3_location.endpoint_url,
        "CPTRACE_INGEST_WORKERS": "1",
        "CPTRACE_ANALYSIS_PER_RANK_MIN_BYTES": "0",  # every multi-rank run as per-rank tasks
    }
    data_dir = tmp_path / "pg-s3"
    data_dir.mkdir()
    server = Server(data_dir, worker=False, database=url, env=settings).start()  # makes the bucket
    worker = start_worker(data_dir, url, env=settings)
    try:
        run_id = upload_bundle(server, bundle)
        wait_analysed(server, run_id, "the worker to analyse the upload from S3", timeout=120)
        report = _report(server, run_id)
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        worker.wait(timeout=30)
        server.stop()

    assert "analysing 2 files per rank as 2 queue tasks" in (data_dir / "worker.log").read_text()
    assert report == expected  # byte for byte
    assert not (data_dir / "cptrace.db").exists()  # the database is PostgreSQL only
    assert not any(p.is_file() for p in (data_dir / "blobs").rglob("*"))  # no blob on disk
    engine = postgres_engine(url, pool_size=1)
    try:
        with engine.connect() as conn:
            digests = set(conn.execute(sa.text("SELECT sha256 FROM run_files")).scalars())
            kinds = sorted(conn.execute(sa.text("SELECT kind FROM analysis_tasks")).scalars())
    finally:
        engine.dispose()
    assert len(digests) == 3  # the manifest and two traces
    assert kinds == ["merge", "rank", "rank"]
    bucket = S3BlobStore(s3_location, tmp_path / "probe-tmp")
    assert set(bucket.iter_digests()) == digests  # the run's files, once each: the parts are gone
    assert list(bucket.objects("staging/")) == []
