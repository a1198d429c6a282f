"""One real ``cptrace serve`` (uvicorn, validation processes, the worker) with its blobs in S3
(moto's server over HTTP): uploads land in the bucket only, the worker analyses from it (per
rank: the parts pass through the bucket and are deleted after the merge), a refused upload and
a deleted run leave no object behind."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx
import pytest
from service_factories import bundle_with, kineto_bundle
from service_server import Server, wait_for

from service.storage.blobs import S3BlobStore, S3Location

pytestmark = pytest.mark.slow


def _stored_digests(data_dir: Path) -> set[str]:
    conn = sqlite3.connect(data_dir / "cptrace.db")
    try:
        return {r[0] for r in conn.execute("SELECT sha256 FROM run_files")}
    finally:
        conn.close()


def test_upload_and_analysis_with_s3_blobs(s3_location: S3Location, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    env = {
        "CPTRACE_BLOBS": s3_location.url,
        "CPTRACE_S3_ENDPOINT_URL": s3_location.endpoint_url,
        "CPTRACE_INGEST_WORKERS": "1",  # one validation process to start on this busy machine
        "CPTRACE_WORKER_POLL_S": "0.1",
        # per rank: the rank tasks' part blobs go to the bucket too, and are gone after
        "CPTRACE_ANALYSIS_PER_RANK_MIN_BYTES": "0",
    }
    server = Server(data_dir, env=env).start()  # creates the bucket at start
    bucket = S3BlobStore(s3_location, tmp_path / "probe-tmp")
    api = f"{server.url}/api/v1"
    try:
        bundle = kineto_bundle(name="s3-run", salt="s3")
        resp = httpx.post(
            f"{api}/uploads/bundles", headers=server.headers, files={"bundle": bundle}, timeout=60
        )
        assert resp.status_code == 201, resp.text
        run_id = resp.json()["run_id"]
        again = httpx.post(
            f"{api}/uploads/bundles", headers=server.headers, files={"bundle": bundle}, timeout=60
        )
        assert again.status_code == 200 and again.json()["run_id"] == run_id

        def analysed() -> bool:
            run = httpx.get(f"{api}/runs/{run_id}").json()
            assert run["status"] != "failed", run["error"]
            return run["status"] == "analysed"

        wait_for(analysed, 120, "the analysis of the S3-stored run", interval=0.2)
        assert "analysing 2 files per rank as 2 queue tasks" in server.log.read_text()
        report = httpx.get(f"{api}/runs/{run_id}/analysis/result", timeout=30)
        assert report.status_code == 200 and report.json()["ranks"] == [0, 1]
        digests = _stored_digests(data_dir)
        assert len(digests) == 3  # the manifest and two traces
        assert set(bucket.iter_digests()) == digests  # every file in the bucket, once; no part
        assert list(bucket.objects("staging/")) == []  # no staging object is left
        assert not any(p.is_file() for p in (data_dir / "blobs").rglob("*"))  # none on disk
        assert not list((data_dir / "tmp").glob("analysis-*"))  # the scratch copies are gone

        bad = bundle_with("traces/rank0.json", b'{"traceEvents": [', "kineto")
        refused = httpx.post(
            f"{api}/uploads/bundles", headers=server.headers, files={"bundle": bad}, timeout=60
        )
        assert refused.status_code in (400, 422), refused.text
        assert set(bucket.iter_digests()) == digests
        assert list(bucket.objects("staging/")) == []

        gone = httpx.delete(f"{api}/runs/{run_id}", headers=server.headers, timeout=30)
        assert gone.status_code == 200, gone.text
        assert list(bucket.iter_digests()) == []
    finally:
        server.stop()
