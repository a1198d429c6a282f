"""The API factory: settings -> database, blob store, API routers, one error handler.

The dashboards are not included here: ``service`` imports neither ``web`` nor the CLI. The app
that is served is assembled above both, in ``cptrace.app.create_app`` (the composition root).

``create_app`` opens the database and applies migrations eagerly (a ``TestClient`` without a
``with`` block works), and closes the writer and the ingest pool at shutdown.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import sqlite3
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from contracts.validation import field_errors
from contracts.version import __version__
from service import supervisor, uploads_exec
from service.api.main import api_router
from service.core.config import Settings
from service.core.errors import (
    DATABASE_FAULT_ANSWER,
    LIBRARY_STATUS,
    ApiError,
    error_body,
    library_status,
)
from service.storage.blobs import open_blobs
from service.storage.database import Database
from service.storage.engine import (
    DATABASE_ERRORS,
    AnyDatabase,
    Backend,
    PostgresDatabase,
    backend_of,
    database_fault,
    fault_reason,
)
from service.storage.migrations import apply_migrations

log = logging.getLogger("cptrace.service")


def open_database(settings: Settings) -> AnyDatabase:
    """The configured database, its schema up to date: the SQLite file in the data directory
    (the default) or the PostgreSQL server of ``settings.database_url``. The one way the API,
    the analysis worker and the CLI's token commands open it. The data directory is created
    either way (blobs, uploads in progress and analysis scratch live there)."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    if backend_of(settings.database_url) is Backend.POSTGRESQL:
        postgres = PostgresDatabase(
            settings.database_url,
            read_time_limit_ms=settings.read_time_limit_ms,
            busy_timeout_ms=settings.busy_timeout_ms,
        )
        try:
            postgres.apply_schema()
        except BaseException:
            postgres.close()
            raise
        return postgres
    db = Database(
        settings.db_path,
        busy_timeout_ms=settings.busy_timeout_ms,
        read_time_limit_ms=settings.read_time_limit_ms,
    )
    db.start()
    db.write(apply_migrations)
    return db


def _answer_of(exc: Exception) -> tuple[int, str, dict[str, str]]:
    """Map library exceptions to a status (``LIBRARY_STATUS``) and database faults to theirs
    (``DATABASE_FAULT_ANSWER``: 503 with ``Retry-After``); unknown ones are 500."""
    if isinstance(exc, ApiError):
        return exc.status, exc.message, dict(exc.headers or {})
    status = library_status(exc)
    if status is not None:
        return status, str(exc), {}
    fault = database_fault(exc)
    if fault is not None:
        answer = DATABASE_FAULT_ANSWER[fault]
        return answer.status, answer.message, {"Retry-After": str(answer.retry_after_s)}
    if _disk_full(exc):
        return 507, "the server's disk is full: nothing was stored; retry once space is freed", {}
    return 500, "internal server error", {}


def _disk_full(exc: BaseException) -> bool:
    """ENOSPC/EDQUOT anywhere in the chain, or SQLite's own "disk is full"."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if isinstance(seen, sqlite3.OperationalError) and "disk is full" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _handled_classes() -> list[type[Exception]]:
    return [ApiError, *LIBRARY_STATUS, *DATABASE_ERRORS, OSError]


def _install_error_handlers(app: FastAPI) -> None:
    async def on_error(request: Request, exc: Exception) -> JSONResponse:
        status, message, extra = _answer_of(exc)
        fault = database_fault(exc)
        if fault is not None:  # the database's state, not a bug: one line, no traceback
            log.warning(
                "database %s on %s %s: %s",
                fault.value, request.method, request.url.path, fault_reason(exc),
            )  # fmt: skip
        elif status >= 500 and status != 507 and not isinstance(exc, ApiError):
            log.exception("unhandled error on %s %s", request.method, request.url.path)
        errors = exc.errors if isinstance(exc, ApiError) else None
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else {}
        if status in (401, 403):  # an auth failure keeps no connection (issue 24, item 10)
            headers["Connection"] = "close"
        headers.update(extra)  # the error's own (Retry-After)
        return JSONResponse(
            error_body(status, message, errors), status_code=status, headers=headers
        )

    async def on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            error_body(exc.status_code, str(exc.detail)),
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    async def on_validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        details = [str(e) for e in field_errors(exc)]
        message = "invalid request: " + "; ".join(details[:3])
        return JSONResponse(error_body(422, message, details), status_code=422)

    # Known error classes go to the exception middleware (answered, not re-raised); the bare
    # Exception handler is the last resort for bugs (500, logged).
    for cls in _handled_classes():
        app.add_exception_handler(cls, on_error)
    app.add_exception_handler(Exception, on_error)
    app.add_exception_handler(StarletteHTTPException, on_http)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, on_validation)  # type: ignore[arg-type]


def _describe_public_reads(app: FastAPI, settings: Settings) -> None:
    """With public reads on, a GET's bearer token is optional: say so in the schema
    (``security: [{}, {HTTPBearer: []}]``) so clients and fuzzers know what to expect."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = build()
        if settings.public_read:
            for path_item in schema.get("paths", {}).values():
                get = path_item.get("get")
                if get and get.get("security") and {} not in get["security"]:
                    get["security"] = [{}, *get["security"]]
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def create_app(settings: Settings | None = None) -> FastAPI:
    """Build the cptrace JSON API over ``settings.data_dir`` (``cptrace.app`` adds the pages)."""
    settings = settings or Settings()
    db = open_database(settings)
    blobs = open_blobs(settings.blob_location, settings.tmp_dir)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        uploads_exec.start(app)  # the validation processes, so /health sees them at once
        supervisor.start_worker(app)  # when Settings.run_worker is on
        yield
        supervisor.stop_worker(app)  # first: it finishes its analysis
        uploads_exec.shutdown(app)
        db.close()

    app = FastAPI(
        title="cptrace",
        version=__version__,
        description="Trace analysis for context-parallel attention on packed (THD) sequences.",
        lifespan=lifespan,
        # /docs is served by the pages (web.routes) with Swagger UI from a package: no CDN
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.db = db
    app.state.blobs = blobs
    _install_error_handlers(app)
    app.include_router(api_router)
    _describe_public_reads(app, settings)
    return app
