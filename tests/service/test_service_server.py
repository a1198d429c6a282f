"""A real server on loopback: SIGKILL mid-upload and mid-analysis, concurrent uploads and claims."""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from service_factories import SPEC_YAML, kineto_bundle, te_3arms_bundle
from service_server import Server, db_state, group_alive, wait_for

pytestmark = pytest.mark.slow


def _multipart(
    field: str, data: bytes, *, chunk: int, delay: float, stop: threading.Event | None = None
) -> tuple[Iterator[bytes], str]:
    boundary = "cptrace-test-boundary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="{field}"; '
        f'filename="b.tar.gz"\r\nContent-Type: application/gzip\r\n\r\n'
    ).encode()

    def body() -> Iterator[bytes]:
        yield head
        for i in range(0, len(data), chunk):
            if stop is not None and stop.is_set():
                return
            yield data[i : i + chunk]
            time.sleep(delay)
        yield f"\r\n--{boundary}--\r\n".encode()

    return body(), f"multipart/form-data; boundary={boundary}"


def test_sigkill_during_upload_leaves_nothing_and_retry_works(tmp_path: Path) -> None:
    data = te_3arms_bundle(name="killed-upload")
    server = Server(tmp_path, worker=False).start()
    headers = server.headers
    sent = threading.Event()
    errors: list[BaseException] = []

    def slow_upload() -> None:
        body, ctype = _multipart("bundle", data, chunk=256 * 1024, delay=0.2)

        def tracking() -> Iterator[bytes]:
            for i, part in enumerate(body):
                if i == 4:
                    sent.set()  # about 1 MB is on the server
                yield part

        try:
            httpx.post(
                f"{server.url}/api/v1/uploads/bundles",
                content=tracking(),
                headers={**headers, "Content-Type": ctype},
                timeout=30,
            )
        except httpx.HTTPError as exc:
            errors.append(exc)

    thread = threading.Thread(target=slow_upload)
    thread.start()
    try:
        assert sent.wait(30)
        server.kill()
    finally:
        thread.join(timeout=60)
    assert errors, "the upload must not have completed"
    state = db_state(tmp_path)
    assert state["integrity"] == "ok"
    assert state["runs"] == 0 and state["run_files"] == 0
    restarted = Server(tmp_path, worker=False).start()
    try:
        assert not list((tmp_path / "tmp").glob("part-*")), "partial uploads are cleaned at start"
        resp = httpx.post(
            f"{restarted.url}/api/v1/uploads/bundles",
            headers=headers,
            files={"bundle": ("b.tar.gz", data)},
            timeout=60,
        )
        assert resp.status_code == 201, resp.text
        assert db_state(tmp_path)["runs"] == 1
    finally:
        restarted.stop()


def test_sigkill_during_analysis_then_requeued(tmp_path: Path) -> None:
    env = {"CPTRACE_ANALYSIS_LEASE_S": "2"}
    server = Server(tmp_path, env=env).start()
    headers = server.headers
    resp = httpx.post(
        f"{server.url}/api/v1/uploads/bundles",
        headers=headers,
        files={"bundle": ("b.tar.gz", te_3arms_bundle())},
        timeout=60,
    )
    run_id = resp.json()["run_id"]

    def analysing() -> bool:
        # Any stage before "done" (no report is stored before it). Progress writes are
        # throttled, so a fast read can be published as "attributing" without a "reading".
        run = httpx.get(f"{server.url}/api/v1/runs/{run_id}").json()
        stage = (run["progress"] or "").split(" ")[0]
        return run["status"] == "analysing" and stage in {"reading", "attributing", "metrics"}

    wait_for(analysing, 30, "the worker to be inside the analysis", interval=0.02)
    server.kill()
    state = db_state(tmp_path)
    assert state["integrity"] == "ok"
    assert state["reports"] == 0 and state["statuses"] == ["analysing"], state  # no partial report
    restarted = Server(tmp_path, env=env).start()
    try:

        def analysed() -> bool:
            run = httpx.get(f"{restarted.url}/api/v1/runs/{run_id}").json()
            assert run["status"] != "failed", (run["error"], run["progress"])
            return run["status"] == "analysed"

        wait_for(analysed, 90, "the requeued analysis to finish", interval=0.2)
        status = httpx.get(f"{restarted.url}/api/v1/runs/{run_id}/analysis").json()
        assert status["attempts"] == 2
    finally:
        restarted.stop()
    # graceful stop: uvicorn exits and takes its worker subprocess with it
    wait_for(lambda: not group_alive(restarted), 30, "the worker to stop")
    assert "analysis worker" in restarted.log.read_text() and "stopped" in restarted.log.read_text()
    assert db_state(tmp_path)["integrity"] == "ok"


