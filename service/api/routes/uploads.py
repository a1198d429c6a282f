"""Uploads: run bundles (``.tar.gz``) and single trace files, streamed, validated, stored once."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response

from analyzers.bundle import OversizedBundleError
from service.api.deps import BlobsDep, DbDep, RunnerPrincipal, SettingsDep
from service.api.schemas import MAX_ID, UploadResult
from service.auth import Principal
from service.core.config import MAX_RANK, Settings
from service.core.errors import BadRequest, InsufficientStorage, PayloadTooLarge
from service.ingest import Limits, StagedRun, record_run, stage_bundle, stage_trace
from service.multipart import RAW_TYPES, receive_upload
from service.phase_timer import PhaseTimer
from service.storage import runs
from service.storage.blobs import Blobs, staging_dir
from service.storage.engine import AnyDatabase, Conn, transaction
from service.uploads_exec import run_staging

router = APIRouter(prefix="/uploads", tags=["uploads"])


def _form(
    field: str, description: str, extra: dict[str, Any] | None = None, *, raw: bool = False
) -> dict[str, Any]:
    """The request body in the OpenAPI document: a multipart form, and (``raw``) the file
    itself as the body under any of ``RAW_TYPES``."""
    properties = {field: {"type": "string", "format": "binary", "description": description}}
    properties.update(extra or {})
    content: dict[str, Any] = {
        "multipart/form-data": {
            "schema": {"type": "object", "required": [field], "properties": properties}
        }
    }
    if raw:
        binary = {"schema": {"type": "string", "format": "binary", "description": description}}
        content.update({t.decode(): binary for t in sorted(RAW_TYPES)})
    return {"requestBody": {"required": True, "content": content}}


@router.post(
    "/bundles",
    response_model=UploadResult,
    status_code=201,
    responses={200: {"model": UploadResult, "description": "the same bundle was uploaded before"}},
    openapi_extra=_form(
        "bundle", "a run bundle (.tar.gz or .tar): manifest.json, traces/, logs/", raw=True
    ),
)
async def upload_bundle(
    request: Request,
    response: Response,
    db: DbDep,
    blobs: BlobsDep,
    settings: SettingsDep,
    principal: RunnerPrincipal,
    idempotency_key: Annotated[str | None, Header(description="sha256 of the bundle bytes")] = None,
) -> UploadResult:
    """Upload a run bundle; 201 creates a run, 200 when this content was uploaded before.

    The body is a multipart form with the file in field `bundle`, or the bundle itself
    (`Content-Type: application/gzip`, `application/x-tar` or `application/octet-stream`).
    """
    clock = PhaseTimer()
    room = _room(db, settings, principal.token_id)
    received = await receive_upload(
        request, field="bundle", blobs=blobs, limit=settings.max_upload_bytes, raw=True
    )
    clock.lap("receive")
    try:
        if idempotency_key and idempotency_key.lower() != received.sha256:
            raise BadRequest(
                f"Idempotency-Key {idempotency_key!r} is not the sha256 of the uploaded bundle "
                f"({received.sha256}); the upload was corrupted or the key is wrong"
            )
        key = f"bundle:{received.sha256}"
        known = db.read(lambda c: runs.find_upload(c, key=key))
        if known is not None:
            response.status_code = 200
            response.headers["Server-Timing"] = clock.server_timing()
            return UploadResult(run_id=known, created=False, sha256=received.sha256)
        limits = _limits(settings, room, received.size)
        stored = limits.max_stored_bytes
        with staging_dir(settings.tmp_dir) as scratch, _quota_message(stored, room):
            staged = await run_staging(
                request.app, stage_bundle, received.path, settings.blob_location, scratch, limits
            )
        clock.lap("stage")
    finally:
        received.path.unlink(missing_ok=True)
    run_id, created = await _record(db, blobs, settings, staged, key, "bundle", None, principal)
    clock.lap("record")
    response.status_code = 201 if created else 200
    response.headers["Server-Timing"] = clock.server_timing(staged.timings, prefix="stage-")
    return UploadResult(run_id=run_id, created=created, sha256=received.sha256)


@router.post(
    "/traces",
    response_model=UploadResult,
    status_code=201,
    responses={200: {"model": UploadResult, "description": "the same trace was uploaded before"}},
    openapi_extra=_form(
        "trace",
        "an nsys SQLite export or PyTorch profiler JSON, optionally gzipped",
        {
            "name": {"type": "string", "maxLength": 200},
            "rank": {"type": "integer", "minimum": 0, "maximum": MAX_RANK},
        },
    ),
)
async def upload_trace(
    request: Request,
    response: Response,
    db: DbDep,
    blobs: BlobsDep,
    settings: SettingsDep,
    principal: RunnerPrincipal,
    run_id: Annotated[
        int | None, Query(ge=1, le=MAX_ID, description="add the trace to this run")
    ] = None,
) -> UploadResult:
    """Upload one trace: a new run, or another file of `run_id` (re-analysed)."""
    clock = PhaseTimer()
    room = _room(db, settings, principal.token_id)
    limit = min(settings.max_upload_bytes, room.bytes)
    with _quota_message(limit, room):
        received = await receive_upload(request, field="trace", blobs=blobs, limit=limit)
    clock.lap("receive")
    try:
        rank = _rank(received.fields.get("rank"))
        name = (received.fields.get("name") or received.filename or "trace")[:200]
        if run_id is not None:
            db.read(lambda c: runs.require_run(c, run_id=run_id))
        with staging_dir(settings.tmp_dir) as scratch:
            staged = await run_staging(
                request.app,
                stage_trace,
                received.path,
                received.sha256,
                name,
                settings.blob_location,
                scratch,
                _limits(settings, room),
                rank,
            )
        clock.lap("stage")
    finally:
        received.path.unlink(missing_ok=True)  # (renamed into the store once it passed)
    key = f"trace:{run_id or 'new'}:{received.sha256}"
    new_id, created = await _record(db, blobs, settings, staged, key, "trace", run_id, principal)
    clock.lap("record")
    response.status_code = 201 if created else 200
    response.headers["Server-Timing"] = clock.server_timing(staged.timings, prefix="stage-")
    return UploadResult(run_id=new_id, created=created, sha256=received.sha256)


async def _record(
    db: AnyDatabase,
    blobs: Blobs,
    settings: Settings,
    staged: StagedRun,
    key: str,
    source: str,
    run_id: int | None,
    principal: Principal,
) -> tuple[int, bool]:
    """On the writer: the run (or the files added to ``run_id``), atomically, and the token's
    stored-bytes quota checked in the same transaction (``_room`` checked it before the body
    was read, when a concurrent upload of the same token may not have been recorded yet).

    :raises PayloadTooLarge: the token's quota would be passed; the upload's blobs that no
        run refers to are removed again.
    """
    quota = settings.token_stored_quota_bytes

    def record(conn: Conn) -> tuple[int, bool]:
        try:
            with transaction(conn):
                return record_run(
                    conn, staged, key=key, source=source, run_id=run_id,
                    token_id=principal.token_id, quota=quota,
                )  # fmt: skip
        except PayloadTooLarge:
            # still on the writer, after the rollback: no other upload can record a run that
            # refers to these blobs between this check and their removal
            for digest in {f.sha256 for f in staged.files}:
                if not runs.blob_recorded(conn, digest=digest):
                    blobs.delete(digest)
            raise

    return await db.awrite(record)


def _rank(raw: str | None) -> int | None:
    if raw is None or raw == "":
        return None
    # isascii: str.isdigit() is true for '²', which int() refuses
    if not (raw.isascii() and raw.isdigit()) or int(raw) > MAX_RANK:
        raise BadRequest(
            f"form field 'rank': expected an integer from 0 to {MAX_RANK}, got {raw[:40]!r}"
        )
    return int(raw)


STORED_FLOOR_BYTES = 64 * 1024 * 1024
"""Any bundle may store this much, whatever its upload's size (``max_stored_ratio`` above)."""


