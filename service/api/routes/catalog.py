"""The helper catalog the analyses attribute kernels with (data, versioned)."""

from __future__ import annotations

from functools import lru_cache

from fastapi import APIRouter

from analyzers.catalog.description import CatalogDescription, describe
from service.api.deps import ReadAccess

router = APIRouter(prefix="/catalog", tags=["catalog"])


@lru_cache(maxsize=1)
def _catalog() -> CatalogDescription:
    from analyzers.catalog import load_catalog

    return describe(load_catalog())


@router.get("", response_model=CatalogDescription)
def read_catalog(_: ReadAccess) -> CatalogDescription:
    """The built-in helper catalog: helpers, their patterns, categories and findings."""
    return _catalog()
