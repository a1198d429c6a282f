"""Runners: the agents that have claimed work, and when they were last seen."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import DbDep, ReadAccess
from service.api.schemas import Runner
from service.storage.jobs import list_runners as runner_rows

router = APIRouter(prefix="/runners", tags=["runners"])


@router.get("", response_model=list[Runner])
def list_runners(db: DbDep, _: ReadAccess) -> list[Runner]:
    """Registered runners, most recently seen first."""
    found = db.read(runner_rows)
    return [Runner.model_validate(r) for r in found]
