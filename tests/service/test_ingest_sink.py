"""``BlobSink``: members spooled in the background (flushed to disk, or uploaded to S3), committed
only once all are spooled; on both blob backends."""

from __future__ import annotations

import hashlib

import pytest

from analyzers.bundle import BundleFile
from service.ingest import MAX_PENDING_SYNCS, BlobSink
from service.storage.blobs import Blobs, S3BlobStore

pytestmark = pytest.mark.slow  # the file's tests take long together: it is scheduled first


def _chunks(data: bytes) -> list[bytes]:
    return [data[i : i + 1000] for i in range(0, len(data), 1000)]


def test_many_members_are_all_committed_intact(any_blobs: Blobs) -> None:
    sink = BlobSink(any_blobs)
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
        assert any_blobs.read_bytes(f.sha256) == data
    assert list(any_blobs.tmp.iterdir()) == []


def test_a_failing_member_leaves_nothing(any_blobs: Blobs) -> None:
    sink = BlobSink(any_blobs)
    sink.put("traces/a.json", [b"a" * 5000])

    def broken() -> list[bytes]:
        raise ValueError("member over its cap")

    with pytest.raises(ValueError, match="cap"):
        sink.put("traces/b.json", (chunk for chunk in broken()))
    sink.discard()
    assert list(any_blobs.tmp.iterdir()) == []
    assert list(any_blobs.iter_digests()) == []
    if isinstance(any_blobs, S3BlobStore):
        assert list(any_blobs.objects("")) == []  # the spooled member's staging object too
