"""Errors that carry their HTTP status, and the one JSON shape every error answer has.

Datasette's pattern: each exception class knows its status; one handler turns any of them into
``{"ok": false, "error": ..., "errors": [...], "status": ...}``. Library exceptions (every
``analyzers`` error class, ``SpecError``) get their status from ``LIBRARY_STATUS`` here: one
table, walked by a test, so no input error of the libraries can become a 500.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from analyzers.bundle import (
    BundleError,
    BundleManifestError,
    OversizedBundleError,
    UnsafeBundleError,
)
from analyzers.catalog import CatalogError
from analyzers.compare import CompareError
from analyzers.errors import (
    CorruptTraceError,
    HostileTraceError,
    MissingRankError,
    RankConflictError,
    TraceError,
    TraceTooLargeError,
    UnsupportedTraceError,
)
from analyzers.manifest import ManifestError
from contracts.spec import SpecError


class ApiError(Exception):
    """Base class: an error answer with ``status`` and a human-readable message."""

    status = 500
    headers: dict[str, str] | None = None
    """Extra response headers (``Retry-After``, ``Connection: close``)."""

    def __init__(self, message: str, *, errors: list[str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.errors = errors or [message]


class BadRequest(ApiError):
    """The request is malformed (bad JSON, bad bundle, bad trace)."""

    status = 400


class Unauthorized(ApiError):
    """No token, or a token that is not known."""

    status = 401


class Forbidden(ApiError):
    """A valid token whose role may not do this."""

    status = 403


class NotFound(ApiError):
    """The resource does not exist."""

    status = 404


class Conflict(ApiError):
    """The resource is in a state that forbids this (e.g. a lost job lease)."""

    status = 409


class PayloadTooLarge(ApiError):
    """The body (or what it decompresses to) is over the configured limit."""

    status = 413


class UnprocessableEntity(ApiError):
    """Well-formed but semantically invalid input (a spec or manifest field)."""

    status = 422


class InsufficientStorage(ApiError):
    """The server's disk is too full to store an upload (retry once space is freed)."""

    status = 507


class QueryTimeout(ApiError):
    """A read took longer than ``read_time_limit_ms``."""

    status = 503


def error_body(status: int, message: str, errors: list[Any] | None = None) -> dict[str, Any]:
    """The single error shape of the API."""
    return {"ok": False, "error": message, "errors": errors or [message], "status": status}


LIBRARY_STATUS: dict[type[Exception], int] = {
    # Most specific first where a class has two bases (its own entry decides).
    OversizedBundleError: 413,
    BundleManifestError: 422,
    TraceTooLargeError: 413,
    UnsafeBundleError: 400,
    BundleError: 400,
    HostileTraceError: 422,
    UnsupportedTraceError: 422,
    CorruptTraceError: 400,
    RankConflictError: 422,
    MissingRankError: 422,
    TraceError: 400,
    ManifestError: 422,
    CompareError: 400,
    CatalogError: 422,
    SpecError: 422,
}
"""HTTP status of each library error class (the first class of an exception's MRO listed)."""


class DatabaseFault(StrEnum):
    """Why the database failed a statement when the statement was not at fault (the storage
    layer tells which: ``service.storage.engine.database_fault``)."""

    BUSY = "busy"
    """Locked, contended or out of connections: the same request succeeds a moment later."""
    UNAVAILABLE = "unavailable"
    """The server is gone or refuses connections (stopped, restarting, unreachable)."""


@dataclass(frozen=True, slots=True)
class FaultAnswer:
    status: int
    message: str
    retry_after_s: int


DATABASE_FAULT_ANSWER: dict[DatabaseFault, FaultAnswer] = {
    DatabaseFault.BUSY: FaultAnswer(503, "the database is busy; retry", 1),
    DatabaseFault.UNAVAILABLE: FaultAnswer(503, "the database is unavailable; retry", 5),
}
"""The answer to each database fault, on either backend (SQLite's locked file, PostgreSQL's
lock timeout, serialization failure, connection limit, lost server)."""


def library_status(exc: BaseException) -> int | None:
    """The status ``LIBRARY_STATUS`` gives ``exc``; None for anything else (a bug: 500)."""
    for cls in type(exc).__mro__:
        status = LIBRARY_STATUS.get(cls)  # type: ignore[call-overload]
        if status is not None:
            return status
    return None
