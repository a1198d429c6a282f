"""The blob store's one interface, on both backends (a local folder; S3 over real HTTP to a moto
server): content addressing, no-op puts, streamed and ranged reads, staging, delete, sweeps."""

from __future__ import annotations

import hashlib
import io
import os
import pickle
from pathlib import Path

import pytest
from service_factories import KINETO_RANK0

from analyzers.errors import TraceError
from service.core.config import Settings, SettingsError
from service.core.errors import PayloadTooLarge
from service.ingest import Limits, stage_trace
from service.storage.blobs import (
    PART_BYTES,
    BlobConfigError,
    Blobs,
    BlobStore,
    BlobStoreUnavailable,
    S3BlobStore,
    S3Location,
    blob_location,
)


def _tmp_files(blobs: Blobs) -> list[Path]:
    return list(blobs.tmp.iterdir())


def test_blobs_are_content_addressed(any_blobs: Blobs) -> None:
    a = any_blobs.put_chunks([b"hello ", b"world"])
    b = any_blobs.put_file(io.BytesIO(b"hello world"))
    assert a == b and a.sha256 == hashlib.sha256(b"hello world").hexdigest()
    assert any_blobs.read_bytes(a.sha256) == b"hello world"
    assert list(any_blobs.iter_digests()) == [a.sha256]  # stored once
    with pytest.raises(PayloadTooLarge):
        any_blobs.put_chunks([b"x" * 10, b"y" * 10], limit=15)
    assert _tmp_files(any_blobs) == []  # nothing partial left
    with pytest.raises(ValueError, match="not a sha256"):
        any_blobs.exists("../../etc/passwd")


def test_local_blob_path(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path / "blobs", tmp_path / "tmp")
    a = blobs.put_chunks([b"hello world"])
    assert blobs.path_for(a.sha256) == tmp_path / "blobs" / a.sha256[:2] / a.sha256[2:]
    assert blobs.path_for(a.sha256).read_bytes() == b"hello world"


def test_a_put_of_an_existing_digest_changes_nothing(any_blobs: Blobs) -> None:
    first = any_blobs.put_chunks([b"same bytes"])
    pending = any_blobs.stage_chunks([b"same bytes"])
    any_blobs.spool(pending.path)
    assert any_blobs.commit_pending(pending) == first
    assert not pending.path.exists() and _tmp_files(any_blobs) == []
    assert list(any_blobs.iter_digests()) == [first.sha256]


def test_large_blob_in_parts_and_ranged_reads(any_blobs: Blobs) -> None:
    """Larger than one multipart part: uploaded in parts, read back in ranges."""
    data = os.urandom(PART_BYTES + 12345)
    stored = any_blobs.put_chunks(data[i : i + 65536] for i in range(0, len(data), 65536))
    assert stored.size == len(data)
    assert b"".join(any_blobs.read_chunks(stored.sha256)) == data
    assert b"".join(any_blobs.read_chunks(stored.sha256, start=10, end=20)) == data[10:20]
    tail = b"".join(any_blobs.read_chunks(stored.sha256, start=PART_BYTES))
    assert tail == data[PART_BYTES:]
    assert b"".join(any_blobs.read_chunks(stored.sha256, start=5, end=5)) == b""


def test_materialise_is_bounded(any_blobs: Blobs, tmp_path: Path) -> None:
    stored = any_blobs.put_chunks([b"t" * 1000])
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    any_blobs.materialise(stored.sha256, scratch / "trace.json", limit=1000)
    assert (scratch / "trace.json").read_bytes() == b"t" * 1000
    with pytest.raises(PayloadTooLarge, match="limit of 999 bytes"):
        any_blobs.materialise(stored.sha256, scratch / "again.json", limit=999)
    assert sorted(p.name for p in scratch.iterdir()) == ["trace.json"]  # nothing partial
    with pytest.raises(FileNotFoundError):
        any_blobs.materialise("0" * 64, scratch / "missing.json", limit=1000)
    with pytest.raises(FileNotFoundError):
        any_blobs.read_bytes("0" * 64)


def test_discarded_temp_leaves_nothing(any_blobs: Blobs) -> None:
    """A spooled upload that is refused: its temp file and staging object are gone."""
    pending = any_blobs.stage_chunks([b"refused upload"])
    any_blobs.spool(pending.path)
    any_blobs.discard_temp(pending.path)
    assert _tmp_files(any_blobs) == []
    assert not any_blobs.exists(pending.sha256) and list(any_blobs.iter_digests()) == []
    if isinstance(any_blobs, S3BlobStore):
        assert list(any_blobs.objects("")) == []  # no staging object either


