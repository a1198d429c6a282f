"""``cptrace upload``: send a run bundle to the service, safely retried.

Idempotency is by content: the archive is byte-reproducible (``runners.bundle.pack_bundle``), its
sha256 goes in the ``Idempotency-Key`` header, and the service answers a repeated upload of the
same bytes with the existing run (200, ``created: false``). So a retry after a timeout whose
request did arrive never creates a second run.

The archive is the request body itself (``Content-Type: application/gzip``), not a multipart
form field: the service streams it straight to its bundle reader (docs/service.md).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from analyzers.bundle import file_sha256, read_bundle
from runners.bundle import pack_bundle
from runners.http import ApiError, RetryPolicy, ServiceClient, with_retries

UPLOAD_PATH = "/uploads/bundles"


class UploadError(RuntimeError):
    """The bundle was refused or could not be delivered (message says which and why)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class UploadResult:
    run_id: int | str
    created: bool
    """False when the service already had this exact bundle."""
    sha256: str


def prepare_archive(path: Path, work_dir: Path) -> Path:
    """A validated ``.tar.gz`` of the bundle at ``path`` (a directory, ``.tar`` or ``.tar.gz``).

    Validation first: a bundle the service's reader would refuse is not worth the upload.
    A ``.tar.gz`` is sent as it is; anything else is packed reproducibly into ``work_dir``.
    """
    with read_bundle(path, extract_to=work_dir) as bundle:
        if path.is_file() and path.name.endswith((".tar.gz", ".tgz")):
            return path
        target = work_dir / f"{bundle.run.name or 'bundle'}.tar.gz"  # RunInfo, a model
        assert bundle.root is not None  # read_bundle of a path always has a root on disk
        pack_bundle(bundle.root, target)
        return target


def upload_archive(
    client: ServiceClient,
    archive: Path,
    *,
    policy: RetryPolicy | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> UploadResult:
    """POST an archive (as the body) with its sha256 as the idempotency key; retry what can
    be retried."""
    digest = file_sha256(archive)

    def attempt() -> UploadResult:
        resp = client.post_body(
            UPLOAD_PATH,
            file=archive,
            content_type="application/gzip",
            headers={"Idempotency-Key": digest},
        )
        body = resp.body if isinstance(resp.body, dict) else {}
        if "run_id" not in body:
            raise UploadError(f"the service answered {resp.status} without a run_id: {body!r}")
        return UploadResult(
            run_id=body["run_id"],
            created=bool(body.get("created", resp.status == 201)),
            sha256=digest,
        )

    try:
        return with_retries(attempt, policy or RetryPolicy(), sleep=sleep)
    except ApiError as exc:
        raise UploadError(f"upload of {archive.name} failed: {exc}") from exc


def upload_bundle(
    path: Path,
    client: ServiceClient,
    *,
    policy: RetryPolicy | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> UploadResult:
    """Validate, pack if needed, and upload the bundle at ``path``.

    :raises analyzers.bundle.BundleError: the bundle is invalid (nothing is sent).
    :raises UploadError: the service refused it or stayed unreachable through the retries.
    """
    work_dir = Path(tempfile.mkdtemp(prefix="cptrace-upload-"))
    try:
        archive = prepare_archive(path, work_dir)
        return upload_archive(client, archive, policy=policy, sleep=sleep)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