def test_50_concurrent_uploads_stored_once(tmp_path: Path) -> None:
    server = Server(tmp_path, worker=False).start()
    try:
        bundles = [kineto_bundle(name=f"c{i}", salt=str(i)) for i in range(10)]
        work = [bundles[i % 10] for i in range(50)]

        def upload(data: bytes) -> tuple[int, dict]:
            key = hashlib.sha256(data).hexdigest()
            resp = httpx.post(
                f"{server.url}/api/v1/uploads/bundles",
                headers={**server.headers, "Idempotency-Key": key},
                files={"bundle": ("b.tar.gz", data)},
                timeout=120,
            )
            return resp.status_code, resp.json()

        with ThreadPoolExecutor(max_workers=50) as pool:
            results = list(pool.map(upload, work))
        assert all(status in (200, 201) for status, _ in results), results
        created = [body for status, body in results if status == 201]
        assert len(created) == 10 and all(b["created"] for b in created)
        by_sha = {body["sha256"]: body["run_id"] for _, body in results}
        assert len(by_sha) == 10
        assert all(by_sha[b["sha256"]] == b["run_id"] for _, b in results)  # one run per content
        state = db_state(tmp_path)
        assert state["runs"] == 10 and state["integrity"] == "ok"
        blob_files = [p for p in (tmp_path / "blobs").rglob("*") if p.is_file()]
        assert len(blob_files) == 12  # 10 manifests + the 2 shared trace files
    finally:
        server.stop()


def test_concurrent_http_claims_hand_each_job_once(tmp_path: Path) -> None:
    server = Server(tmp_path, worker=False).start()
    try:
        for _ in range(20):
            resp = httpx.post(
                f"{server.url}/api/v1/jobs",
                json={"spec_yaml": SPEC_YAML},
                headers=server.headers,
                timeout=30,
            )
            assert resp.status_code == 201
        claimed: list[int] = []
        lock = threading.Lock()

        def runner(name: str) -> None:
            with httpx.Client(base_url=server.url, headers=server.headers, timeout=30) as http:
                while (
                    resp := http.post("/api/v1/jobs/claim", json={"runner": name})
                ).status_code == 200:
                    with lock:
                        claimed.append(resp.json()["id"])

        threads = [threading.Thread(target=runner, args=(f"r{i}",)) for i in range(10)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert sorted(claimed) == list(range(1, 21))
        runners = httpx.get(f"{server.url}/api/v1/runners").json()
        assert len(runners) == 10
    finally:
        server.stop()


def test_runner_client_speaks_the_protocol(tmp_path: Path) -> None:
    """The runners' stdlib client (upload with Idempotency-Key, claim long poll, lease calls)."""
    from runners.http import ApiError, ServiceClient
    from runners.upload import upload_bundle

    server = Server(tmp_path / "data", worker=False)
    server.data_dir.mkdir()
    server.start()
    try:
        archive = tmp_path / "bundle.tar.gz"
        archive.write_bytes(kineto_bundle(name="via-runner-client"))
        client = ServiceClient(server.url, server.admin_token or "")
        first = upload_bundle(archive, client)
        again = upload_bundle(archive, client)
        assert first.created and not again.created and again.run_id == first.run_id
        assert (
            client.post_json("/jobs/claim", {"runner": "g1", "gpus": 2, "wait_s": 0.2}).status
            == 204
        )
        client.post_json("/jobs", {"spec_yaml": SPEC_YAML})
        claimed = client.post_json("/jobs/claim", {"runner": "g1", "gpus": 2, "wait_s": 5})
        assert claimed.status == 200 and claimed.body["spec"]["name"] == "test-job"
        job = claimed.body["id"]
        assert client.post_json(f"/jobs/{job}/heartbeat", {}).body["lease_expires_at"] > 0
        client.post_json(f"/jobs/{job}/complete", {"run_id": first.run_id})
        with pytest.raises(ApiError) as lost:
            client.post_json(f"/jobs/{job}/heartbeat", {})
        assert lost.value.status == 409 and not lost.value.retryable
    finally:
        server.stop()
