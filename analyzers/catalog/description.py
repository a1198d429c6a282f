"""The catalog as readers see it: one typed shape for the API, the page's JSON twin and the CLI.

``Catalog`` holds compiled matchers (private fields) that mean nothing outside attribution;
``describe`` keeps what a person or a client reads: each helper's category, patterns, the finding
it feeds and where the entry came from, plus the host-sync patterns.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

from analyzers.catalog import Catalog


class HelperDescription(BaseModel):
    """One catalogued helper (``analyzers.catalog.Helper`` without its matchers)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    category: str
    description: str
    finding: str | None
    te_versions: list[str]
    ranges: list[str]
    python: list[str]
    kernels: list[str]
    within: list[str]
    fallback: bool
    block_from: list[str]
    block_to: list[str]
    source: str


class CatalogDescription(BaseModel):
    """``GET /api/v1/catalog``, ``/catalog.json`` and ``cptrace catalog --json``."""

    model_config = ConfigDict(extra="forbid")

    name: str
    version: str
    sources: list[str]
    helpers: list[HelperDescription]
    host_sync: dict[str, list[str]]
    """``apis``, ``ops`` and ``memcpy``: the names that count as a host synchronisation."""


def describe(catalog: Catalog) -> CatalogDescription:
    """The reader's view of ``catalog``."""
    return CatalogDescription(
        name=catalog.name,
        version=catalog.version,
        sources=list(catalog.sources),
        helpers=[
            HelperDescription(
                name=h.name,
                category=h.category.value,
                description=h.description,
                finding=h.finding,
                te_versions=list(h.te_versions),
                ranges=list(h.ranges),
                python=list(h.python),
                kernels=list(h.kernels),
                within=list(h.within),
                fallback=h.fallback,
                block_from=list(h.block_from),
                block_to=list(h.block_to),
                source=h.source,
            )
            for h in catalog.helpers
        ],
        host_sync={
            "apis": list(catalog.host_sync_apis),
            "ops": list(catalog.host_sync_ops),
            "memcpy": list(catalog.host_sync_memcpy),
        },
    )
