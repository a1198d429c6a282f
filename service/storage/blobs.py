"""Content-addressed blob files: ``blobs/ab/cdef...`` named by the sha256 of their bytes.

Bytes are streamed into a temporary file in ``tmp/`` (same filesystem), hashed on the way, then
renamed into place, so a blob path either holds the complete content or does not exist. The same
content uploaded twice lands on the same path once. File names from uploads are never used as
paths: only hex digests are.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from service.core.errors import PayloadTooLarge

_SHA256 = re.compile(r"^[0-9a-f]{64}$")


STAGING_PREFIX = "stage-"


@contextlib.contextmanager
def staging_dir(tmp: Path) -> Iterator[Path]:
    """A fresh folder in ``tmp/`` for one upload's validation, removed afterwards however it
    ended: a validation process killed at its time or memory limit leaves its partial files
    there, and the parent (this) removes them, not the next restart."""
    tmp.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=tmp))
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@dataclass(frozen=True, slots=True)
class StoredBlob:
    """A blob that is complete on disk."""

    sha256: str
    size: int
    path: Path


@dataclass(frozen=True, slots=True)
class PendingBlob:
    """Complete, hashed bytes in a temp file, not yet in the store (nothing sees them)."""

    sha256: str
    size: int
    path: Path

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)


class BlobStore:
    """The blob directory and its temp directory."""

    def __init__(self, root: Path, tmp: Path) -> None:
        self.root = Path(root)
        self.tmp = Path(tmp)
        self.root.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)

    def path_for(self, sha256: str) -> Path:
        """Where the blob with this digest lives (refuses anything but a hex digest)."""
        if not _SHA256.match(sha256):
            raise ValueError(f"not a sha256 hex digest: {sha256!r}")
        return self.root / sha256[:2] / sha256[2:]

    def exists(self, sha256: str) -> bool:
        return self.path_for(sha256).is_file()

    def open_temp(self) -> tuple[IO[bytes], Path]:
        """A new temp file in ``tmp/`` (caller writes, then ``commit`` or ``discard``)."""
        fd, name = tempfile.mkstemp(dir=self.tmp, prefix="part-")
        return os.fdopen(fd, "wb"), Path(name)

    def commit(self, temp: Path, sha256: str, size: int) -> StoredBlob:
        """Move a complete temp file into its content address (or drop it if already there)."""
        target = self.path_for(sha256)
        if target.is_file():
            temp.unlink(missing_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(temp, target)
        return StoredBlob(sha256, size, target)

    def stage_chunks(self, chunks: Iterable[bytes], *, limit: int | None = None) -> PendingBlob:
        """Write a stream of bytes to a temp file, hashing it; commit or discard it later.

        :raises PayloadTooLarge: past ``limit`` bytes (the temp file is removed).
        """
        fh, temp = self.open_temp()
        digest = hashlib.sha256()
        size = 0
        try:
            with fh:
                for chunk in chunks:
                    size += len(chunk)
                    if limit is not None and size > limit:
                        raise PayloadTooLarge(f"content is larger than the limit of {limit} bytes")
                    digest.update(chunk)
                    fh.write(chunk)
                fh.flush()
                os.fsync(fh.fileno())
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        return PendingBlob(digest.hexdigest(), size, temp)

    def stage_file(self, fileobj: IO[bytes], *, limit: int | None = None) -> PendingBlob:
        """``stage_chunks`` over the rest of a file object."""
        return self.stage_chunks(iter(lambda: fileobj.read(1 << 20), b""), limit=limit)

    def commit_pending(self, pending: PendingBlob) -> StoredBlob:
        """Move a staged blob into its content address."""
        return self.commit(pending.path, pending.sha256, pending.size)

    def put_chunks(self, chunks: Iterable[bytes], *, limit: int | None = None) -> StoredBlob:
        """Store a stream of bytes; :raises PayloadTooLarge: past ``limit`` bytes."""
        return self.commit_pending(self.stage_chunks(chunks, limit=limit))

    def put_file(self, fileobj: IO[bytes], *, limit: int | None = None) -> StoredBlob:
        """Store the rest of a file object."""
        return self.put_chunks(iter(lambda: fileobj.read(1 << 20), b""), limit=limit)

    def clean_tmp(self) -> int:
        """Remove what a killed API process left in ``tmp/``: partial uploads, validation copies
        and bundle extraction folders. Call only when no upload is in flight (at start)."""
        removed = 0
        for path in [*self.tmp.glob("part-*"), *self.tmp.glob("check-*")]:
            with contextlib.suppress(OSError):
                path.unlink()
                removed += 1
        for folder in [*self.tmp.glob("cptrace-bundle-*"), *self.tmp.glob(f"{STAGING_PREFIX}*")]:
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
        return removed

    def iter_digests(self) -> Iterator[str]:
        """Digests of every blob file on disk (``ab/cdef...`` -> ``abcdef...``)."""
        for folder in self.root.iterdir():
            if not folder.is_dir() or len(folder.name) != 2:
                continue
            for file in folder.iterdir():
                digest = folder.name + file.name
                if _SHA256.match(digest):
                    yield digest

    def sweep_orphans(self, known: Callable[[str], bool]) -> int:
        """Remove blob files that no database row refers to.

        Validation writes blobs before the API records their run; a server killed in between
        leaves files without a row. Call at start-up, before any upload can be in flight.
        """
        removed = 0
        for digest in list(self.iter_digests()):
            if not known(digest):
                with contextlib.suppress(OSError):
                    self.path_for(digest).unlink()
                    removed += 1
        return removed


async def aiter_limited(stream: AsyncIterator[bytes], limit: int) -> AsyncIterator[bytes]:
    """Pass a body stream through, raising ``PayloadTooLarge`` as soon as it passes ``limit``."""
    seen = 0
    async for chunk in stream:
        seen += len(chunk)
        if seen > limit:
            raise PayloadTooLarge(f"request body is larger than the limit of {limit} bytes")
        yield chunk