@dataclass(frozen=True, slots=True)
class _Room:
    """What one upload may store: ``bytes``, and whether the token's quota set it."""

    bytes: int
    by_quota: bool
    quota_left: int


def _room(db: AnyDatabase, settings: Settings, token_id: int) -> _Room:
    """Checked before a byte of the body is read: a disk below its free-space floor is a 507,
    a token whose runs already hold its quota a 413 (issue 24, item 4)."""
    free = shutil.disk_usage(settings.data_dir).free
    if free < settings.health_min_free_bytes:
        raise InsufficientStorage(
            f"the server's disk is full: {free} bytes free, below the floor of "
            f"{settings.health_min_free_bytes} (CPTRACE_HEALTH_MIN_FREE_BYTES); nothing was "
            "stored; retry once space is freed"
        )
    used = db.read(lambda c: runs.stored_bytes_of_token(c, token_id=token_id))
    left = settings.token_stored_quota_bytes - used
    if left <= 0:
        raise PayloadTooLarge(
            f"this token's runs store {used} bytes, its quota is "
            f"{settings.token_stored_quota_bytes} (CPTRACE_TOKEN_STORED_QUOTA_BYTES); "
            "delete runs to upload more"
        )
    per_upload = settings.max_stored_bytes_per_upload
    return _Room(min(per_upload, left), left < per_upload, left)


@contextlib.contextmanager
def _quota_message(limit: int | None, room: _Room) -> Iterator[None]:
    """An upload refused at a ``limit`` the token's quota set says so (not just "the limit")."""
    try:
        yield
    except (OversizedBundleError, PayloadTooLarge) as exc:
        if room.by_quota and limit == room.bytes:
            raise PayloadTooLarge(
                f"{exc}: this token may store {room.quota_left} more bytes of its quota of "
                "CPTRACE_TOKEN_STORED_QUOTA_BYTES; delete runs to upload more"
            ) from None
        raise


def _limits(settings: Settings, room: _Room, uploaded_bytes: int | None = None) -> Limits:
    """The caps of one upload: what it may store (``room``), a bundle's also bounded by its
    upload's size (``max_stored_ratio``)."""
    stored = room.bytes
    if uploaded_bytes is not None:
        by_ratio = int(settings.max_stored_ratio * uploaded_bytes)
        stored = min(stored, max(STORED_FLOOR_BYTES, by_ratio))
    return Limits(settings.max_decompressed_bytes, settings.max_bundle_members, stored)
