"""Two API processes behind one database (``cptrace serve --no-worker`` twice on one data
directory, as two hosts would share one database and blob store) accept concurrent uploads
of the same bundle and store it once: every answer names the same run, one run row, one
upload key, each blob once. SQLite is the backend a service runs on today (a PostgreSQL URL is
refused at start), so this runs on SQLite's file lock."""

from __future__ import annotations

import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from service_factories import kineto_bundle
from service_server import Server


@pytest.mark.timeout(60)
def test_two_api_processes_store_a_bundle_uploaded_to_both_once(tmp_path: Path) -> None:
    first = Server(tmp_path, worker=False).start()
    second = None
    try:
        second = Server(tmp_path, worker=False).start()  # the schema and admin token exist
        headers = first.headers
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
        for server in (first, second):
            if server is not None:
                server.kill()
    assert all(r.status_code in (200, 201) for r in answers), [r.text for r in answers]
    assert len({r.json()["run_id"] for r in answers}) == 1
    assert sum(r.status_code == 201 for r in answers) == 1  # created once, then found
    conn = sqlite3.connect(tmp_path / "cptrace.db")
    try:
        assert conn.execute("SELECT count(*) FROM runs").fetchone() == (1,)
        assert conn.execute("SELECT count(*) FROM uploads").fetchone() == (1,)
        files, blobs = conn.execute(
            "SELECT count(*), count(DISTINCT sha256) FROM run_files"
        ).fetchone()
        assert files == blobs and conn.execute("SELECT count(*) FROM blobs").fetchone() == (blobs,)
    finally:
        conn.close()
