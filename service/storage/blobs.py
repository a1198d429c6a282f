"""Content-addressed blobs named by the sha256 of their bytes, on a local folder or S3.

Two backends behind one interface (``Blobs``):

- ``BlobStore`` (the default): files ``blobs/ab/cdef...``. Bytes are streamed into a temporary
  file in ``tmp/`` (same filesystem), hashed on the way, then renamed into place, so a blob path
  either holds the complete content or does not exist.
- ``S3BlobStore`` (``--blobs s3://bucket/prefix``): objects ``prefix/blobs/ab/cdef...`` in any
  S3-compatible store (AWS, MinIO). A temp file in the local ``tmp/`` is uploaded in parts
  (multipart, streamed from disk: never the whole blob in memory), first under a staging key
  while the upload is validated (``spool``), then copied server-side to its content address on
  ``commit``; reads are ranged and streamed.

On both, the same content uploaded twice is stored once (a put of an existing digest is a
no-op), and names from uploads are never used as paths or keys: only hex digests are.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from service.core.errors import ApiError, PayloadTooLarge

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")

STAGING_PREFIX = "stage-"
CHUNK = 1 << 20
PART_BYTES = 8 * 1024 * 1024
"""Part size of multipart uploads and ranged downloads (S3's minimum part is 5 MiB)."""
COPY_OBJECT_MAX = 5 * 1024**3
"""S3's limit for one ``CopyObject``: a staged blob up to this size is committed by one request
(a multipart copy of 8 MiB ``UploadPartCopy`` parts took 2.7x as long against moto's server,
each part a request and a read of the source); only larger ones are copied in parts."""
S3_GRACE_S = 3600.0
"""Objects younger than this are never swept at start-up: with S3, API processes on other
hosts may be between storing a blob and recording its run (or validating a staged upload)."""


class BlobConfigError(ValueError):
    """A blob location (``--blobs`` / ``CPTRACE_BLOBS``) that cannot be used."""


class BlobStoreUnavailable(ApiError):
    """The S3 store refused or did not answer a call (a 503: retry later)."""

    status = 503


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


def check_digest(sha256: str) -> str:
    """The digest itself; :raises ValueError: for anything but a sha256 hex digest."""
    if not _SHA256.match(sha256):
        raise ValueError(f"not a sha256 hex digest: {sha256!r}")
    return sha256


@dataclass(frozen=True, slots=True)
class S3Location:
    """Where the S3 backend keeps its objects: ``s3://bucket/prefix`` plus an endpoint."""

    bucket: str
    prefix: str = ""
    """Empty, or ends with ``/``."""
    endpoint_url: str | None = None
    """None: boto3's own (``AWS_ENDPOINT_URL``, else AWS)."""

    @classmethod
    def parse(cls, url: str, endpoint_url: str | None = None) -> S3Location:
        """``s3://bucket[/prefix]``; :raises BlobConfigError: naming what is wrong."""
        if not url.startswith("s3://"):
            raise BlobConfigError(f"expected s3://bucket/prefix, got {url!r}")
        bucket, _, prefix = url.removeprefix("s3://").partition("/")
        if not _BUCKET.match(bucket):
            raise BlobConfigError(
                f"{url!r}: bucket name {bucket!r} is not a valid S3 bucket name "
                "(3-63 characters: lower-case letters, digits, '.' and '-')"
            )
        prefix = prefix.strip("/")
        return cls(bucket, f"{prefix}/" if prefix else "", endpoint_url or None)

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


BlobLocation = Path | S3Location
"""A local blob folder (the default) or an S3 location."""


def blob_location(value: str, *, endpoint_url: str | None = None) -> BlobLocation:
    """``s3://...`` is S3; anything else is a local folder (made absolute)."""
    if value.startswith("s3://"):
        return S3Location.parse(value, endpoint_url)
    if "://" in value:
        raise BlobConfigError(f"blob location {value!r}: only a folder or s3://bucket/prefix")
    return Path(value).expanduser().absolute()


def open_blobs(location: BlobLocation, tmp: Path) -> Blobs:
    """The blob store at ``location``; temp files always go to the local ``tmp``."""
    if isinstance(location, S3Location):
        return S3BlobStore(location, tmp)
    return BlobStore(location, tmp)


@dataclass(frozen=True, slots=True)
class StoredBlob:
    """A blob that is complete in the store."""

    sha256: str
    size: int


@dataclass(frozen=True, slots=True)
class PendingBlob:
    """Complete, hashed bytes in a temp file, not yet in the store (nothing sees them)."""

    sha256: str
    size: int
    path: Path

    def discard(self) -> None:
        self.path.unlink(missing_ok=True)


class Blobs(ABC):
    """The interface both backends serve; temp files are local (``tmp/``) on both."""

    tmp: Path

    @abstractmethod
    def check(self) -> None:
        """Make sure the store can be used (at start-up).

        :raises BlobConfigError: with the reason, when it cannot.
        """

    @abstractmethod
    def exists(self, sha256: str) -> bool:
        """Whether the blob is complete in the store."""

    @abstractmethod
    def describe(self, sha256: str) -> str:
        """Where the blob lives, for logs and for redacting error messages."""

    @abstractmethod
    def spool(self, temp: Path) -> None:
        """Start making a complete temp file durable before ``commit`` (on the disk: fsync;
        on S3: the multipart upload to a staging key). Safe to call from another thread."""

    @abstractmethod
    def commit(self, temp: Path, sha256: str, size: int) -> StoredBlob:
        """Store a complete temp file under its digest (a no-op if already there); the temp
        file is gone afterwards."""

    @abstractmethod
    def discard_temp(self, temp: Path) -> None:
        """Drop a temp file that will not be committed (and what ``spool`` made of it)."""

    @abstractmethod
    def read_chunks(
        self, sha256: str, *, start: int = 0, end: int | None = None
    ) -> Iterator[bytes]:
        """The blob's bytes ``[start, end)`` as a stream of chunks.

        :raises FileNotFoundError: no such blob.
        """

    @abstractmethod
    def materialise(self, sha256: str, dest: Path, *, limit: int) -> None:
        """Make ``dest`` (a new name in a scratch folder) a readable local file of the blob.

        :raises PayloadTooLarge: the blob is larger than ``limit`` bytes (nothing is left).
        :raises FileNotFoundError: no such blob.
        """

    @abstractmethod
    def delete(self, sha256: str) -> None:
        """Remove the blob (nothing happens when it is not there)."""

    @abstractmethod
    def iter_digests(self) -> Iterator[str]:
        """Digests of every blob in the store."""

    @abstractmethod
    def sweep_orphans(self, known: Callable[[str], bool]) -> int:
        """Remove blobs that no database row refers to (at start-up); returns how many."""

    def open_temp(self) -> tuple[IO[bytes], Path]:
        """A new temp file in ``tmp/`` (caller writes, then ``commit`` or ``discard_temp``)."""
        self.tmp.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(dir=self.tmp, prefix="part-")
        return os.fdopen(fd, "wb"), Path(name)

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
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        return PendingBlob(digest.hexdigest(), size, temp)

    def stage_file(self, fileobj: IO[bytes], *, limit: int | None = None) -> PendingBlob:
        """``stage_chunks`` over the rest of a file object."""
        return self.stage_chunks(iter(lambda: fileobj.read(CHUNK), b""), limit=limit)

    def commit_pending(self, pending: PendingBlob) -> StoredBlob:
        """Store a staged blob under its digest."""
        self.spool(pending.path)
        return self.commit(pending.path, pending.sha256, pending.size)

    def put_chunks(self, chunks: Iterable[bytes], *, limit: int | None = None) -> StoredBlob:
        """Store a stream of bytes; :raises PayloadTooLarge: past ``limit`` bytes."""
        return self.commit_pending(self.stage_chunks(chunks, limit=limit))

    def put_file(self, fileobj: IO[bytes], *, limit: int | None = None) -> StoredBlob:
        """Store the rest of a file object."""
        return self.put_chunks(iter(lambda: fileobj.read(CHUNK), b""), limit=limit)

    def read_bytes(self, sha256: str) -> bytes:
        """The whole blob (small blobs only: manifests, tests)."""
        return b"".join(self.read_chunks(sha256))

    def clean_tmp(self) -> int:
        """Remove what a killed API process left in ``tmp/``: partial uploads, validation copies
        and bundle extraction folders. Call only when no upload is in flight (at start)."""
        removed = 0
        if not self.tmp.is_dir():
            return 0
        for path in [*self.tmp.glob("part-*"), *self.tmp.glob("check-*")]:
            with contextlib.suppress(OSError):
                path.unlink()
                removed += 1
        for folder in [*self.tmp.glob("cptrace-bundle-*"), *self.tmp.glob(f"{STAGING_PREFIX}*")]:
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
        return removed


class BlobStore(Blobs):
    """The blob directory and its temp directory (the default backend)."""

    def __init__(self, root: Path, tmp: Path) -> None:
        self.root = Path(root)
        self.tmp = Path(tmp)
        self.root.mkdir(parents=True, exist_ok=True)
        self.tmp.mkdir(parents=True, exist_ok=True)

    def path_for(self, sha256: str) -> Path:
        """Where the blob with this digest lives (refuses anything but a hex digest)."""
        check_digest(sha256)
        return self.root / sha256[:2] / sha256[2:]

    def check(self) -> None:
        """The folders exist (made in ``__init__``); nothing more to check."""

    def exists(self, sha256: str) -> bool:
        return self.path_for(sha256).is_file()

    def describe(self, sha256: str) -> str:
        return str(self.path_for(sha256))

    def spool(self, temp: Path) -> None:
        with temp.open("rb") as fh:
            os.fsync(fh.fileno())

    def commit(self, temp: Path, sha256: str, size: int) -> StoredBlob:
        """Move a complete temp file into its content address (or drop it if already there)."""
        target = self.path_for(sha256)
        if target.is_file():
            temp.unlink(missing_ok=True)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            os.replace(temp, target)
        return StoredBlob(sha256, size)

    def discard_temp(self, temp: Path) -> None:
        temp.unlink(missing_ok=True)

    def read_chunks(
        self, sha256: str, *, start: int = 0, end: int | None = None
    ) -> Iterator[bytes]:
        with self.path_for(sha256).open("rb") as fh:
            fh.seek(start)
            left = None if end is None else max(0, end - start)
            while left is None or left > 0:
                chunk = fh.read(CHUNK if left is None else min(CHUNK, left))
                if not chunk:
                    return
                if left is not None:
                    left -= len(chunk)
                yield chunk

    def materialise(self, sha256: str, dest: Path, *, limit: int) -> None:
        """A symlink to the blob file: nothing is copied."""
        source = self.path_for(sha256)
        size = source.stat().st_size
        if size > limit:
            raise PayloadTooLarge(f"blob {sha256[:12]} is larger than the limit of {limit} bytes")
        os.symlink(source, dest)

    def delete(self, sha256: str) -> None:
        self.path_for(sha256).unlink(missing_ok=True)

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


class S3BlobStore(Blobs):
    """Blobs as objects ``<prefix>blobs/ab/cdef...`` of an S3-compatible bucket.

    Credentials and region come from boto3's usual chain (``AWS_ACCESS_KEY_ID``,
    ``AWS_SECRET_ACCESS_KEY``, ``AWS_PROFILE``, instance roles...); the endpoint from the
    location (``CPTRACE_S3_ENDPOINT_URL``) or boto3's ``AWS_ENDPOINT_URL``. The client is made
    in the process that uses the store (each upload-validation process makes its own).
    """

    def __init__(self, location: S3Location, tmp: Path) -> None:
        self.location = location
        self.tmp = Path(tmp)
        self.tmp.mkdir(parents=True, exist_ok=True)
        self._client = _s3_client(location.endpoint_url)
        self._transfer = _transfer_config()
        self._staged: dict[Path, str] = {}
        self._lock = threading.Lock()

    def check(self) -> None:
        """The bucket answers (it is created when missing: a fresh MinIO has none)."""
        from botocore.exceptions import BotoCoreError, ClientError

        bucket = self.location.bucket
        try:
            try:
                self._client.head_bucket(Bucket=bucket)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket"):
                    raise
                self._client.create_bucket(Bucket=bucket)
        except (BotoCoreError, ClientError) as exc:
            where = self.location.endpoint_url or "boto3's default endpoint"
            raise BlobConfigError(f"blob store {self.location.url} at {where}: {exc}") from None

    @contextlib.contextmanager
    def _answering(self) -> Iterator[None]:
        """Turn the S3 client's failures (store down, refused) into one clear 503."""
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            yield
        except (BotoCoreError, ClientError) as exc:
            raise BlobStoreUnavailable(f"blob store {self.location.url}: {exc}") from None

    def key_for(self, sha256: str) -> str:
        check_digest(sha256)
        return f"{self.location.prefix}blobs/{sha256[:2]}/{sha256[2:]}"

    def _head(self, key: str) -> dict[str, Any] | None:
        from botocore.exceptions import ClientError

        try:
            head: dict[str, Any] = self._client.head_object(Bucket=self.location.bucket, Key=key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise
        return head

    def exists(self, sha256: str) -> bool:
        with self._answering():
            return self._head(self.key_for(sha256)) is not None

    def describe(self, sha256: str) -> str:
        return f"s3://{self.location.bucket}/{self.key_for(sha256)}"

    def spool(self, temp: Path) -> None:
        """Multipart upload of the temp file to a staging key of its own."""
        key = f"{self.location.prefix}staging/{uuid.uuid4().hex}"
        with self._answering():
            self._client.upload_file(str(temp), self.location.bucket, key, Config=self._transfer)
        with self._lock:
            self._staged[temp] = key

    def commit(self, temp: Path, sha256: str, size: int) -> StoredBlob:
        """Copy the staged object (server-side) to its content address, or upload the temp
        file there if it was never spooled; nothing is written when the digest is there."""
        target = self.key_for(sha256)
        with self._lock:
            staged = self._staged.pop(temp, None)
        bucket = self.location.bucket
        with self._answering(), contextlib.ExitStack() as cleanup:
            if staged is not None:
                cleanup.callback(self._client.delete_object, Bucket=bucket, Key=staged)
            if self._head(target) is None:
                if staged is not None:
                    source = {"Bucket": bucket, "Key": staged}
                    if size <= COPY_OBJECT_MAX:
                        self._client.copy_object(
                            CopySource=source, Bucket=bucket, Key=target, ChecksumAlgorithm="CRC32"
                        )
                    else:
                        self._client.copy(source, bucket, target, Config=self._transfer)
                else:
                    self._client.upload_file(str(temp), bucket, target, Config=self._transfer)
        temp.unlink(missing_ok=True)
        return StoredBlob(sha256, size)

    def discard_temp(self, temp: Path) -> None:
        with self._lock:
            staged = self._staged.pop(temp, None)
        temp.unlink(missing_ok=True)
        if staged is not None:
            self._delete_key(staged)

    def read_chunks(
        self, sha256: str, *, start: int = 0, end: int | None = None
    ) -> Iterator[bytes]:
        from botocore.exceptions import ClientError

        extra = {}
        if start or end is not None:
            if end is not None and end <= start:
                return
            extra["Range"] = f"bytes={start}-{'' if end is None else end - 1}"
        with self._answering():
            try:
                answer = self._client.get_object(
                    Bucket=self.location.bucket, Key=self.key_for(sha256), **extra
                )
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey"):
                    raise FileNotFoundError(self.describe(sha256)) from None
                if exc.response.get("Error", {}).get("Code") == "InvalidRange":
                    return
                raise
            body = answer["Body"]
            try:
                yield from body.iter_chunks(CHUNK)
            finally:
                body.close()

    def materialise(self, sha256: str, dest: Path, *, limit: int) -> None:
        """Download in ranged parts to ``dest`` (a temp name beside it, renamed when complete)."""
        with self._answering():
            self._download(sha256, dest, limit)

    def _download(self, sha256: str, dest: Path, limit: int) -> None:
        head = self._head(self.key_for(sha256))
        if head is None:
            raise FileNotFoundError(self.describe(sha256))
        if int(head["ContentLength"]) > limit:
            raise PayloadTooLarge(f"blob {sha256[:12]} is larger than the limit of {limit} bytes")
        partial = dest.with_name(f".{dest.name}.part")
        try:
            self._client.download_file(
                self.location.bucket, self.key_for(sha256), str(partial), Config=self._transfer
            )
            if partial.stat().st_size > limit:  # changed between the HEAD and the GET
                raise PayloadTooLarge(f"blob {sha256[:12]} is larger than the limit of {limit}")
            os.replace(partial, dest)
        finally:
            partial.unlink(missing_ok=True)

    def delete(self, sha256: str) -> None:
        with self._answering():
            self._client.delete_object(Bucket=self.location.bucket, Key=self.key_for(sha256))

    def objects(self, under: str) -> Iterator[tuple[str, float]]:
        """(key, age in seconds) of every object under ``prefix + under``."""
        with self._answering():
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.location.bucket, Prefix=self.location.prefix + under
            )
            now = time.time()
            for page in pages:
                for item in page.get("Contents", []):
                    yield item["Key"], now - item["LastModified"].timestamp()

    def _digest_of(self, key: str) -> str | None:
        rest = key.removeprefix(f"{self.location.prefix}blobs/")
        digest = rest.replace("/", "", 1)
        return digest if rest[2:3] == "/" and _SHA256.match(digest) else None

    def iter_digests(self) -> Iterator[str]:
        for key, _age in self.objects("blobs/"):
            digest = self._digest_of(key)
            if digest is not None:
                yield digest

    def sweep_orphans(self, known: Callable[[str], bool]) -> int:
        """Remove objects no row refers to, once older than ``S3_GRACE_S`` (another host's
        upload may be between its commit and its run's insert)."""
        removed = 0
        for key, age in list(self.objects("blobs/")):
            digest = self._digest_of(key)
            if digest is not None and age > S3_GRACE_S and not known(digest):
                self._delete_key(key)
                removed += 1
        return removed

    def clean_tmp(self) -> int:
        """The local ``tmp/``, plus staging objects older than ``S3_GRACE_S`` (uploads whose
        API process was killed mid-validation)."""
        removed = super().clean_tmp()
        for key, age in list(self.objects("staging/")):
            if age > S3_GRACE_S:
                self._delete_key(key)
                removed += 1
        return removed

    def _delete_key(self, key: str) -> None:
        with self._answering():
            self._client.delete_object(Bucket=self.location.bucket, Key=key)


def _s3_client(endpoint_url: str | None) -> Any:
    try:
        import boto3
        from botocore.config import Config
    except ImportError:  # boto3 is the optional [s3] extra, not one of our packages
        raise BlobConfigError("s3:// blobs need boto3: pip install 'cptrace[s3]'") from None
    config = Config(
        retries={"max_attempts": 5, "mode": "standard"},
        s3={"addressing_style": "path"} if endpoint_url else {},
    )
    return boto3.session.Session().client("s3", endpoint_url=endpoint_url, config=config)


def _transfer_config() -> Any:
    from boto3.s3.transfer import TransferConfig

    return TransferConfig(
        multipart_threshold=PART_BYTES,
        multipart_chunksize=PART_BYTES,
        max_concurrency=4,
        use_threads=True,
    )


async def aiter_limited(stream: AsyncIterator[bytes], limit: int) -> AsyncIterator[bytes]:
    """Pass a body stream through, raising ``PayloadTooLarge`` as soon as it passes ``limit``."""
    seen = 0
    async for chunk in stream:
        seen += len(chunk)
        if seen > limit:
            raise PayloadTooLarge(f"request body is larger than the limit of {limit} bytes")
        yield chunk