def test_delete_and_sweep(any_blobs: Blobs, monkeypatch: pytest.MonkeyPatch) -> None:
    keep = any_blobs.put_chunks([b"referenced"])
    orphan = any_blobs.put_chunks([b"orphan"])
    gone = any_blobs.put_chunks([b"deleted"])
    any_blobs.delete(gone.sha256)
    any_blobs.delete(gone.sha256)  # twice: nothing happens
    assert not any_blobs.exists(gone.sha256)
    if isinstance(any_blobs, S3BlobStore):
        # young objects are spared (another host may be between commit and insert) ...
        assert any_blobs.sweep_orphans({keep.sha256}.__contains__) == 0
        monkeypatch.setattr("service.storage.blobs.S3_GRACE_S", -1.0)  # ... an hour later:
    assert any_blobs.sweep_orphans({keep.sha256}.__contains__) == 1
    assert sorted(any_blobs.iter_digests()) == [keep.sha256]
    assert not any_blobs.exists(orphan.sha256)


def test_clean_tmp_removes_staging_of_killed_uploads(
    s3_location: S3Location, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = S3BlobStore(s3_location, tmp_path / "tmp")
    store.check()
    pending = store.stage_chunks([b"an upload whose API process was killed"])
    store.spool(pending.path)  # a staging object, never committed nor discarded
    monkeypatch.setattr("service.storage.blobs.S3_GRACE_S", -1.0)
    assert store.clean_tmp() == 2  # the local temp file and the staging object
    assert list(store.objects("")) == [] and _tmp_files(store) == []


def test_blob_locations() -> None:
    assert blob_location("s3://bucket/a/b/") == S3Location("bucket", "a/b/")
    assert blob_location("s3://bucket") == S3Location("bucket", "")
    assert blob_location("relative/dir") == Path("relative/dir").absolute()
    with pytest.raises(BlobConfigError, match="bucket name 'B_'"):
        blob_location("s3://B_/x")
    with pytest.raises(BlobConfigError, match="only a folder or s3://"):
        blob_location("gs://bucket/x")


def test_blob_settings(tmp_path: Path) -> None:
    assert Settings(data_dir=tmp_path).blob_location == tmp_path / "blobs"
    settings = Settings(data_dir=tmp_path, blobs="s3://b-1/p", s3_endpoint_url="http://h:9000")
    assert settings.blob_location == S3Location("b-1", "p/", "http://h:9000")
    with pytest.raises(SettingsError, match=r"CPTRACE_BLOBS='s3://x/p'.*bucket name 'x'"):
        Settings(data_dir=tmp_path, blobs="s3://x/p")


def test_unreachable_store_is_one_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from testkit import free_port

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    location = S3Location("bucket", "", f"http://127.0.0.1:{free_port()}")
    store = S3BlobStore(location, tmp_path / "tmp")
    with pytest.raises(BlobConfigError, match=r"blob store s3://bucket/ at http://127\.0\.0\.1"):
        store.check()
    with pytest.raises(BlobStoreUnavailable, match="blob store s3://bucket/") as down:
        store.exists("0" * 64)  # a store that goes away later: a 503, never a 500
    assert down.value.status == 503
    assert pickle.loads(pickle.dumps(down.value)).status == 503  # crosses the process boundary


def test_a_trace_upload_is_stored_after_its_check(any_blobs: Blobs) -> None:
    """``stage_trace`` (the single-trace upload) spools the file while it is checked."""
    data = KINETO_RANK0.read_bytes()
    pending = any_blobs.stage_chunks([data])
    at = any_blobs.root if isinstance(any_blobs, BlobStore) else any_blobs.location
    limits = Limits(64 * 1024 * 1024, 8)
    staged = stage_trace(pending.path, pending.sha256, "r0.json.gz", at, any_blobs.tmp, limits)
    assert [(f.sha256, f.format, f.gzipped) for f in staged.files] == [
        (pending.sha256, "kineto", True)
    ]
    assert any_blobs.read_bytes(pending.sha256) == data and _tmp_files(any_blobs) == []
    bad = any_blobs.stage_chunks([b'{"traceEvents": ['])
    with pytest.raises(TraceError, match=r"r1\.json"):
        stage_trace(bad.path, bad.sha256, "r1.json", at, any_blobs.tmp, limits)
    assert not any_blobs.exists(bad.sha256) and _tmp_files(any_blobs) == []
    assert list(any_blobs.iter_digests()) == [pending.sha256]
    if isinstance(any_blobs, S3BlobStore):
        assert list(any_blobs.objects("staging/")) == []


def test_cli_blobs_option_errors_are_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--blobs`` on ``cptrace worker``: a bad location or an unreachable store is one
    ``Error:`` line, no traceback."""
    from testkit import free_port
    from typer.testing import CliRunner

    from cptrace.cli import app

    bad = CliRunner().invoke(app, ["worker", "--data-dir", str(tmp_path), "--blobs", "s3://B_"])
    assert bad.exit_code == 1 and "bucket name 'B_'" in bad.output
    assert "Traceback" not in bad.output
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    monkeypatch.setenv("CPTRACE_S3_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    down = CliRunner().invoke(
        app, ["worker", "--data-dir", str(tmp_path), "--blobs", "s3://bucket/p", "--once"]
    )
    assert down.exit_code == 1 and "Error: blob store s3://bucket/p/ at http://" in down.output
    assert "Traceback" not in down.output
