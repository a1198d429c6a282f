"""Two API processes behind one database (``cptrace serve --no-worker`` twice on one data
directory, as two hosts would share one database and blob store) accept concurrent uploads
of the same bundle and store it once: every answer names the same run, one run row, one
upload key, each blob once. On SQLite they meet at the file lock; on PostgreSQL (a real
server) at the upload key's advisory lock."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from service_factories import kineto_bundle
from service_server import Server

from service.storage.engine import Backend, postgres_engine

pytestmark = pytest.mark.slow  # the file's tests take long together: it is scheduled first

COUNTS = {
    "runs": "SELECT count(*) FROM runs",
    "uploads": "SELECT count(*) FROM uploads",
    "files": "SELECT count(*) FROM run_files",
    "distinct_files": "SELECT count(DISTINCT sha256) FROM run_files",
    "blobs": "SELECT count(*) FROM blobs",
}


@pytest.mark.timeout(60)
@pytest.mark.parametrize("backend", [Backend.SQLITE, Backend.POSTGRESQL], ids=str)
def test_two_api_processes_store_a_bundle_uploaded_to_both_once(
    tmp_path: Path, backend: Backend, request: pytest.FixtureRequest
) -> None:
    database = None
    if backend is Backend.POSTGRESQL:
        database = request.getfixturevalue("postgres").new_database()
    servers = [Server(tmp_path, worker=False, database=database) for _ in range(2)]
    try:
        if database is not None:  # started together: one makes the schema and the token
            with ThreadPoolExecutor(2) as pool:
                first, second = pool.map(Server.start, servers)
        else:  # one after the other: a new SQLite file's first migrations are not run by two
            first, second = (server.start() for server in servers)  # processes at once yet
        tokens = [s.admin_token for s in servers if s.admin_token]
        assert len(tokens) == 1, "exactly one of the two printed the first admin token"
        headers = {"Authorization": f"Bearer {tokens[0]}"}
        body = kineto_bundle(salt="two-apis")

        def upload(url: str) -> httpx.Response:
            return httpx.post(
                f"{url}/api/v1/uploads/bundles",
                files={"bundle": ("b.tar.gz", body)},
                headers=headers,
                timeout=30,
            )

        urls = [first.url, second.url] * 4
        with ThreadPoolExecutor(len(urls)) as pool:
            answers = list(pool.map(upload, urls))
    finally:
        for server in servers:
            server.kill()
    assert all(r.status_code in (200, 201) for r in answers), [r.text for r in answers]
    assert len({r.json()["run_id"] for r in answers}) == 1
    assert sum(r.status_code == 201 for r in answers) == 1  # created once, then found
    engine = (
        postgres_engine(database, pool_size=1)
        if database
        else sa.create_engine(f"sqlite:///{tmp_path / 'cptrace.db'}")
    )
    try:
        with engine.connect() as conn:
            counts = {k: conn.execute(sa.text(q)).scalar_one() for k, q in COUNTS.items()}
    finally:
        engine.dispose()
    assert counts["runs"] == 1 and counts["uploads"] == 1, counts
    assert counts["files"] == counts["distinct_files"] == counts["blobs"], counts
    assert (tmp_path / "cptrace.db").exists() is (database is None)
