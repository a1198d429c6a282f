"""All resource routers under ``/api/v1``, with the error shape declared for OpenAPI."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from service.api.routes import (
    analyses,
    catalog,
    comparisons,
    github,
    health,
    jobs,
    pr_comments,
    runners,
    runs,
    uploads,
)
from service.api.schemas import ErrorBody

_ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": text}
    for status, text in (
        (400, "malformed request"),
        (401, "missing or unknown token"),
        (403, "the token's role may not do this"),
        (404, "not found"),
        (409, "conflicting state"),
        (413, "body or its decompressed content too large"),
        (422, "invalid field"),
        (503, "query time limit or database busy"),
    )
}

api_router = APIRouter(prefix="/api/v1", responses=_ERRORS)
for module in (
    health, runs, uploads, analyses, comparisons, pr_comments, jobs, runners, catalog, github
):
    api_router.include_router(module.router)
