"""Uploads: run bundles (``.tar.gz``) and single trace files, streamed, validated, stored once."""

from __future__ import annotations

import sqlite3
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request, Response

from service.api.deps import BlobsDep, DbDep, RunnerAccess, SettingsDep
from service.api.schemas import MAX_ID, UploadResult
from service.core.config import MAX_RANK, Settings
from service.core.errors import BadRequest
from service.ingest import Limits, StagedRun, record_run, stage_bundle, stage_trace
from service.multipart import receive_file
from service.storage import runs
from service.storage.database import immediate
from service.uploads_exec import run_staging

router = APIRouter(prefix="/uploads", tags=["uploads"])


def _form(field: str, description: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    properties = {field: {"type": "string", "format": "binary", "description": description}}
    properties.update(extra or {})
    return {
        "requestBody": {
            "required": True,
            "content": {
                "multipart/form-data": {
                    "schema": {
                        "type": "object",
                        "required": [field],
                        "properties": properties,
                    }
                }
            },
        }
    }


@router.post(
    "/bundles",
    response_model=UploadResult,
    status_code=201,
    responses={200: {"model": UploadResult, "description": "the same bundle was uploaded before"}},
    openapi_extra=_form("bundle", "a run bundle (.tar.gz): manifest.json, traces/, logs/"),
)
async def upload_bundle(
    request: Request,
    response: Response,
    db: DbDep,
    blobs: BlobsDep,
    settings: SettingsDep,
    _: RunnerAccess,
    idempotency_key: Annotated[str | None, Header(description="sha256 of the bundle bytes")] = None,
) -> UploadResult:
    """Upload a run bundle; 201 creates a run, 200 when this content was uploaded before."""
    received = await receive_file(
        request, field="bundle", blobs=blobs, limit=settings.max_upload_bytes
    )
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
            return UploadResult(run_id=known, created=False, sha256=received.sha256)
        staged = await run_staging(
            request.app,
            stage_bundle,
            received.path,
            settings.blob_dir,
            settings.tmp_dir,
            _limits(settings),
        )
    finally:
        received.path.unlink(missing_ok=True)
    run_id, created = await db.awrite(lambda c: _record(c, staged, key, "bundle", None))
    response.status_code = 201 if created else 200
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
    _: RunnerAccess,
    run_id: Annotated[
        int | None, Query(ge=1, le=MAX_ID, description="add the trace to this run")
    ] = None,
) -> UploadResult:
    """Upload one trace: a new run, or another file of `run_id` (re-analysed)."""
    received = await receive_file(
        request, field="trace", blobs=blobs, limit=settings.max_upload_bytes
    )
    try:
        rank = _rank(received.fields.get("rank"))
        name = (received.fields.get("name") or received.filename or "trace")[:200]
        if run_id is not None:
            db.read(lambda c: runs.require_run(c, run_id=run_id))
        staged = await run_staging(
            request.app,
            stage_trace,
            received.path,
            name,
            settings.blob_dir,
            settings.tmp_dir,
            _limits(settings),
            rank,
        )
    finally:
        received.path.unlink(missing_ok=True)
    key = f"trace:{run_id or 'new'}:{received.sha256}"
    new_id, created = await db.awrite(lambda c: _record(c, staged, key, "trace", run_id))
    response.status_code = 201 if created else 200
    return UploadResult(run_id=new_id, created=created, sha256=received.sha256)


def _record(
    conn: sqlite3.Connection, staged: StagedRun, key: str, source: str, run_id: int | None
) -> tuple[int, bool]:
    """On the writer: the run (or the files added to ``run_id``), atomically."""
    with immediate(conn):
        return record_run(conn, staged, key=key, source=source, run_id=run_id)


def _rank(raw: str | None) -> int | None:
    if raw is None or raw == "":
        return None
    # isascii: str.isdigit() is true for '²', which int() refuses
    if not (raw.isascii() and raw.isdigit()) or int(raw) > MAX_RANK:
        raise BadRequest(
            f"form field 'rank': expected an integer from 0 to {MAX_RANK}, got {raw[:40]!r}"
        )
    return int(raw)


def _limits(settings: Settings) -> Limits:
    return Limits(settings.max_decompressed_bytes, settings.max_bundle_members)
