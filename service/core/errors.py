"""Errors that carry their HTTP status, and the one JSON shape every error answer has.

Datasette's pattern: each exception class knows its status; one handler turns any of them into
``{"ok": false, "error": ..., "errors": [...], "status": ...}``. Library exceptions
(``TraceError``, ``ManifestError``, ``SpecError``) are mapped to 4xx in ``service.main``.
"""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """Base class: an error answer with ``status`` and a human-readable message."""

    status = 500

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


class QueryTimeout(ApiError):
    """A read took longer than ``read_time_limit_ms``."""

    status = 503


def error_body(status: int, message: str, errors: list[Any] | None = None) -> dict[str, Any]:
    """The single error shape of the API."""
    return {"ok": False, "error": message, "errors": errors or [message], "status": status}
