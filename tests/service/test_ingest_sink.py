"""``BlobSink``: members flushed to disk in the background, committed only once all are on disk."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from analyzers.bundle import BundleFile
from service.ingest import MAX_PENDING_SYNCS, BlobSink
from service.storage.blobs import BlobStore


def _chunks(data: bytes) -> list[bytes]:
    return [data[i : i + 1000] for i in range(0, len(data), 1000)]


def test_many_members_are_all_committed_intact(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path / "blobs", tmp_path / "tmp")
    sink = BlobSink(blobs)
    contents = {f"traces/t{i}.json": f"member {i} ".encode() * (i + 1) for i in range(80)}
    assert len(contents) > 2 * MAX_PENDING_SYNCS  # the bound on open files is exercised
    files = []
    for member, data in contents.items():
        path = sink.put(member, _chunks(data))
        digest = hashlib.sha256(data).hexdigest()
        files.append(BundleFile(member=member, path=path, sha256=digest, size=len(data)))
    sink.commit(files)
    sink.discard()
    for f, data in zip(files, contents.values(), strict=True):
        assert blobs.path_for(f.sha256).read_bytes() == data
    assert list((tmp_path / "tmp").iterdir()) == []


def test_a_failing_member_leaves_nothing(tmp_path: Path) -> None:
    blobs = BlobStore(tmp_path / "blobs", tmp_path / "tmp")
    sink = BlobSink(blobs)
    sink.put("traces/a.json", [b"a" * 5000])

    def broken() -> list[bytes]:
        raise ValueError("member over its cap")

    with pytest.raises(ValueError, match="cap"):
        sink.put("traces/b.json", (chunk for chunk in broken()))
    sink.discard()
    assert list((tmp_path / "tmp").iterdir()) == []
    assert not any(p.is_file() for p in (tmp_path / "blobs").rglob("*"))
