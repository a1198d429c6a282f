"""Comparisons: base vs candidate run, or two arms (window groups) of one run; stored."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from analyzers.report import ComparisonReport
from service.api.deps import DbDep, ReadAccess, RunnerAccess
from service.api.schemas import MAX_ID, ComparisonCreate, ComparisonId, Offset
from service.storage import runs
from service.store import (
    ComparisonRecord,
    ComparisonSummary,
    find_comparison,
    get_comparison,
    get_comparison_record,
    list_comparisons,
)

router = APIRouter(prefix="/comparisons", tags=["comparisons"])


@router.post(
    "",
    response_model=ComparisonRecord,
    status_code=201,
    responses={200: {"model": ComparisonRecord, "description": "already stored"}},
)
def create_comparison(
    body: ComparisonCreate, response: Response, db: DbDep, _: RunnerAccess
) -> ComparisonRecord:
    """Compare head against base (medians, spread, CI + rank test, helper deltas) and store it."""
    windows = {"base_window": body.base_window, "head_window": body.head_window}
    stored = find_comparison(db, body.base_run_id, body.head_run_id, **windows)
    if stored is not None:
        response.status_code = 200
        return stored
    report = get_comparison(db, body.base_run_id, body.head_run_id, **windows)

    db.write_tx(
        lambda conn: runs.store_comparison(
            conn,
            base_run_id=body.base_run_id,
            head_run_id=body.head_run_id,
            base_window=body.base_window,
            head_window=body.head_window,
            verdict=report.verdict,
            summary=report.summary,
            report_json=report.model_dump_json(),
        )
    )
    found = find_comparison(db, body.base_run_id, body.head_run_id, **windows)
    assert found is not None  # inserted or raced in by an identical request
    return found


@router.get("", response_model=list[ComparisonSummary])
def read_comparisons(
    db: DbDep,
    _: ReadAccess,
    run_id: Annotated[
        int | None, Query(ge=1, le=MAX_ID, description="comparisons involving this run")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Offset = 0,
) -> list[ComparisonSummary]:
    """Stored comparisons, newest first."""
    found = list_comparisons(db, run_id=run_id, limit=limit, offset=offset)
    return [
        ComparisonSummary.model_validate(
            {**r, "base_window": r["base_window"] or None, "head_window": r["head_window"] or None}
        )
        for r in found
    ]


@router.get("/compute", response_model=ComparisonReport)
def compute_comparison(
    db: DbDep,
    _: ReadAccess,
    base: Annotated[int, Query(ge=1, le=MAX_ID)],
    head: Annotated[int, Query(ge=1, le=MAX_ID)],
    base_window: Annotated[str | None, Query(max_length=200)] = None,
    head_window: Annotated[str | None, Query(max_length=200)] = None,
) -> ComparisonReport:
    """Compare without storing (the stored one when it exists)."""
    return get_comparison(db, base, head, base_window=base_window, head_window=head_window)


@router.get("/{comparison_id}", response_model=ComparisonRecord)
def read_comparison(comparison_id: ComparisonId, db: DbDep, _: ReadAccess) -> ComparisonRecord:
    """A stored comparison with its report."""
    return get_comparison_record(db, comparison_id)
