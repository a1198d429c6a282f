"""Disk: deleting a run frees the blobs no other run shares; a full disk (or one below the
free-space floor) answers 507 with the reason, never a 500; what one upload and one token may
store is capped (issue 24, item 4)."""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from service_factories import auth, kineto_bundle

from service.auth import Role, create_token
from service.core.config import Settings
from service.main import create_app


def _client(data_dir: Path, **settings: Any) -> tuple[TestClient, dict[str, str]]:
    app = create_app(Settings(data_dir=data_dir, ingest_workers=0, **settings))
    token = app.state.db.write_tx(lambda c: create_token(c, role=Role.ADMIN))
    return TestClient(app), auth(token)


def _runner(client: TestClient, name: str) -> dict[str, str]:
    app: Any = client.app
    return auth(app.state.db.write_tx(lambda c: create_token(c, role=Role.RUNNER, runner=name)))


def _stored_size(bundle: bytes) -> int:
    """What a bundle's members store (the sum of their sizes)."""
    with tarfile.open(fileobj=io.BytesIO(bundle), mode="r:gz") as tar:
        return sum(m.size for m in tar.getmembers())


def _upload(client: TestClient, headers: dict[str, str], body: bytes) -> object:
    return client.post(
        "/api/v1/uploads/bundles", content=body,
        headers={**headers, "Content-Type": "application/gzip"},
    )  # fmt: skip


def _blob_files(data_dir: Path) -> set[str]:
    return {p.parent.name + p.name for p in (data_dir / "blobs").glob("*/*") if p.is_file()}


def test_deleting_a_run_frees_its_unshared_blobs(tmp_path: Path) -> None:
    client, admin = _client(tmp_path)
    with client:
        first = _upload(client, admin, kineto_bundle(name="one", salt="x")).json()  # type: ignore[attr-defined]
        before = _blob_files(tmp_path)
        second = _upload(client, admin, kineto_bundle(name="two", salt="x")).json()  # type: ignore[attr-defined]
        shared = before & _blob_files(tmp_path)
        assert shared, "the two bundles share their trace blob"
        assert client.delete(f"/api/v1/runs/{second['run_id']}", headers=admin).status_code == 200
        assert _blob_files(tmp_path) == before, "the deleted run's own blobs are gone"
        assert client.delete(f"/api/v1/runs/{first['run_id']}", headers=admin).status_code == 200
        assert _blob_files(tmp_path) == set()
        again = _upload(client, admin, kineto_bundle(name="one", salt="x"))
        assert again.status_code == 201  # type: ignore[attr-defined]


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Path]:
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)],
        capture_output=True, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_answers_507(small_disk: Path) -> None:
    client, admin = _client(small_disk / "data")
    with client:
        big = os.urandom(2 * 1024 * 1024)  # more than the disk holds
        answer = _upload(client, admin, big)
        assert answer.status_code == 507, answer.text  # type: ignore[attr-defined]
        assert "disk is full" in answer.json()["error"]  # type: ignore[attr-defined]
        assert client.get("/api/v1/runs").status_code == 200  # reads go on


def test_a_small_upload_cannot_store_a_large_blob(tmp_path: Path) -> None:
    """An uncompressed member inside the archive's gzip: 100 MB stored from a ~100 KB upload."""
    import io
    import json
    import tarfile

    from service_factories import manifest_for

    member = b'{"traceEvents": [' + b" " * (100 * 1024 * 1024) + b"]}"
    traces = [("traces/rank0.json", member, "kineto", 0)]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in (("manifest.json", json.dumps(manifest_for(traces)).encode()),
                           ("traces/rank0.json", member)):  # fmt: skip
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    body = buf.getvalue()
    assert len(body) < 1024 * 1024
    client, admin = _client(tmp_path)
    with client:
        answer = _upload(client, admin, body)
        assert answer.status_code == 413, answer.text  # type: ignore[attr-defined]
        assert "bytes" in answer.json()["error"]  # type: ignore[attr-defined]
    assert _blob_files(tmp_path) == set()


def test_a_disk_below_its_free_space_floor_answers_507(tmp_path: Path) -> None:
    """No root needed: a floor above the disk's free space is a full disk to the service."""
    client, admin = _client(tmp_path, health_min_free_bytes=1 << 62)
    with client:
        answer = _upload(client, admin, kineto_bundle(name="floor"))
        assert answer.status_code == 507, answer.text  # type: ignore[attr-defined]
        error = answer.json()["error"]  # type: ignore[attr-defined]
        assert "disk is full" in error and "CPTRACE_HEALTH_MIN_FREE_BYTES" in error
        trace = client.post(
            "/api/v1/uploads/traces", headers=admin, files={"trace": ("t.json", b"{}")}
        )
        assert trace.status_code == 507, trace.text
        assert client.get("/api/v1/runs").json()["total"] == 0  # reads go on, nothing stored
    assert _blob_files(tmp_path) == set()
    assert not list((tmp_path / "tmp").glob("part-*"))


def test_one_upload_may_store_at_most_its_cap(tmp_path: Path) -> None:
    bundle = kineto_bundle(name="cap")
    client, admin = _client(tmp_path, max_stored_bytes_per_upload=_stored_size(bundle) - 1)
    with client:
        answer = _upload(client, admin, bundle)
        assert answer.status_code == 413, answer.text  # type: ignore[attr-defined]
        assert "bytes" in answer.json()["error"]  # type: ignore[attr-defined]
    assert _blob_files(tmp_path) == set()


def test_a_token_stores_at_most_its_quota_until_runs_are_deleted(tmp_path: Path) -> None:
    first, second = kineto_bundle(name="a", salt="1"), kineto_bundle(name="b", salt="2")
    quota = _stored_size(first) * 3 // 2  # one bundle fits, two do not
    client, admin = _client(tmp_path, token_stored_quota_bytes=quota)
    with client:
        alice, bob = _runner(client, "alice"), _runner(client, "bob")
        made = _upload(client, alice, first)
        assert made.status_code == 201, made.text  # type: ignore[attr-defined]
        over = _upload(client, alice, second)
        assert over.status_code == 413, over.text  # type: ignore[attr-defined]
        assert "quota" in over.json()["error"]  # type: ignore[attr-defined]
        assert _upload(client, bob, second).status_code == 201  # type: ignore[attr-defined]
        full = _upload(client, alice, kineto_bundle(name="c", salt="3"))
        assert full.status_code == 413  # type: ignore[attr-defined]
        trace = client.post(
            "/api/v1/uploads/traces", headers=alice,
            files={"trace": ("big.json", b" " * quota)},
        )  # fmt: skip
        assert trace.status_code == 413 and "quota" in trace.json()["error"], trace.text
        run_id = made.json()["run_id"]  # type: ignore[attr-defined]
        assert client.delete(f"/api/v1/runs/{run_id}", headers=admin).status_code == 200
        assert _upload(client, alice, kineto_bundle(name="d", salt="4")).status_code == 201  # type: ignore[attr-defined]
