"""Runs: create, list with filters and paging, detail, delete.

The list and the detail answer with an ``ETag`` (the database state they were read at) and
``Cache-Control: no-cache``; a dashboard that sends it back in ``If-None-Match`` gets a 304
without a query while nothing was written.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Response
from starlette.concurrency import run_in_threadpool

from service.api.deps import (
    AdminAccess,
    BlobsDep,
    DbDep,
    ReadAccess,
    RunnerPrincipal,
    SettingsDep,
)
from service.api.schemas import Offset, OkBody, RunCreate, RunId, RunPage
from service.ingest import config_key
from service.storage import runs
from service.storage.engine import Conn
from service.store import (
    RunDetail,
    RunFilters,
    RunSummary,
    get_run,
    run_detail_json,
    run_page_json,
    scans_runs,
)
from service.strict_json import strict_dumps

router = APIRouter(prefix="/runs", tags=["runs"])


@router.post("", response_model=RunSummary, status_code=201)
def create_run(body: RunCreate, db: DbDep, principal: RunnerPrincipal) -> RunSummary:
    """Create an empty run; add traces with `POST /uploads/traces?run_id=`."""
    if body.manifest is not None:
        from analyzers.manifest import parse_manifest

        parse_manifest(body.manifest, source="manifest")  # ManifestError -> 422

    if body.manifest is not None:
        strict_dumps(body.manifest, what="manifest")  # NaN/Infinity -> 422, never stored

    def insert(conn: Conn) -> int:
        run_id = runs.create_run(
            conn,
            name=body.name,
            source="api",
            status="empty",
            branch=body.branch,
            commit=body.commit,
            host=body.host,
            config_key=config_key(body.manifest),
            manifest=body.manifest,
        )  # the creator is recorded like an uploader (a job may complete with its run)
        runs.record_upload(conn, key=f"api:{run_id}", run_id=run_id, token_id=principal.token_id)
        return run_id

    return get_run(db, db.write_tx(insert), include_report=False)


_CACHE_HEADERS = {"Cache-Control": "no-cache"}  # may be stored, but revalidated every time
_NOT_MODIFIED: dict[int | str, dict[str, Any]] = {
    304: {"description": "Unchanged since the `ETag` sent in `If-None-Match`."}
}

IfNoneMatch = Annotated[
    str | None,
    Header(description="An `ETag` of an earlier answer: 304 while the data is unchanged."),
]


def _tags(header: str | None) -> frozenset[str]:
    """The entity tags of an ``If-None-Match`` header, unquoted, weak or strong alike (a GET
    compares weakly, RFC 9110 13.1.2); ``*`` is kept as is."""
    if not header:
        return frozenset()
    tags = set()
    for part in header.split(","):
        tag = part.strip().removeprefix("W/")
        tags.add(tag[1:-1] if len(tag) >= 2 and tag[0] == tag[-1] == '"' else tag)
    return frozenset(tags)


class _AnyTag(frozenset[str]):
    """``If-None-Match: *``: any current tag matches."""

    def __contains__(self, item: object) -> bool:
        return True


def _unless(header: str | None) -> frozenset[str]:
    tags = _tags(header)
    return _AnyTag() if "*" in tags else tags


def _answer(tag: str, body: bytes | None) -> Response:
    """200 with the pre-serialized JSON, or 304 when the client's copy is current."""
    headers = {"ETag": f'"{tag}"', **_CACHE_HEADERS}
    if body is None:
        return Response(status_code=304, headers=headers)
    return Response(content=body, media_type="application/json", headers=headers)


# The two hot reads below return pre-serialized JSON (``service.store.*_json``): the declared
# ``response_model`` documents the contract in /openapi.json, the bytes are built from the same
# row dicts the model is validated from (tests compare both). They are ``async def`` and run
# their sub-millisecond query inline on the event loop instead of hopping to the thread pool;
# only filters that scan the whole table (substring, prefix) go to a thread.
@router.get("", response_model=RunPage, responses=_NOT_MODIFIED)
async def read_runs(
    db: DbDep,
    settings: SettingsDep,
    _: ReadAccess,
    filters: Annotated[RunFilters, Query()],
    limit: Annotated[int, Query(ge=1)] = 50,
    offset: Offset = 0,
    if_none_match: IfNoneMatch = None,
) -> Response:
    """Runs, newest first, filtered by status, branch, name, config key or commit prefix."""
    limit = min(limit, settings.max_page_size)
    unless = _unless(if_none_match)
    if scans_runs(filters) or db.network_reads:
        tag, body = await run_in_threadpool(
            run_page_json, db, filters=filters, limit=limit, offset=offset, unless=unless
        )
    else:
        tag, body = run_page_json(db, filters=filters, limit=limit, offset=offset, unless=unless)
    return _answer(tag, body)


@router.get("/{run_id}", response_model=RunDetail, responses=_NOT_MODIFIED)
async def read_run(
    run_id: RunId, db: DbDep, _: ReadAccess, if_none_match: IfNoneMatch = None
) -> Response:
    """One run: files, manifest, analysis status (the report is at `.../analysis/result`)."""
    unless = _unless(if_none_match)
    if db.network_reads:
        return _answer(*await run_in_threadpool(run_detail_json, db, run_id, unless=unless))
    return _answer(*run_detail_json(db, run_id, unless=unless))


@router.delete("/{run_id}", response_model=OkBody)
def delete_run(run_id: RunId, db: DbDep, blobs: BlobsDep, _: AdminAccess) -> OkBody:
    """Delete a run with its files, report, metrics and comparisons; frees the blobs no other
    run shares."""
    for digest in db.write_tx(lambda conn: runs.delete_run(conn, run_id=run_id)):
        blobs.delete(digest)
    return OkBody()
