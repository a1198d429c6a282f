"""The helper catalog the analyses attribute kernels with (data, versioned)."""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from typing import Any

from fastapi import APIRouter

from service.api.deps import ReadAccess

router = APIRouter(prefix="/catalog", tags=["catalog"])


def _plain(value: Any) -> Any:
    """JSON-able form of whatever the catalog loader returns (dataclasses or pydantic)."""
    if hasattr(value, "model_dump"):
        return value.model_dump(mode="json")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(v) for v in value]
    if hasattr(value, "pattern") and hasattr(value, "flags"):  # compiled regex
        return value.pattern
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


@lru_cache(maxsize=1)
def _catalog() -> dict[str, Any]:
    from analyzers.catalog import load_catalog

    plain: dict[str, Any] = _plain(load_catalog())
    return plain


@router.get("", response_model=dict[str, Any])
def read_catalog(_: ReadAccess) -> dict[str, Any]:
    """The built-in helper catalog: helpers, their patterns, categories and findings."""
    return _catalog()
