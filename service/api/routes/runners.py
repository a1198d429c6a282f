"""Runners: the agents that have claimed work, and when they were last seen."""

from __future__ import annotations

from fastapi import APIRouter

from service.api.deps import DbDep, ReadAccess
from service.api.schemas import Runner
from service.storage.database import rows

router = APIRouter(prefix="/runners", tags=["runners"])


@router.get("", response_model=list[Runner])
def list_runners(db: DbDep, _: ReadAccess) -> list[Runner]:
    """Registered runners, most recently seen first."""
    found = db.read(lambda c: rows(c, "SELECT * FROM runners ORDER BY last_seen DESC LIMIT 1000"))
    return [Runner.model_validate(r) for r in found]
